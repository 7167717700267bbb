#include "kernels/delta_rule/bwd_tokenwise.h"

#include "kernels/common/prologue.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {

constexpr int64_t kBlock = kDeltaBwdCheckpointTokens;

/// Warps per program: the counts at which ptxas keeps each kernel's two or three [K, V] fp32 tiles
/// without spills at K = V = 64 (test_ptxas): 8 spill the forward walk and the gated reverse walk,
/// 4 the plain reverse walk.
int bwd_warps(const DeltaBwdConfig& cfg, bool forward) { return forward || cfg.gated ? 4 : 8; }

/// The loads of token t (zeros past the sequence end, where the update is the identity: beta = 0, g = 0).
struct Token {
  Tile q, k, v, d_o, beta, a;
};

struct DeltaTensors {
  Tensor q, k, v, beta, g, d_o;
};

Token load_token(const DeltaBwdConfig& cfg, const DeltaTensors& x, const SequenceBounds& seq, const Tile& i_h,
                 const Tile& t) {
  const DType f32 = DType::f32;
  AccessOptions in_seq{.limits = {{1, seq.eos}}};
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  Token tok;
  tok.q = load(x.q, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, in_seq).to(f32);
  tok.k = load(x.k, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, in_seq).to(f32);
  tok.v = load(x.v, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}, in_seq).to(f32);
  tok.d_o = load(x.d_o, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}, in_seq).to(f32);
  tok.beta = load(x.beta, {seq.b, t, i_h}, {kIndex, kIndex, kIndex}, in_seq);
  tok.a = cfg.gated ? exp(load(x.g, {seq.b, t, i_h}, {kIndex, kIndex, kIndex}, in_seq)) : constant(1.0, f32);
  return tok;
}

/// S_t from S_{t-1}.
Tile step(const Token& tok, const Tile& S) {
  Tile w = sum(S * expand_dims(tok.k, 1), 0);
  Tile u = tok.v - w * tok.a;
  return S * tok.a + expand_dims(tok.k * tok.beta, 1) * expand_dims(u, 0);
}

DeltaTensors declare_inputs(KernelBuilder& kb, const DeltaBwdConfig& cfg) {
  DeltaTensors x;
  x.q = kb.tensor("q", cfg.dtype, 4);
  x.k = kb.tensor("k", cfg.dtype, 4);
  x.v = kb.tensor("v", cfg.dtype, 4);
  x.beta = kb.tensor("beta", DType::f32, 3);
  if (cfg.gated) x.g = kb.tensor("g", DType::f32, 3);
  x.d_o = kb.tensor("do", cfg.dtype, 4);
  return x;
}

}  // namespace

std::shared_ptr<ir::Kernel> build_delta_bwd_forward(const DeltaBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_bwd_fwd" : "delta_rule_bwd_fwd");
  kb.set_num_warps(bwd_warps(cfg, true));
  kb.set_num_stages(1);
  DeltaTensors x = declare_inputs(kb, cfg);
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor ckpt = kb.tensor("checkpoints", f32, 5);
  Tensor dq = kb.tensor("dq", cfg.dtype, 4);
  Tile scale = kb.scalar("scale", f32);

  const auto [i_nh, i_n, i_h, seq] = sequence_program(x.q, cu, cfg.varlen, 0);
  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
  Tile blocks = (seq.eos - seq.bos + (kBlock - 1)) / kBlock;
  for_range(0, blocks, [&](Tile c) {
    store(ckpt, {i_n, i_h, c, 0, 0}, {kIndex, kIndex, kIndex, BK, BV}, S);
    for_range(0, kBlock, [&](Tile j) {
      Tile t = seq.bos + c * kBlock + j;
      Token tok = load_token(cfg, x, seq, i_h, t);
      S = step(tok, S);
      store(dq, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, (sum(S * expand_dims(tok.d_o, 0), 1) * scale).to(cfg.dtype),
            AccessOptions{.limits = {{1, seq.eos}}});
    }, S);
  }, S);
  return kb.finish();
}

/// Reverse walk over the blocks: recompute the block's states into scratch, then walk it backwards.
std::shared_ptr<ir::Kernel> build_delta_bwd_reverse(const DeltaBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_bwd_rev" : "delta_rule_bwd_rev");
  kb.set_num_warps(bwd_warps(cfg, false));
  kb.set_num_stages(1);
  DeltaTensors x = declare_inputs(kb, cfg);
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor ckpt = kb.tensor("checkpoints", f32, 5);
  Tensor scratch = kb.tensor("scratch", f32, 4);
  Tensor dk = kb.tensor("dk", dt, 4);
  Tensor dv = kb.tensor("dv", dt, 4);
  Tensor dbeta = kb.tensor("dbeta", f32, 3);
  Tensor dg = cfg.gated ? kb.tensor("dg", f32, 3) : Tensor();
  Tensor dh0 = cfg.initial_state_grad ? kb.tensor("dinitial_state", f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  const auto [i_nh, i_n, i_h, seq] = sequence_program(x.q, cu, cfg.varlen, 0);
  AccessOptions in_seq{.limits = {{1, seq.eos}}};
  Tile dS = zeros({BK, BV}, f32);
  if (cfg.final_state_grad) dS = load(dht, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
  Tile blocks = (seq.eos - seq.bos + (kBlock - 1)) / kBlock;
  for_range(0, blocks, [&](Tile cr) {
    Tile c = blocks - 1 - cr;
    Tile S = load(ckpt, {i_n, i_h, c, 0, 0}, {kIndex, kIndex, kIndex, BK, BV});
    for_range(0, kBlock, [&](Tile j) {
      store(scratch, {i_nh, j, 0, 0}, {kIndex, kIndex, BK, BV}, S);  // S_{t-1} of token j
      S = step(load_token(cfg, x, seq, i_h, seq.bos + c * kBlock + j), S);
    }, S);
    for_range(0, kBlock, [&](Tile jr) {
      Tile j = kBlock - 1 - jr;
      Tile t = seq.bos + c * kBlock + j;
      Token tok = load_token(cfg, x, seq, i_h, t);
      Tile Sp = load(scratch, {i_nh, j, 0, 0}, {kIndex, kIndex, BK, BV});
      dS = dS + expand_dims(tok.q * scale, 1) * expand_dims(tok.d_o, 0);
      Tile w = sum(Sp * expand_dims(tok.k, 1), 0);
      Tile u = tok.v - w * tok.a;
      Tile xk = sum(dS * expand_dims(tok.k, 1), 0);  // dS^T k
      Tile du = xk * tok.beta;
      Tile dkt = sum(dS * expand_dims(u, 0), 1) * tok.beta - sum(Sp * expand_dims(du, 0), 1) * tok.a;
      store(dk, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, dkt.to(dt), in_seq);
      store(dv, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}, du.to(dt), in_seq);
      store(dbeta, {seq.b, t, i_h}, {kIndex, kIndex, kIndex}, sum(xk * u, 0), in_seq);
      if (cfg.gated) {
        Tile da = sum(sum(dS * Sp, 1), 0) - sum(xk * w, 0) * tok.beta;
        store(dg, {seq.b, t, i_h}, {kIndex, kIndex, kIndex}, da * tok.a, in_seq);
      }
      dS = (dS - expand_dims(tok.k, 1) * expand_dims(du, 0)) * tok.a;
    }, dS);
  }, dS);
  if (cfg.initial_state_grad) store(dh0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV}, dS);
  return kb.finish();
}

}  // namespace linac
