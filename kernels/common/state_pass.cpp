#include "kernels/common/state_pass.h"

#include "linac/dsl.h"

namespace linac {

using namespace dsl;

std::shared_ptr<ir::Kernel> build_state_pass(const StatePassConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.name);
  kb.set_num_warps(cfg.num_warps);
  // One block per SM is all a split schedule asks (it runs where B*H is small).
  kb.set_min_ctas_per_sm(1);
  kb.set_num_stages(cfg.num_stages);
  Tensor a = kb.tensor(cfg.a, dt, 4);
  Tensor b_in = kb.tensor(cfg.b, dt, 4);
  Tensor decay = cfg.decay ? kb.tensor(cfg.decay, f32, 4) : Tensor();
  Tensor init = cfg.init ? kb.tensor(cfg.init, f32, 4) : Tensor();
  Tensor last = cfg.last ? kb.tensor(cfg.last, f32, 4) : Tensor();
  Tensor table = kb.tensor(cfg.table, dt, 5);
  Tile scale = cfg.scaled ? kb.scalar("scale", f32) : Tile();

  Tile i_v = program_id(0), i_nh = program_id(1);
  Tile H = a.dim(2), T = a.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile num_chunks = (T + (BT - 1)) / BT;
  Tile v0 = i_v * BV, k0 = program_id(2) * BK;
  AccessOptions in_seq{.limits = {{1, T}}};

  Tile X = zeros({BK, BV}, f32);
  if (init.value()) X = load(init, {b, i_h, k0, v0}, {kIndex, kIndex, BK, BV});
  for_range(0, num_chunks, [&](Tile j) {
    Tile ic = cfg.reverse ? num_chunks - 1 - j : j;
    Tile t0 = ic * BT;
    store(table, {b, ic, i_h, k0, v0}, {kIndex, kIndex, kIndex, BK, BV}, X.to(dt));
    Tile A = load(a, {b, t0, i_h, k0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile B = load(b_in, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile update = cfg.scaled ? dot(A.T(), B) * scale : dot(A.T(), B);
    if (decay.value()) {
      Tile d = load(decay, {b, ic, i_h, k0}, {kIndex, kIndex, kIndex, BK});
      X = X * expand_dims(d, 1) + update;
    } else {
      X = X + update;
    }
  }, X);
  if (last.value()) store(last, {b, i_h, k0, v0}, {kIndex, kIndex, BK, BV}, X);
  return kb.finish();
}

}  // namespace linac
