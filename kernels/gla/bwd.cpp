#include "kernels/gla/bwd.h"

#include "kernels/common/log_decay.h"
#include "kernels/common/prologue.h"
#include "kernels/gla/fwd.h"
#include "linac/blocks.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

// GLA backward in chunks of BT rows (16, 32 or 64), with per-channel log-gates g. Per chunk:
// L = cumsum(g) from its first row (inclusive), tot = L's last row, R_r = g_{r+1} + ... + g_{BT-1} (the
// decay from row r to the chunk's end, summed directly, not as tot - L: see build_gla_fwd),
// A[r, c] = scale sum_d q_rd k_cd exp(L_rd - L_cd) (r >= c), S the state before the chunk, S' after:
//   O = scale (Q .* exp(L)) S + A V,    S' = diag(exp(tot)) S + (K .* exp(R))^T V
// Reverse mode, with dS' = dL/dS' (dfinal_state after the last chunk) and dA = scale (dO V^T) .* M:
//   dQ = scale (dO S^T) .* exp(L) + dQi,   dQi[r, d] = sum_{c <= r} dA[r, c] k_cd exp(L_rd - L_cd)
//   dK = (V dS'^T) .* exp(R) + dKi,        dKi[c, d] = sum_{r >= c} dA[r, c] q_rd exp(L_rd - L_cd)
//   dV = (K .* exp(R)) dS' + A^T dO
//   dS = diag(exp(tot)) dS' + scale (Q .* exp(L))^T dO
//   dg_t = sum_{s >= t} (q_s .* dq_s - k_s .* dk_s) + rowsum(dfinal_state .* S_T)   (per channel)
// Kernels: gla_bwd_intra (every chunk in parallel: dQi, dKi and A^T dO; its 16x16 diagonal blocks at
// fp32 accuracy by blocks::gated_scores_diagonal_grads, factored (three tf32 products for 16-bit inputs)
// or elementwise as gla_chunk chooses for A; the blocks below them as products of decayed 16-row tiles, every
// exp(L_r - L_c) split at a 16-row boundary into two sums of gates), then walks shaped like the
// forward — dq forward in time over X = S^T [V, K] (key columns split in blocks), dk backward over
// X = dS^T [V, K], dv backward over X = dS [K, V] (value columns split), or where one program holds
// the whole state, dk and dv in one backward walk over X = dS (gla_bwd_dkdv: dS is built once) — and
// dg's suffix sums of q.dq - k.dk: in gla_bwd_dkdv, a reverse walk already, where it still fits with
// them (dg_in_walk), else in gla_bwd_dg, a reverse walk of its own. No state is stored: memory O(T*D).

namespace {

constexpr int64_t kSub = 16;  // rows of the diagonal blocks computed elementwise

/// L, tot and R of the chunk of BT rows at t0.. (f32 [BT, BK], [BK], [BT, BK]), each a sum of gates
/// over the rows it spans (no differences of cumulative sums).
struct ChunkGates {
  Tile L, tot, R;
};

ChunkGates chunk_gates(const Tensor& g, const Tile& b, const Tile& t0, const Tile& i_h, const Tile& k0, int64_t BT,
                       int64_t BK, const Tile& eos) {
  AccessOptions in_seq{.limits = {{1, eos}}};
  Tile gc = load(g, {b, t0, i_h, k0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile next = load(g, {b, t0 + 1, i_h, k0}, {kIndex, BT, kIndex, BK}, in_seq);  // the gates one row ahead
  ChunkGates r;
  r.L = cumsum(gc, 0);
  r.tot = sum(gc, 0);
  r.R = blocks::decays_to_chunk_end_from_next(next);
  return r;
}

}  // namespace

std::shared_ptr<ir::Kernel> build_gla_bwd_intra(const GlaChunkedBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v, BT = cfg.chunk;
  const int NC = static_cast<int>(BT / kSub);
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_bwd_intra");
  kb.set_num_warps(cfg.intra_warps);
  // All registers: ptxas, keeping room for more blocks per SM, capped it at 128 and it spilled (fp32 at
  // head dim 64: 4 bytes; at 8 warps 140 bytes in bf16 at 128).
  kb.set_min_ctas_per_sm(1);
  kb.set_num_stages(1);
  // The diagonal blocks' fp32 products as gla_chunk computes A's (three tf32 products for 16-bit inputs).
  kb.set_tensor_core_f32(dt != f32);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dq_intra = kb.tensor("dq_intra", f32, 4);
  Tensor dk_intra = kb.tensor("dk_intra", f32, 4);
  Tensor dv_intra = kb.tensor("dv_intra", f32, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_s = program_id(0);
  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 1);
  Tile b = seq.b;
  Tile t0 = seq.bos + i_s * BT;  // at or past eos for the chunks of the longest sequence only
  AccessOptions in_seq{.limits = {{1, seq.eos}}};
  Tile rows = expand_dims(iota(kSub), 1), cols = expand_dims(iota(kSub), 0);

  // Per 16-row sub-chunk i: its rows and, only where a block below the diagonal uses them (the IR
  // keeps what is recorded, used or not: at chunk 16 none is), Qd_i = Q_i .* exp(g_{first+1} + ... +
  // g_r) and g0_i (first row) for i > 0, Rs_i = g_{c+1} + ... + g_{last} (to its end) for i < NC - 1,
  // tot_i for the sub-chunks in between.
  std::vector<Tile> Qf(NC), Kf(NC), V(NC), dO(NC), Qexp(NC), Qd(NC), Rs(NC), tot(NC), g0(NC);
  std::vector<Tile> dQi(NC), dKi(NC), dVi(NC);
  // q, k and the gates prefetched (AccessOptions) and converted after all five loads are issued:
  // converted or floored at load, they were register loads, each waited for before the next was issued.
  const AccessOptions prefetched = in_seq.prefetched();
  for (int i = 0; i < NC; ++i) {
    Tile ti = t0 + i * kSub;
    Tile Qi = load(q, {b, ti, i_h, 0}, {kIndex, kSub, kIndex, BK}, prefetched);
    Tile Ki = load(k, {b, ti, i_h, 0}, {kIndex, kSub, kIndex, BK}, prefetched);
    Tile gi = load(g, {b, ti, i_h, 0}, {kIndex, kSub, kIndex, BK}, prefetched);
    // The gates one row ahead (for Rs), where a sub-chunk follows.
    Tile g_next = i < NC - 1 ? load(g, {b, ti + 1, i_h, 0}, {kIndex, kSub, kIndex, BK}, prefetched) : Tile();
    V[i] = load(v, {b, ti, i_h, 0}, {kIndex, kSub, kIndex, BV}, in_seq);
    dO[i] = load(dout, {b, ti, i_h, 0}, {kIndex, kSub, kIndex, BV}, in_seq);
    Qf[i] = Qi.to(f32);
    Kf[i] = Ki.to(f32);
    // The sub-chunk's gates, floored for the factored form (kernels/common/log_decay.h): its spread
    // L_hi - L_lo and exp(L - m) are NaN for -inf gates. Every other decay here is a sum of gates.
    Tile G = floor_log_decay(gi);
    if (i > 0) {
      if (i < NC - 1) tot[i] = sum(G, 0);
      g0[i] = take(gi, 0, 0);  // from gi's shared-memory copy
      Qexp[i] = exp(blocks::decays_from_first_row(G));  // exp(g_{first+1} + ... + g_r)
      Qd[i] = Qf[i] * Qexp[i];
    }
    if (i < NC - 1) Rs[i] = blocks::decays_to_chunk_end_from_next(g_next);  // g_{c+1} + ... + g_{last}

    // The diagonal block in fp32, blocks::gated_scores_diagonal_grads: A, dQi and dKi from the masked
    // dA, factored where the sub-chunk's gates spread at most kGlaFactorSpread (as gla_chunk chooses),
    // elementwise otherwise, in two walks over its 16 rows whose exponents are sums of the gates (the
    // difference of two cumulative sums loses the small gates after a very negative one: -1e4 gates
    // inside the chunk gave 6e-4 relative error in dq). The walks read the rows of q, k and g from
    // memory one step ahead, and the entries of dA with take (--config take=0 picks them by masked row
    // sums of dA and of dA^T, its own product here, instead: slower, docs/ops/gla.md, "Measured").
    Tile dA = where(rows >= cols, dot(dO[i], V[i].T()) * scale, 0.0f);
    Tile dAt = cfg.take ? Tile() : where(rows <= cols, dot(V[i], dO[i].T()) * scale, 0.0f);  // dA^T
    auto row_of = [&](const Tensor& t, const Operand& r) {
      return load(t, {b, ti + r, i_h, 0}, {kIndex, kIndex, kIndex, BK}, in_seq);
    };
    blocks::ScoreRows score_rows{[&](const Operand& r) { return row_of(k, r); },
                                 [&](const Operand& r) { return row_of(g, r); },
                                 [&](const Operand& r) { return row_of(q, r); }};
    const blocks::GatedScoresGrads d =
        blocks::gated_scores_diagonal_grads(Qf[i], Kf[i], cumsum(G, 0), dA, score_rows, false, dAt);
    dQi[i] = d.dX;
    dKi[i] = d.dY;
    dVi[i] = dot((d.A * scale).T().to(dt), dO[i]);
  }

  // Blocks below the diagonal (sub-chunk i after j): exp(L_r - L_c) = exp(Qd exponent of r in i) *
  // exp(decay of c from its row to the first row of i), the latter Rs_j + tot_{j+1} + ... + tot_{i-1}
  // + g0_i: every exponent a sum of gates (<= 0), none a difference.
  for (int i = 1; i < NC; ++i) {
    Tile decay = g0[i];  // from the end of sub-chunk j to the first row of sub-chunk i
    for (int j = i - 1; j >= 0; --j) {
      Tile Kn = Kf[j] * exp(Rs[j] + expand_dims(decay, 0));  // k_c .* exp(decay from c to i's first row)
      Tile dA = dot(dO[i], V[j].T()) * scale;                 // every r in i is after every c in j
      dQi[i] = dQi[i] + dot(dA.to(dt), Kn.to(dt)) * Qexp[i];
      dKi[j] = dKi[j] + dot(dA.T().to(dt), Qd[i].to(dt)) * exp(Rs[j] + expand_dims(decay, 0));
      Tile Aij = dot(Qd[i].to(dt), Kn.to(dt).T()) * scale;
      dVi[j] = dVi[j] + dot(Aij.T().to(dt), dO[i]);
      if (j > 0) decay = decay + tot[j];
    }
  }
  for (int i = 0; i < NC; ++i) {
    Tile ti = t0 + i * kSub;
    store(dq_intra, {b, ti, i_h, 0}, {kIndex, kSub, kIndex, BK}, dQi[i], in_seq);
    store(dk_intra, {b, ti, i_h, 0}, {kIndex, kSub, kIndex, BK}, dKi[i], in_seq);
    store(dv_intra, {b, ti, i_h, 0}, {kIndex, kSub, kIndex, BV}, dVi[i], in_seq);
  }
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_gla_bwd_walk(const GlaChunkedBwdConfig& cfg, GlaBwdWalk which) {
  const DType dt = cfg.dtype, f32 = DType::f32;
  const int64_t BT = cfg.chunk;
  const bool is_dq = which == GlaBwdWalk::dq, is_dk = which == GlaBwdWalk::dk, is_dv = which == GlaBwdWalk::dv;
  const bool is_dkdv = which == GlaBwdWalk::dkdv;
  if (is_dkdv && (cfg.split_k != cfg.block_k || cfg.split_v != cfg.block_v))
    throw InternalError("gla_bwd_dkdv walks the whole state: it needs whole key and value blocks");
  const bool reverse = !is_dq;
  const bool writes_dk = is_dk || is_dkdv, writes_dv = is_dv || is_dkdv;
  // X is [V, BC] over key columns (dq: S^T, dk: dS^T) or [K, BC] over value columns (dv and dkdv: dS).
  const bool value_columns = is_dv || is_dkdv;
  const int64_t W = value_columns ? cfg.block_k : cfg.block_v;
  const int64_t BC = value_columns ? cfg.split_v : cfg.split_k;
  KernelBuilder kb(is_dq ? "gla_bwd_dq" : is_dk ? "gla_bwd_dk" : is_dv ? "gla_bwd_dv" : "gla_bwd_dkdv");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.walk_stages);
  kb.set_producer_warps(cfg.walk_producer_warps);
  kb.set_min_ctas_per_sm(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor h0 = is_dq && cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dq_in = is_dq ? kb.tensor("dq_intra", f32, 4) : Tensor();
  Tensor dk_in = writes_dk ? kb.tensor("dk_intra", f32, 4) : Tensor();
  Tensor dv_in = writes_dv ? kb.tensor("dv_intra", f32, 4) : Tensor();
  Tensor dq_out = is_dq ? kb.tensor("dq", dt, 4) : Tensor();
  Tensor dk_out = writes_dk ? kb.tensor("dk", dt, 4) : Tensor();
  Tensor dv_out = writes_dv ? kb.tensor("dv", dt, 4) : Tensor();
  // q .* dq and k .* dk in fp32, dg's terms: the dq walk writes the first; the fused dkdv walk with
  // dg_in_walk reads it and forms dg itself (its walk is dg's reverse order), else the walk writing dk
  // writes the second and gla_bwd_dg forms dg from both.
  const bool dg_here = is_dkdv && cfg.dg_in_walk;
  Tensor part = is_dq ? kb.tensor("qdq", f32, 4) : writes_dk && !dg_here ? kb.tensor("kdk", f32, 4) : Tensor();
  Tensor qdq_in = dg_here ? kb.tensor("qdq", f32, 4) : Tensor();
  // dg's share of the final state: the dq walk writes it, the walk forming dg starts its sums there.
  Tensor dg_s = (is_dq || dg_here) && cfg.final_state_grad ? kb.tensor("dg_state", f32, 3) : Tensor();
  Tensor dg_out = dg_here ? kb.tensor("dg", f32, 4) : Tensor();
  Tensor dh0 = value_columns && cfg.initial_state_grad ? kb.tensor("dinitial_state", f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  Tile i_c = program_id(0);
  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 1);
  const Tile b = seq.b;
  Tile num_chunks = (seq.eos - seq.bos + (BT - 1)) / BT;
  Tile c0 = i_c * BC;
  Tile k0 = value_columns ? constant(0, DType::i32) : c0;  // the key columns this program's gates cover
  const int64_t GK = value_columns ? cfg.block_k : BC;
  AccessOptions in_seq{.limits = {{1, seq.eos}}};
  const AccessOptions transposed{.limits = {}, .transpose = true};

  Tile X = zeros({W, BC}, f32);
  // Forming dg: its sum over the chunks after this one, dg_t = sum_{s >= t} (q_s .* dq_s - k_s .* dk_s).
  Tile dg_after = dg_here ? zeros({W}, f32) : Tile();
  if (dg_here && dg_s.value()) dg_after = load(dg_s, {i_n, i_h, 0}, {kIndex, kIndex, W});
  if (h0.value()) X = load(h0, {i_n, i_h, c0, 0}, {kIndex, kIndex, BC, W}, transposed);
  if (!is_dq && dht.value())
    X = value_columns ? load(dht, {i_n, i_h, 0, c0}, {kIndex, kIndex, W, BC})
                      : load(dht, {i_n, i_h, c0, 0}, {kIndex, kIndex, BC, W}, transposed);

  auto rows_of = [&](const Tensor& t, const Tile& t0, const Operand& col0, int64_t width) {
    return load(t, {b, t0, i_h, col0}, {kIndex, BT, kIndex, width}, in_seq);
  };
  auto store_rows = [&](const Tensor& t, const Tile& t0, const Operand& col0, int64_t width, const Tile& x) {
    store(t, {b, t0, i_h, col0}, {kIndex, BT, kIndex, width}, x, in_seq);
  };
  std::vector<Tile*> carried = {&X};
  if (dg_here) carried.push_back(&dg_after);
  for_range_carrying(0, num_chunks, [&](Tile j) {
    Tile i = reverse ? num_chunks - 1 - j : j;
    Tile t0 = seq.bos + i * BT;
    ChunkGates gt = chunk_gates(g, b, t0, i_h, k0, BT, GK, seq.eos);
    Tile eL = exp(gt.L), eR = exp(gt.R), etot = exp(gt.tot);
    if (is_dq) {
      Tile dO = rows_of(dout, t0, 0, W), V = rows_of(v, t0, 0, W);
      Tile Kc = rows_of(k, t0, c0, BC), Qc = rows_of(q, t0, c0, BC);
      Tile dQ = dot(dO, X.to(dt)) * eL * scale + rows_of(dq_in, t0, c0, BC);
      store_rows(dq_out, t0, c0, BC, dQ.to(dt));
      store_rows(part, t0, c0, BC, Qc.to(f32) * dQ);
      X = X * expand_dims(etot, 0) + dot(V.T(), (Kc.to(f32) * eR).to(dt));
    } else if (is_dk) {
      Tile V = rows_of(v, t0, 0, W), dO = rows_of(dout, t0, 0, W);
      Tile Qc = rows_of(q, t0, c0, BC), Kc = rows_of(k, t0, c0, BC);
      Tile dK = dot(V, X.to(dt)) * eR + rows_of(dk_in, t0, c0, BC);
      store_rows(dk_out, t0, c0, BC, dK.to(dt));
      store_rows(part, t0, c0, BC, Kc.to(f32) * dK);
      X = X * expand_dims(etot, 0) + dot(dO.T(), (Qc.to(f32) * eL).to(dt)) * scale;
    } else {
      // dv, or dkdv: X = dS [K, V] whole, and dK = (V dS'^T) .* exp(R) comes from the same X.
      Tile K = rows_of(k, t0, 0, W), Q = rows_of(q, t0, 0, W), dOc = rows_of(dout, t0, c0, BC);
      Tile Xd = X.to(dt);
      Tile dV = dot((K.to(f32) * eR).to(dt), Xd) + rows_of(dv_in, t0, c0, BC);
      store_rows(dv_out, t0, c0, BC, dV.to(dt));
      if (is_dkdv) {
        Tile V = rows_of(v, t0, 0, BC);
        Tile dK = dot(V, Xd.T()) * eR + rows_of(dk_in, t0, 0, W);
        store_rows(dk_out, t0, 0, W, dK.to(dt));
        if (dg_here) {
          Tile x = rows_of(qdq_in, t0, 0, W) - K.to(f32) * dK;
          store_rows(dg_out, t0, 0, W, cumsum(x, 0, true) + expand_dims(dg_after, 0));
          dg_after = dg_after + sum(x, 0);
        } else {
          store_rows(part, t0, 0, W, K.to(f32) * dK);
        }
      }
      X = X * expand_dims(etot, 1) + dot((Q.to(f32) * eL).to(dt).T(), dOc) * scale;
    }
  }, carried);

  if (dg_s.value()) {
    // rowsum(dfinal_state .* S_T) for this program's key columns: X is S_T^T.
    Tile dS = load(dht, {i_n, i_h, c0, 0}, {kIndex, kIndex, BC, W}, transposed);
    store(dg_s, {i_n, i_h, c0}, {kIndex, kIndex, BC}, sum(dS * X, 0));
  }
  if (dh0.value()) store(dh0, {i_n, i_h, 0, c0}, {kIndex, kIndex, W, BC}, X);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_gla_bwd_dg(const GlaChunkedBwdConfig& cfg) {
  const int64_t BC = gla_dg_columns(cfg.block_k);
  const DType f32 = DType::f32;
  KernelBuilder kb("gla_bwd_dg");
  kb.set_num_warps(4);
  Tensor q = kb.tensor("q", cfg.dtype, 4);  // for the sequence bounds
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor qdq = kb.tensor("qdq", f32, 4);
  Tensor kdk = kb.tensor("kdk", f32, 4);
  Tensor dg_s = cfg.final_state_grad ? kb.tensor("dg_state", f32, 3) : Tensor();
  Tensor dg = kb.tensor("dg", f32, 4);

  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 0);
  Tile c0 = program_id(1) * BC;  // this program's key columns
  const int64_t BT = summing_rows(64, BC);  // rows per step of this walk (any: it only sums)
  Tile num_chunks = (seq.eos - seq.bos + (BT - 1)) / BT;
  AccessOptions in_seq{.limits = {{1, seq.eos}}};
  Tile acc = zeros({BC}, f32);
  if (cfg.final_state_grad) acc = load(dg_s, {i_n, i_h, c0}, {kIndex, kIndex, BC});
  for_range(0, num_chunks, [&](Tile j) {
    Tile t0 = seq.bos + (num_chunks - 1 - j) * BT;
    Tile x = load(qdq, {seq.b, t0, i_h, c0}, {kIndex, BT, kIndex, BC}, in_seq) -
             load(kdk, {seq.b, t0, i_h, c0}, {kIndex, BT, kIndex, BC}, in_seq);
    store(dg, {seq.b, t0, i_h, c0}, {kIndex, BT, kIndex, BC}, cumsum(x, 0, true) + expand_dims(acc, 0), in_seq);
    acc = acc + sum(x, 0);
  }, acc);
  return kb.finish();
}

}  // namespace linac
