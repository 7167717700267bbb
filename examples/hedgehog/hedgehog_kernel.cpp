#include "hedgehog_kernel.h"

using namespace linac::dsl;
using linac::DType;

namespace {

/// Softmax over the features (axis 1) of a [rows, F] f32 tile, stabilized by the row maximum.
Tile softmax_rows(const Tile& x) {
  Tile e = exp(x - expand_dims(max(x, 1), 1));
  return e / expand_dims(sum(e, 1), 1);
}

}  // namespace

// One program per (value block, sequence x head) walks its sequence chunk by chunk. phi is never
// concatenated: its halves P = softmax(XW) and N = softmax(-XW) each get their half of the state,
// phi(x) S = P S_pos + N S_neg and phi(x) . z = P . z_pos + N . z_neg. Per chunk, with M the causal mask:
//   A = (Pq Pk^T + Nq Nk^T) .* M
//   O = (Pq S_pos + Nq S_neg + A V) / (Pq z_pos + Nq z_neg + rowsum(A))
//   S_pos += Pk^T V,  S_neg += Nk^T V,  z_pos += colsum(Pk),  z_neg += colsum(Nk)
std::shared_ptr<linac::ir::Kernel> build_hedgehog(const HedgehogConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v, F = cfg.features;
  const DType dt = cfg.dtype;
  KernelBuilder kb("hedgehog_fwd");
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor w = kb.tensor("w", dt, 3);
  Tensor o = kb.tensor("o", dt, 4);

  Tile i_v = program_id(0), i_bh = program_id(1);
  Tile H = q.dim(2), T = q.dim(1);
  Tile i_b = i_bh / H, i_h = i_bh % H;
  Tile v0 = i_v * BV;
  Tile num_chunks = (T + (BT - 1)) / BT;

  Tile W = load(w, {i_h, 0, 0}, {kIndex, BK, F});  // [BK, F]; rows past K read 0, like X's columns
  Tile r = expand_dims(iota(BT), 1), c = expand_dims(iota(BT), 0);
  Tile causal = r >= c;

  Tile S_pos = zeros({F, BV}, DType::f32), S_neg = zeros({F, BV}, DType::f32);
  Tile z_pos = zeros({F}, DType::f32), z_neg = zeros({F}, DType::f32);
  for_range(0, num_chunks, [&](Tile i) {
    Tile t0 = i * BT;
    Tile Q = load(q, {i_b, t0, i_h, 0}, {kIndex, BT, kIndex, BK});
    Tile K = load(k, {i_b, t0, i_h, 0}, {kIndex, BT, kIndex, BK});
    Tile V = load(v, {i_b, t0, i_h, v0}, {kIndex, BT, kIndex, BV});
    Tile QW = dot(Q, W), KW = dot(K, W);  // [BT, F] f32
    Tile Pq = softmax_rows(QW), Nq = softmax_rows(-QW);
    // Rows past the sequence end load k = 0, but phi(0) is uniform, not 0: mask them out of the state.
    Tile in_seq = t0 + r < T;
    Tile Pk = where(in_seq, softmax_rows(KW), 0.0f), Nk = where(in_seq, softmax_rows(-KW), 0.0f);
    Tile Pq_t = Pq.to(dt), Nq_t = Nq.to(dt), Pk_t = Pk.to(dt), Nk_t = Nk.to(dt);

    Tile A = where(causal, dot(Pq_t, Pk_t.T()) + dot(Nq_t, Nk_t.T()), 0.0f);
    Tile num = dot(Pq_t, S_pos.to(dt)) + dot(Nq_t, S_neg.to(dt)) + dot(A.to(dt), V);
    Tile den = sum(Pq * expand_dims(z_pos, 0), 1) + sum(Nq * expand_dims(z_neg, 0), 1) + sum(A, 1);
    store(o, {i_b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, (num / expand_dims(den, 1)).to(dt));

    S_pos = S_pos + dot(Pk_t.T(), V);
    S_neg = S_neg + dot(Nk_t.T(), V);
    z_pos = z_pos + sum(Pk, 0);
    z_neg = z_neg + sum(Nk, 0);
  }, S_pos, S_neg, z_pos, z_neg);
  return kb.finish();
}
