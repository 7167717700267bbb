#include "kda_kernel.h"

#include "linac/blocks.h"

using namespace linac::dsl;
namespace blocks = linac::blocks;
using linac::DType;

namespace {

/// What both kernels declare: the tensors, the program's (batch, head, value block) and the state.
struct Program {
  Tensor q, k, v, g, beta, h0, o, ht;
  Tile scale, b, h, v0, T, S;
};

Program start(KernelBuilder& kb, const KdaConfig& cfg) {
  const DType dt = cfg.dtype, f32 = DType::f32;
  Program p;
  p.q = kb.tensor("q", dt, 4);
  p.k = kb.tensor("k", dt, 4);
  p.v = kb.tensor("v", dt, 4);
  p.g = kb.tensor("g", f32, 4);
  p.beta = kb.tensor("beta", f32, 3);
  if (cfg.initial_state) p.h0 = kb.tensor("initial_state", f32, 4);
  p.o = kb.tensor("o", dt, 4);
  p.ht = kb.tensor("final_state", f32, 4);
  p.scale = kb.scalar("scale", f32);
  Tile i_bh = program_id(1), H = p.q.dim(2);
  p.b = i_bh / H, p.h = i_bh % H, p.T = p.q.dim(1);
  p.v0 = program_id(0) * cfg.block_v;
  p.S = cfg.initial_state ? load(p.h0, {p.b, p.h, 0, p.v0}, {kIndex, kIndex, cfg.block_k, cfg.block_v})
                          : zeros({cfg.block_k, cfg.block_v}, f32);
  return p;
}

}  // namespace

// One program per (value block, sequence x head) walks the tokens with S [BK, BV] in fp32 registers:
//   S' = diag(exp(g_t)) S;   S = S' + k_t (beta_t (v_t - S'^T k_t))^T;   o_t = scale S^T q_t
// which is the recurrence (I - beta k k^T) S' + beta k v^T. The products are sums over the key axis.
std::shared_ptr<linac::ir::Kernel> build_kda_recurrent(const KdaConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType f32 = DType::f32;
  KernelBuilder kb("kda_recurrent");
  Program p = start(kb, cfg);
  Tile S = p.S;
  for_range(0, p.T, [&](Tile t) {
    Tile qt = blocks::l2normalize(load(p.q, {p.b, t, p.h, 0}, {kIndex, kIndex, kIndex, BK}), 0, kKdaNormEps);
    Tile kt = blocks::l2normalize(load(p.k, {p.b, t, p.h, 0}, {kIndex, kIndex, kIndex, BK}), 0, kKdaNormEps);
    Tile vt = load(p.v, {p.b, t, p.h, p.v0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile gt = load(p.g, {p.b, t, p.h, 0}, {kIndex, kIndex, kIndex, BK});
    Tile beta_t = load(p.beta, {p.b, t, p.h}, {kIndex, kIndex, kIndex});
    S = S * expand_dims(exp(gt), 1);
    Tile delta = (vt - sum(expand_dims(kt, 1) * S, 0)) * beta_t;
    S = S + expand_dims(kt, 1) * expand_dims(delta, 0);
    Tile ot = sum(expand_dims(qt, 1) * S, 0) * p.scale;
    store(p.o, {p.b, t, p.h, p.v0}, {kIndex, kIndex, kIndex, BV}, ot.to(cfg.dtype));
  }, S);
  store(p.ht, {p.b, p.h, 0, p.v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

// One program per (value block, sequence x head) walks the chunks with S [BK, BV] in fp32 registers.
// In a chunk, with G = cumsum(g) from its first row (per channel), R = G_C - G (the decay from a row
// to the chunk's end, summed directly) and M the gated scores
//   M(X, Y)[r, c] = sum_d x_rd y_cd exp(G_rd - G_cd)           (blocks::gated_scores)
// the WY form of the chunk's BT rank-one updates is
//   T = (I + diag(beta) M(K, K) strictly lower)^-1             (blocks::unit_lower_inverse)
//   W = T diag(beta) (K .* exp(G)),   U = T diag(beta) V,   V_new = U - W S
//   O = scale ((Q .* exp(G)) S + M(Q, K) V_new)                (M on and below the diagonal)
//   S = diag(exp(G_C)) S + (K .* exp(R))^T V_new                   (blocks::state_update)
// Rows past the sequence end load zeros: their rows of M and V_new vanish, G stops growing. All in fp32.
std::shared_ptr<linac::ir::Kernel> build_kda_chunked(const KdaConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType f32 = DType::f32;
  KernelBuilder kb("kda_chunked");
  Program p = start(kb, cfg);
  Tile S = p.S;
  AccessOptions in_seq{.limits = {{1, p.T}}};
  for_range(0, (p.T + (BT - 1)) / BT, [&](Tile i) {
    Tile t0 = i * BT;
    Tile Q = blocks::l2normalize(load(p.q, {p.b, t0, p.h, 0}, {kIndex, BT, kIndex, BK}, in_seq), 1, kKdaNormEps);
    Tile K = blocks::l2normalize(load(p.k, {p.b, t0, p.h, 0}, {kIndex, BT, kIndex, BK}, in_seq), 1, kKdaNormEps);
    Tile V = load(p.v, {p.b, t0, p.h, p.v0}, {kIndex, BT, kIndex, BV}, in_seq).to(f32);
    Tile g = load(p.g, {p.b, t0, p.h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile beta = expand_dims(load(p.beta, {p.b, t0, p.h}, {kIndex, BT, kIndex}, in_seq), 1);
    Tile G = cumsum(g, 0), R = blocks::decays_to_chunk_end(g);
    Tile T = blocks::unit_lower_inverse(blocks::gated_scores(K, K, g, /*strictly_lower=*/true) * beta);
    Tile W = dot(T, K * exp(G) * beta), U = dot(T, V * beta);
    Tile V_new = U - dot(W, S);
    Tile O = (dot(Q * exp(G), S) + dot(blocks::gated_scores(Q, K, g), V_new)) * p.scale;
    store(p.o, {p.b, t0, p.h, p.v0}, {kIndex, BT, kIndex, BV}, O.to(cfg.dtype), in_seq);
    S = blocks::state_update(S, K * exp(R), V_new, sum(g, 0));
  }, S);
  store(p.ht, {p.b, p.h, 0, p.v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}
