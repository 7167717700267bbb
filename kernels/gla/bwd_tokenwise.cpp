#include "kernels/gla/bwd_tokenwise.h"

#include "kernels/common/prologue.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

/// Forward walk: the states, dq_t = scale S_t do_t, and c = rowsum(dfinal .* S_T) (into dg_final).
std::shared_ptr<ir::Kernel> build_gla_bwd_tokenwise_dq(const GlaBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_bwd_tokenwise_dq");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor d_o = kb.tensor("do", dt, 4);
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dq = kb.tensor("dq", dt, 4);
  Tensor dg_final = cfg.final_state_grad ? kb.tensor("dg_final", f32, 3) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 0);
  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
  for_range(seq.bos, seq.eos, [&](Tile t) {
    Tile kt = load(k, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile vt = load(v, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile dot_ = load(d_o, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile gt = load(g, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK});
    S = S * expand_dims(exp(gt), 1) + expand_dims(kt, 1) * expand_dims(vt, 0);
    Tile dqt = sum(S * expand_dims(dot_, 0), 1) * scale;
    store(dq, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, dqt.to(dt));
  }, S);
  if (cfg.final_state_grad) {
    Tile dS = load(dht, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
    store(dg_final, {i_n, i_h, 0}, {kIndex, kIndex, BK}, sum(dS * S, 1));
  }
  return kb.finish();
}

/// Reverse walk: dH (dL/dS_t) carried backwards; dk, dv, dg (dq read back) and dinitial_state.
std::shared_ptr<ir::Kernel> build_gla_bwd_tokenwise_dkv(const GlaBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_bwd_tokenwise_dkv");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor d_o = kb.tensor("do", dt, 4);
  Tensor dq = kb.tensor("dq", dt, 4);
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor dg_final = cfg.final_state_grad ? kb.tensor("dg_final", f32, 3) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dk = kb.tensor("dk", dt, 4);
  Tensor dv = kb.tensor("dv", dt, 4);
  Tensor dg = kb.tensor("dg", f32, 4);
  Tensor dh0 = cfg.initial_state_grad ? kb.tensor("dinitial_state", f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 0);
  Tile dH = zeros({BK, BV}, f32);
  Tile acc = zeros({BK}, f32);  // the suffix sum of q .* dq - k .* dk (+ the final state's term)
  if (cfg.final_state_grad) {
    dH = load(dht, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
    acc = load(dg_final, {i_n, i_h, 0}, {kIndex, kIndex, BK});
  }
  for_range(0, seq.eos - seq.bos, [&](Tile i) {
    Tile t = seq.eos - 1 - i;
    Tile qt = load(q, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile kt = load(k, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile vt = load(v, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile dot_ = load(d_o, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile dqt = load(dq, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile gt = load(g, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK});
    dH = dH + expand_dims(qt * scale, 1) * expand_dims(dot_, 0);
    Tile dkt = sum(dH * expand_dims(vt, 0), 1);
    Tile dvt = sum(dH * expand_dims(kt, 1), 0);
    store(dk, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, dkt.to(dt));
    store(dv, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}, dvt.to(dt));
    acc = acc + qt * dqt - kt * dkt;
    store(dg, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, acc);
    dH = dH * expand_dims(exp(gt), 1);
  }, dH, acc);
  if (cfg.initial_state_grad) store(dh0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV}, dH);
  return kb.finish();
}

}  // namespace linac
