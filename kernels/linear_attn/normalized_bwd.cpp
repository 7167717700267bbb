#include "kernels/linear_attn/normalized_bwd.h"

#include "kernels/linear_attn/normalized.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

// dN = do / (D + eps), dD = -rowsum(do .* o) / (D + eps), per token (normalized_bwd.h).
std::shared_ptr<ir::Kernel> build_linear_attn_normalized_bwd_prep(DType dt, int64_t block_v) {
  const DType f32 = DType::f32;
  constexpr int64_t kRows = kNormalizedBwdPrepRows;
  KernelBuilder kb("linear_attn_normalized_bwd_prep");
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor d_o = kb.tensor("do", dt, 4);
  Tensor num = kb.tensor("num", dt, 4);
  Tensor den = kb.tensor("den", dt, 4);
  Tensor dnum = kb.tensor("dnum", dt, 4);
  Tensor dden = kb.tensor("dden", dt, 4);
  Tile i_t = program_id(0), i_bh = program_id(1);
  Tile H = d_o.dim(2);
  Tile b = i_bh / H, h = i_bh % H, t0 = i_t * kRows;
  // The three blocks loaded before any is used, so that no load waits for another's data.
  Tile DO_raw = load(d_o, {b, t0, h, 0}, {kIndex, kRows, kIndex, block_v});
  Tile N_raw = load(num, {b, t0, h, 0}, {kIndex, kRows, kIndex, block_v});
  Tile D_raw = load(den, {b, t0, h, 0}, {kIndex, kRows, kIndex, kIndex});
  Tile DO = DO_raw.to(f32), N = N_raw.to(f32);
  Tile inv = 1.0f / (D_raw.to(f32) + kNormalizedLinearAttnEps);
  Tile inv2 = expand_dims(inv, 1);
  store(dnum, {b, t0, h, 0}, {kIndex, kRows, kIndex, block_v}, (DO * inv2).to(dt));
  Tile dD = -(sum(DO * (N * inv2), 1) * inv);
  store(dden, {b, t0, h, 0}, {kIndex, kRows, kIndex, kIndex}, dD.to(dt));
  return kb.finish();
}

}  // namespace linac
