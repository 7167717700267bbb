#include "kernels/common/log_decay.h"

namespace linac {

using namespace dsl;

Tile floor_log_decay(const Tile& g) {
  return where(g < kLogDecayFloor, kLogDecayFloor, g);
}

Tile ChunkLogDecays::between(const Tile& pairs, bool reverse) const {
  Tile br = expand_dims(b, 1), bc = expand_dims(b, 0);
  Tile decays = exp(where(pairs, reverse ? bc - br : br - bc, 0.0f));
  return where(pairs & (expand_dims(cuts, 1) != expand_dims(cuts, 0)), 0.0f, decays);
}

Tile ChunkLogDecays::to_end() const {
  return where(cuts != cut_total, 0.0f, exp(span_total - b));
}

Tile ChunkLogDecays::from_start() const {
  return where(cuts > 0.0f, 0.0f, exp(b));
}

ChunkLogDecays chunk_log_decays(const Tile& g) {
  ChunkLogDecays d;
  // NaN compares false: it stays in b and reaches every output after it, as the recurrence's would.
  Tile apart = g < kLogDecayFloor;
  Tile kept = where(apart, 0.0f, g);
  Tile counted = where(apart, 1.0f, zeros(g.shape(), DType::f32));
  d.b = cumsum(kept, 0);
  d.cuts = cumsum(counted, 0);
  // The totals are the sums' last rows, not sums of their own: b_C - b_r must be the same rounded sums
  // (0 at the last row). Summed in another order (a tree of shuffles on the GPU) the strong gates'
  // final_state drifted 2.3e-5 relative (gates near -6, b near -190 over 32 rows; H200).
  const int64_t last = g.shape()[0] - 1;
  d.span_total = take(d.b, last, 0);
  d.cut_total = take(d.cuts, last, 0);
  d.total = where(d.cut_total > 0.0f, kLogDecayFloor, d.span_total);
  return d;
}

}  // namespace linac
