#include "kernels/poly/features.h"

namespace linac {

using namespace dsl;

Tile roll_matrix(int64_t BK, const Tile& K, const Tile& m, DType dt) {
  // Column j reads row (j + m) mod K.
  Tile source = expand_dims(iota(BK), 0) + m;
  source = where(source < K, source, source - K);
  Tile hit = (expand_dims(iota(BK), 1) == source) & (expand_dims(iota(BK), 0) < K);
  return where(hit, full({BK, BK}, 1.0, dt), 0.0f);
}

Tile roll_by_one(const PolyConfig& cfg, const Tile& X, const Tile& roll, bool right) {
  const int64_t BK = cfg.block_k;
  if (cfg.exact_k) return slice(concat({X, X}, 1), 1, right ? BK - 1 : 1, BK);
  return dot(X, roll).to(cfg.dtype);
}

Tile degree2_weight(const Tile& m, const Tile& K) {
  return where((m == 0) | (2 * m == K), constant(1, DType::f32), 2.0f);
}

Tile has_segments(const PolyConfig& cfg, const Tile& t0, const Tile& bos, const Tile& eos, bool after) {
  return after ? t0 + int64_t{cfg.chunk} * cfg.segment_chunks < eos : t0 > bos;
}

Tile first_segment(const PolyConfig& cfg, const Tensor& x, const Tensor& segment_offsets, const Tile& i_n) {
  if (cfg.varlen) return load(segment_offsets, {i_n}, {kIndex});
  const int64_t L = int64_t{cfg.chunk} * cfg.segment_chunks;
  return i_n * ((x.dim(1) + (L - 1)) / L);
}

ZTables load_z_tables(const PolyConfig& cfg, const Tensor& t, const Tile& row, const Tile& h) {
  const int64_t BK = cfg.block_k, low = poly_z_rows(cfg) - 2;
  ZTables z;
  if (cfg.quadratic) z.quadratic = load(t, {row, h, 0, 0}, {kIndex, kIndex, BK, BK});
  z.low = load(t, {row, h, low, 0}, {kIndex, kIndex, 2, BK});
  return z;
}

Tile times_quadratic_form(const Tile& X, const Tile& Z) { return dot(X.to(DType::f32), Z); }

Tile rolled_rows(const Tensor& t, const Tile& row, const Tile& h, const Tile& m, const Tile& K, int64_t BK,
                 int64_t cols) {
  AccessOptions within_k{.limits = {{3, K}}};
  if (cols == 0)  // a [.., BK] table
    return load(t, {row, h, m, 0 - m}, {kIndex, kIndex, kIndex, BK}, within_k) +
           load(t, {row, h, m, K - m}, {kIndex, kIndex, kIndex, BK}, within_k);
  return load(t, {row, h, m, 0 - m, 0}, {kIndex, kIndex, kIndex, BK, cols}, within_k) +
         load(t, {row, h, m, K - m, 0}, {kIndex, kIndex, kIndex, BK, cols}, within_k);
}

}  // namespace linac
