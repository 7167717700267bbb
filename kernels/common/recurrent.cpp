#include "kernels/common/recurrent.h"

#include "kernels/common/prologue.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

std::shared_ptr<ir::Kernel> build_recurrent_fwd(const RecurrentConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gate == RecurrentGate::channel ? "gla_recurrent" : "linear_attn_recurrent");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);  // one-row loads: nothing for cp.async to overlap
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g;
  if (cfg.gate == RecurrentGate::scalar) g = kb.tensor("g", f32, 3);
  if (cfg.gate == RecurrentGate::channel) g = kb.tensor("g", f32, 4);
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor ht = cfg.final_state ? kb.tensor("final_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, cu, cfg.varlen, 1);
  const auto [b, bos, eos] = seq_rows;
  Tile v0 = i_v * BV;

  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});

  // Every t in [bos, eos) is in the sequence: only the head dims need masking (by the tensor sizes).
  for_range(bos, eos, [&](Tile t) {
    Tile qt = load(q, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile kt = load(k, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile vt = load(v, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    if (cfg.gate == RecurrentGate::scalar) {
      S = S * exp(load(g, {b, t, i_h}, {kIndex, kIndex, kIndex}));
    } else if (cfg.gate == RecurrentGate::channel) {
      // g <= 0, and channels past K load 0 (their rows of S stay 0 either way).
      S = S * expand_dims(exp(load(g, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK})), 1);
    }
    S = S + expand_dims(kt, 1) * expand_dims(vt, 0);
    Tile ot = sum(expand_dims(qt, 1) * S, 0) * scale;
    store(o, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}, ot.to(dt));
  }, S);

  if (cfg.final_state) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

}  // namespace linac
