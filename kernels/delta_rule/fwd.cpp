#include "kernels/delta_rule/fwd.h"

#include <fmt/format.h>
#include <algorithm>

#include "kernels/common/chunk_gate_sums.h"
#include "kernels/common/log_decay.h"
#include "kernels/common/prologue.h"
#include "kernels/common/overlap.h"
#include "kernels/delta_rule/norm_tables.h"
#include "linac/blocks.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

namespace {

/// The blocks per SM ptxas is asked to fit the UT kernel's registers for: its programs are short and
/// many (one chunk each) and wait on their barriers and loads, so more blocks hide more of it, as far
/// as ptxas keeps them spill-free (13.0, sm_90a and sm_80): in 16 bits 72 registers a thread at chunks
/// of 32 up to head dim 128 (7 blocks of 4 warps), else 96 (5 blocks; 72 spills there); fp32 two
/// blocks (96 registers spill at head dims 64 and 256). Measured faster at each step
/// (docs/ops/delta_rule.md, "Measured"). tform's T of 64 rows alone without halves (ut = 0): 128 (96
/// spilled 16-24 bytes; untimed). tform's halves on 2 warps: gated 128 (8 blocks; at 96 the blocks of
/// A across the halves, held through the inverse, spilled 4 bytes); with --l2norm-qk 160 (6 blocks, as
/// many as its shared memory fits: at 128 it spilled 4 bytes with varlen).
int wy_blocks_per_sm(const DeltaRuleConfig& cfg) {
  if (dtype_bytes(cfg.dtype) == 4) return 2;
  int registers = 96;
  if (cfg.chunk == 32 && cfg.block_k <= 128) registers = 72;
  if (cfg.tform && cfg.chunk == 64 && cfg.ut_chunk == 0) registers = 128;
  if (cfg.tform && cfg.ut_chunk > 0 && cfg.wy_warps == 2) {  // T alone from halves, on 2 warps
    if (cfg.gated) registers = 128;
    if (cfg.l2norm_qk) registers = 160;
  }
  return std::max(2, 65536 / (registers * 32 * cfg.wy_warps));
}

}  // namespace

int delta_wy_block_v(DType dtype, int walk_block_v, int64_t padded_v, bool composes) {
  const int64_t columns = dtype_bytes(dtype) == 4 ? walk_block_v : std::max(walk_block_v, composes ? 128 : 64);
  return static_cast<int>(std::min<int64_t>(columns, padded_v));
}

int delta_walk_warps(int64_t block_v, int64_t padded_v, int wide_warps) {
  return block_v < std::min<int64_t>(128, padded_v) ? 4 : wide_warps;
}

void configure_delta_walk(KernelBuilder& kb, const DeltaRuleConfig& cfg) {
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  kb.set_producer_warps(cfg.producer_warps);
  // The gated walk at two blocks per SM (ptxas: 128 registers, 8 bytes spilled at K = V = 128, chunk 32,
  // 8 warps) rather than one (156 registers): faster (docs/ops/delta_rule.md, "Measured"). The
  // ungated walk gets there by itself (127 registers). Not for value blocks of 128 (one program per
  // head holds the whole state: 171 registers ungated).
  if (cfg.gated && cfg.block_v <= 64) kb.set_min_ctas_per_sm(2);
}

namespace {

/// The per-chunk kernels' (chunk, sequence x head) program ids: the chunk first, or with overlap the
/// heads first, so that programs are placed in the chunks' order (overlap.h).
std::pair<Tile, Tile> chunk_program_ids(const DeltaRuleConfig& cfg) {
  return cfg.overlap ? std::pair{program_id(1), program_id(0)} : std::pair{program_id(0), program_id(1)};
}

}  // namespace

// One program per chunk. With b the chunk-local cumulative log-decay (zero without a gate) and
// r = 1/||k|| with --l2norm-qk (else 1):
//   A = strictly_lower(diag(beta r) (K K^T) diag(r) .* exp(b_r - b_c))
//   T = (I + A)^-1                                  (fp32 throughout)
//   W = T diag(beta exp(b) r) K,   U = T diag(beta) V
// by blocks of 16 rows (NS = BT / 16 of them; chunk 16: one): T's diagonal blocks T_ii are inverted
// alone, those below by block substitution (blocks::unit_lower_inverse_blocks), and
// W_i = sum_{j <= i} T_ij diag(..)_j K_j (likewise U). Inverting the whole [BT, BT] matrix by
// doubling spent dense [BT, BT] products on blocks known to be zero: at chunk 32, 8 fp32 products of
// 32x32x32 against 14 of 16x16x16 here (docs/ops/delta_rule.md, "Measured").
// The decays are differences of b read from chunk_gate_sums' tables, with the gates below
// kLogDecayFloor (-inf included) set apart as the walk has them (log_decay.h: a decay spanning one is
// 0, every other as precise as without it). W and U are products on the tensor cores in the input
// dtype (each T_ij rounded to it once, as the state products use it). With tform, T alone, rounded to
// the input dtype, for the walk to form V_new from (no v read, no W or U).
std::shared_ptr<ir::Kernel> build_delta_rule_wy(const DeltaRuleConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.wy_block_v;
  const int64_t BS = std::min<int64_t>(BT, 16);
  const int NS = static_cast<int>(BT / BS);
  // Chunks composed of two UT transforms (config ut_chunk): the blocks in two groups of G.
  const bool halves = cfg.ut_chunk > 0;
  if (halves && (2 * cfg.ut_chunk != BT || cfg.ut_chunk % BS != 0 || cfg.store_t))
    throw InternalError(fmt::format("delta_rule_wy: UT transforms of {} rows in chunks of {}", cfg.ut_chunk, BT));
  const int G = halves ? NS / 2 : NS;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_wy" : "delta_rule_wy");
  kb.set_num_warps(cfg.wy_warps);
  kb.set_num_stages(1);
  // The inverse's fp32 products on the tensor cores (3xTF32; docs/ops/delta_rule.md, "Measured"). Left
  // to itself ptxas capped the 256-thread form at 48 registers and spilled.
  kb.set_tensor_core_f32(true);
  kb.set_min_ctas_per_sm(wy_blocks_per_sm(cfg));
  // tform: T alone (the walk forms V_new from it and v), no W and U.
  const bool wy = !cfg.tform, stores_t = cfg.store_t || cfg.tform;
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = wy ? kb.tensor("v", dt, 4) : Tensor();
  Tensor beta = kb.tensor("beta", f32, 3);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  Tensor q = cfg.l2norm_qk ? kb.tensor("q", dt, 4) : Tensor();
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, cfg.varlen);
  Tensor w = wy ? kb.tensor("w", dt, 4) : Tensor();
  Tensor u = wy ? kb.tensor("u", dt, 4) : Tensor();
  Tensor t_mat = stores_t ? kb.tensor("t_mat", dt, 4) : Tensor();
  const InverseNormTables norms = cfg.l2norm_qk ? InverseNormTables::declare(kb, /*with_q=*/true) : InverseNormTables();
  const ChunkReadyFlags flags = cfg.overlap ? ChunkReadyFlags::declare(kb) : ChunkReadyFlags();

  const auto [i_c, i_nh] = chunk_program_ids(cfg);
  const ChunkBounds cb = index_tables.bounds(k, i_c, i_nh, BT);
  auto finish = [&] {  // the chunk's outputs stored: the walk beside may read them
    if (cfg.overlap) flags.signal(cb.i_n, cb.chunk, cb.i_h);
    return kb.finish();
  };
  const Tile b = cb.b, i_h = cb.i_h, t0 = cb.t0;
  const AccessOptions& in_seq = cb.in_seq;
  Tile row = expand_dims(iota(BS), 1), col = expand_dims(iota(BS), 0);

  // Per block of rows: K, beta, the row factor of A (beta r), the column factors of A (r) and of W
  // (beta exp(b - b_ref) r, b_ref the cumulative gates before the block's group), and the gates'
  // chunk-local sums b and the set-apart gates' counts (chunk_gate_sums.h, filled before this kernel
  // runs: every decay a difference of b, as in the walk; summing the gates each decay spans here took
  // [16, 16] scans through shared memory per block, a tenth of the kernel's samples in ncu). Rows past
  // the sequence end load zeros (k, beta; the tables hold the chunk's totals there): their rows of A
  // vanish. Every load is issued before the first use of any: beta's strided rows stay in registers,
  // and each was waited for before the next block's loads went out.
  std::vector<Tile> K(NS), Q(NS), beta_s(NS), gate_b(NS), gate_cuts(NS), a_row(NS), a_col(NS), w_col(NS);
  // --l2norm-qk: Q's rows, for their norms alone, prefetched (copied to shared memory with the other
  // loads, read from there at their use): loaded to registers, all four blocks stood there at once
  // (ptxas: 164 bytes spilled at 96), and loaded block by block at their use each was waited for.
  const AccessOptions prefetched = in_seq.prefetched();
  for (int s = 0; s < NS; ++s) {
    Tile ts = t0 + s * BS;
    K[s] = load(k, {b, ts, i_h, 0}, {kIndex, BS, kIndex, BK}, in_seq);
    if (cfg.l2norm_qk) Q[s] = load(q, {b, ts, i_h, 0}, {kIndex, BS, kIndex, BK}, prefetched);
    beta_s[s] = load(beta, {b, ts, i_h}, {kIndex, BS, kIndex}, in_seq);
    if (cfg.gated) {
      gate_b[s] = load(gates.b, {cb.global_chunk, i_h, s * BS}, {kIndex, kIndex, BS});
      gate_cuts[s] = load(gates.cuts, {cb.global_chunk, i_h, s * BS}, {kIndex, kIndex, BS});
    }
  }
  // --l2norm-qk: the rows' inverse norms, kept in tables for the forward's later kernels (norm_tables.h).
  if (cfg.l2norm_qk)
    for (int s = 0; s < NS; ++s) {
      a_col[s] = InverseNormTables::store_inverse_norms(norms.k, K[s], cb.global_chunk, i_h, s * BS);
      InverseNormTables::store_inverse_norms(norms.q, Q[s], cb.global_chunk, i_h, s * BS);
    }
  // The sums at one row (or before the chunk: zeros), and the decay from an earlier row to a later:
  // exp(b_later - b_earlier) where no set-apart gate lies between (their counts equal), else 0. The
  // operands broadcast: [16] by a row's scalars, or [16, 1] by [1, 16] for a block of A.
  struct Sums {
    Tile b, cuts;
  };
  auto decay = [](const Sums& later, const Sums& earlier) {
    return where(later.cuts != earlier.cuts, 0.0f, exp(later.b - earlier.b));
  };
  const Tile zero = constant(0.0, f32);
  // The row before the block's group (W's decays start there): the chunk's start for the first group.
  auto group_start = [&](int s) -> Sums {
    const int g0 = s / G * G;
    if (g0 == 0) return {zero, zero};
    return {take(gate_b[g0 - 1], BS - 1, 0), take(gate_cuts[g0 - 1], BS - 1, 0)};
  };
  for (int s = 0; s < NS; ++s) {
    a_row[s] = cfg.l2norm_qk ? beta_s[s] * a_col[s] : beta_s[s];
    if (!wy) continue;  // W's factors
    w_col[s] = a_row[s];
    if (cfg.gated) w_col[s] = w_col[s] * decay({gate_b[s], gate_cuts[s]}, group_start(s));
  }
  // A's block (i, j), i >= j, masked to r > c on the diagonal (where the mask selects 0 over whatever
  // the decays of rows that do not interact came to).
  auto a_block = [&](int i, int j) {
    Tile A = dot(K[i], K[j].T()) * expand_dims(a_row[i], 1);
    if (cfg.l2norm_qk) A = A * expand_dims(a_col[j], 0);
    if (cfg.gated)
      A = A * decay({expand_dims(gate_b[i], 1), expand_dims(gate_cuts[i], 1)},
                    {expand_dims(gate_b[j], 0), expand_dims(gate_cuts[j], 0)});
    return i == j ? where(row > col, A, 0.0f) : A;
  };
  // T of each group's blocks (one group: the chunk's), zero between groups (A's blocks there absent).
  std::vector<std::vector<Tile>> A(NS, std::vector<Tile>(NS));
  for (int i = 0; i < NS; ++i)
    for (int j = i / G * G; j <= i; ++j) A[i][j] = a_block(i, j);
  // tform's blocks of A across the halves (for X below), formed with the others: K is then dead before
  // the inverse, whose blocks take its shared memory (more of the kernel's programs fit an SM).
  std::vector<std::vector<Tile>> A_21(NS, std::vector<Tile>(G));
  if (stores_t && halves)
    for (int m = G; m < NS; ++m)
      for (int j = 0; j < G; ++j) A_21[m][j] = a_block(m, j).to(dt);
  const std::vector<std::vector<Tile>> T = blocks::unit_lower_inverse_blocks(A);
  if (stores_t) {
    // T for the backward (store_t) or for the walk (tform), each block rounded to the input dtype. With
    // two halves (tform alone: saving refuses them), the blocks across them, X = -T_2 A_21 T_1, from
    // products of 16-bit operands, as the W and U composition below forms M = T_2 A_21: the within-half
    // blocks' fp32 substitution is what the halves save.
    std::vector<std::vector<Tile>> T_dt(NS, std::vector<Tile>(NS));
    for (int i = 0; i < NS; ++i)
      for (int j = i / G * G; j <= i; ++j) T_dt[i][j] = T[i][j].to(dt);
    if (halves) {
      std::vector<std::vector<Tile>> M_21(NS, std::vector<Tile>(G));
      auto sum_of = [](Tile acc, const Tile& term) { return acc.valid() ? acc + term : term; };
      for (int i = G; i < NS; ++i)
        for (int j = 0; j < G; ++j) {
          Tile Mij;
          for (int m = G; m <= i; ++m) Mij = sum_of(Mij, dot(T_dt[i][m], A_21[m][j]));
          M_21[i][j] = Mij.to(dt);
        }
      for (int i = G; i < NS; ++i)
        for (int j = 0; j < G; ++j) {
          Tile X;
          for (int n = j; n < G; ++n) X = sum_of(X, dot(M_21[i][n], T_dt[n][j]));
          T_dt[i][j] = (X * -1.0f).to(dt);
        }
    }
    for (int i = 0; i < NS; ++i)
      for (int j = 0; j < NS; ++j)
        store(t_mat, {b, t0 + i * BS, i_h, j * BS}, {kIndex, BS, kIndex, BS},
              j <= i ? T_dt[i][j] : zeros({BS, BS}, dt), in_seq);
  }
  if (!wy) return finish();
  // Two groups, the halves 1 and 2 of the chunk: with each half's T and decays from its own first row,
  // the chunk's T is [[T_1, 0], [-T_2 A_21 T_1, T_2]], so its W and U are
  //   W = [W_1; exp(b_1) W_2 - M W_1],   U = [U_1; U_2 - M U_1],
  //   M = T_2 A_21 = (W_2 K_1^T) .* m_cols,   m_cols_c = exp(b_1 - b_c) r_c,
  // b_c the first half's cumulative log-decay at row c, b_1 its total, r the key norms (--l2norm-qk):
  // products of the 16-bit W and K that the tensor cores take as they are, where forming the chunk's
  // off-half blocks of T took chains of fp32 16 x 16 products (docs/ops/delta_rule.md, "Measured").
  // M[i][j]: the [BS, BS] block of M for block i of the second half and block j of the first.
  std::vector<std::vector<Tile>> M(NS, std::vector<Tile>(NS));
  const Sums first_half_end = halves && cfg.gated ? group_start(G) : Sums();  // b_1
  std::vector<Tile> m_cols(G);
  if (halves)
    for (int j = 0; j < G; ++j) {
      // The decay from row c of block j to the first half's end.
      if (cfg.gated) m_cols[j] = decay(first_half_end, {gate_b[j], gate_cuts[j]});
      if (cfg.l2norm_qk) m_cols[j] = m_cols[j].valid() ? m_cols[j] * a_col[j] : a_col[j];
    }
  // The column factors go on T's blocks, so that the loaded K and V feed the tensor cores as they are.
  // Each block of W is composed and stored as soon as it is summed: one fp32 block live at a time.
  std::vector<Tile> W_dt(NS);  // W's blocks rounded (the first half's are the composition's operands)
  for (int i = 0; i < NS; ++i) {
    Tile W;
    for (int j = i / G * G; j <= i; ++j) {
      Tile term = dot((T[i][j] * expand_dims(w_col[j], 0)).to(dt), K[j]);
      W = W.valid() ? W + term : term;
    }
    W_dt[i] = W.to(dt);
    if (halves && i >= G) {
      if (cfg.gated) W = W * decay(first_half_end, group_start(0));
      for (int j = 0; j < G; ++j) {
        Tile Mij = dot(W_dt[i], K[j].T());
        M[i][j] = (m_cols[j].valid() ? Mij * expand_dims(m_cols[j], 0) : Mij).to(dt);
        W = W - dot(M[i][j], W_dt[j]);
      }
      W_dt[i] = W.to(dt);
    }
    store(w, {b, t0 + i * BS, i_h, 0}, {kIndex, BS, kIndex, BK}, W_dt[i], in_seq);
  }
  std::vector<std::vector<Tile>> T_beta(NS, std::vector<Tile>(NS));
  for (int i = 0; i < NS; ++i)
    for (int j = i / G * G; j <= i; ++j) T_beta[i][j] = (T[i][j] * expand_dims(beta_s[j], 0)).to(dt);
  // U in blocks of BV value columns: unrolled when the plan knows how many (V's loads then stand at the
  // top level and are prefetched while T is computed: waiting on them in the loop was the gated wy's
  // hottest stall in ncu), else a loop.
  auto u_block = [&](const Tile& iv) {
    Tile v0 = iv * BV;
    std::vector<Tile> V(NS);
    for (int j = 0; j < NS; ++j) V[j] = load(v, {b, t0 + j * BS, i_h, v0}, {kIndex, BS, kIndex, BV}, in_seq);
    std::vector<Tile> U_dt(NS);
    for (int i = 0; i < NS; ++i) {
      Tile U;
      for (int j = i / G * G; j <= i; ++j) U = U.valid() ? U + dot(T_beta[i][j], V[j]) : dot(T_beta[i][j], V[j]);
      if (halves && i >= G)
        for (int j = 0; j < G; ++j) U = U - dot(M[i][j], U_dt[j]);
      U_dt[i] = U.to(dt);
      store(u, {b, t0 + i * BS, i_h, v0}, {kIndex, BS, kIndex, BV}, U_dt[i], in_seq);
    }
  };
  if (cfg.v_blocks > 0) {
    for (int iv = 0; iv < cfg.v_blocks; ++iv) u_block(constant(iv, DType::i32));
  } else {
    for_range(0, (v.dim(3) + (BV - 1)) / BV, u_block);
  }
  return finish();
}

namespace {

/// A chunk's scores, in fp32, from QK = Q K^T: scale QK .* (q_norm k_norm^T) .* gam masked to `causal`,
/// with q_norm and k_norm the inverse row norms (--l2norm-qk), gam the decays exp(b_r - b_c); invalid
/// tiles stand for ones. The row factors go on the fp32 product, so that Q and K feed the tensor cores
/// as loaded. The walk, delta_rule_scores and the split schedule's outputs form them alike (the walk
/// issues the product early: compiler/passes/wgmma_waits.h, first use).
Tile chunk_scores(const Tile& QK, const Tile& scale, const Tile& q_norm, const Tile& k_norm, const Tile& gam,
                  const Tile& causal) {
  Tile A = QK * scale;
  if (q_norm.valid()) A = A * expand_dims(q_norm, 1) * expand_dims(k_norm, 0);
  if (gam.valid()) A = A * gam;
  return where(causal, A, 0.0f);
}

/// The state's share of a chunk's output, in fp32, from QS = Q S (S the state before the chunk, in the
/// input dtype): scale (q_factor .* Q) S, with q_factor its row factor (invalid: ones) applied to the
/// fp32 product. The output is it + P V_new (P the chunk's scores, chunk_scores, in the input dtype).
/// The products are the callers', so that the walk can issue them early (early_products).
Tile output_state_share(const Tile& QS, const Tile& scale, const Tile& q_factor) {
  return q_factor.valid() ? QS * expand_dims(q_factor * scale, 1) : QS * scale;
}

}  // namespace

// One program per (V block, sequence x head) walks the chunks of its sequence in order, carrying the
// state S [BK, BV] in registers. Per chunk, with b the chunk-local cumulative log-decay (zero without
// a gate), r_q, r_k the inverse row norms with --l2norm-qk (else 1) and W, U from delta_rule_wy:
//   V_new = U - W S
//   O     = scale * ((exp(b) r_q .* Q) S + ((Q K^T) .* (r_q r_k^T) .* exp(b_r - b_c) .* M) V_new)
//   S     = exp(b_C) S + (exp(b_C - b) r_k .* K)^T V_new
// The row factors are applied to fp32 products so that Q and K feed the tensor cores as loaded.
std::shared_ptr<ir::Kernel> build_delta_rule_fwd(const DeltaRuleConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_fwd" : "delta_rule_fwd");
  configure_delta_walk(kb, cfg);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  // W and U from delta_rule_wy, or (tform) the chunk's T, v and beta.
  Tensor w = cfg.tform ? Tensor() : kb.tensor("w", dt, 4);
  Tensor u = cfg.tform ? Tensor() : kb.tensor("u", dt, 4);
  Tensor t_mat = cfg.tform ? kb.tensor("t_mat", dt, 4) : Tensor();
  Tensor v = cfg.tform ? kb.tensor("v", dt, 4) : Tensor();
  Tensor beta = cfg.tform ? kb.tensor("beta", f32, 3) : Tensor();
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  Tensor scores = cfg.scores ? kb.tensor("scores", dt, 4) : Tensor();
  const InverseNormTables norms = cfg.l2norm_qk ? InverseNormTables::declare(kb, /*with_q=*/true) : InverseNormTables();
  const bool segmented = cfg.segment > 0;
  const bool h0_in = cfg.initial_state && !segmented, ht_out = cfg.final_state && !segmented;
  Tensor h0 = h0_in ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor ht = ht_out ? kb.tensor("final_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor seg_inputs = segmented ? kb.tensor("segment_inputs", f32, 5) : Tensor();
  const bool tables = cfg.save_states || cfg.gated || cfg.l2norm_qk;  // per-chunk tables, by global chunk
  Tensor chunk_offsets = tables ? kb.tensor("chunk_offsets", DType::i32, 1) : Tensor();
  Tensor h = cfg.save_states ? kb.tensor("h", dt, 4) : Tensor();
  Tensor vn = cfg.save_states ? kb.tensor("v_new", dt, 4) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, cu, cfg.varlen, 1);
  Tile i_s = segmented ? program_id(2) : Tile();
  const auto [b, bos, eos] = segmented ? segment_bounds(seq_rows, i_s, cfg.segment) : seq_rows;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;

  // Beside the UT (and scores) kernels (overlap.h): before any load of what they store, the first
  // groups of chunks counted done by them; in the loop, each next group.
  const ChunkReadyFlags flags = cfg.overlap ? ChunkReadyFlags::declare(kb) : ChunkReadyFlags();
  const int producers = cfg.scores ? 2 : 1;
  if (cfg.overlap) flags.wait_before_walk(i_n, num_chunks, i_h, producers);

  Tile S = zeros({BK, BV}, f32);
  if (h0_in) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});
  if (segmented) S = load(seg_inputs, {i_n, i_s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
  // The tables' row of the walk's first chunk (segments are whole chunks).
  Tile first_chunk = tables ? load(chunk_offsets, {i_n}, {kIndex}) : Tile();
  if (tables && segmented) first_chunk = first_chunk + i_s * (cfg.segment / BT);

  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile causal = row >= col;
  AccessOptions in_seq{.limits = {{1, eos}}};

  // The gates' sums (chunk_gate_sums.h), loaded an iteration ahead: [BT] fp32 tiles are too small for
  // the pipeliner's 16-byte copies per thread, and loaded in their own iteration they held up the state
  // update (exp(b_C - b) scales V_new before K^T V_new). Forming the next chunk's gate terms at the end
  // of the iteration as well was slower (docs/ops/delta_rule.md, "Measured").
  GateSums next;
  if (cfg.gated) next = gates.load(first_chunk, i_h, BT);
  // The inverse norms (--l2norm-qk: the UT kernel's tables, norm_tables.h) likewise.
  Tile next_q_norm, next_k_norm;
  auto load_norms = [&](const Tile& chunk) {
    next_q_norm = norms.load_q(chunk, i_h, 0, BT);
    next_k_norm = norms.load_k(chunk, i_h, 0, BT);
  };
  if (cfg.l2norm_qk) load_norms(first_chunk);
  // tform: beta's rows likewise (strided [BT] fp32).
  Tile next_beta;
  auto load_beta = [&](const Tile& row0) { next_beta = load(beta, {b, row0, i_h}, {kIndex, BT, kIndex}, in_seq); };
  if (cfg.tform) load_beta(bos);

  auto body = [&](Tile i) {
    if (cfg.overlap) flags.wait_in_walk(i, i_n, num_chunks, i_h, producers);
    Tile t0 = bos + i * BT;
    Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile W, U, T, V, beta_c;
    if (cfg.tform) {
      T = load(t_mat, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BT}, in_seq);
      V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
      beta_c = next_beta;
      load_beta(t0 + BT);
    } else {
      W = load(w, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
      U = load(u, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    }
    Tile P = cfg.scores ? load(scores, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BT}, in_seq) : Tile();
    // Per-row factors of Q S and of K in the state update, and (tform) of K S; invalid tiles stand for
    // all ones.
    Tile q_norm, k_norm, q_factor, k_factor, ks_factor, b_last, gam;
    if (cfg.l2norm_qk) {
      q_factor = q_norm = next_q_norm;
      k_factor = k_norm = next_k_norm;
      load_norms(first_chunk + i + 1);
    }
    if (cfg.gated) {
      // Differences of b (log_decay.h) rather than the gates each decay spans summed: those are a
      // [BT, BT] scan through shared memory in every chunk of the walk's chain. The state pass of the
      // backward (build_delta_bwd_states) forms them the same way: the saved states are its states.
      const ChunkLogDecays dec = next.decays();
      next = gates.load(first_chunk + i + 1, i_h, BT);
      Tile e_b = dec.from_start(), decay = dec.to_end();  // exp(b), exp(b_C - b_r)
      b_last = dec.total;
      if (!cfg.scores) gam = dec.between(causal);  // exp(b_r - b_c) for r >= c, 1 above the diagonal
      q_factor = q_factor.valid() ? q_factor * e_b : e_b;
      k_factor = k_factor.valid() ? k_factor * decay : decay;
      if (cfg.tform) ks_factor = k_norm.valid() ? k_norm * e_b : e_b;
    } else {
      ks_factor = k_norm;
    }
    Tile S_dt = S.to(dt);
    // The products off the chain: Q S, and Q K^T where the walk forms the scores. With early_products
    // (fwd.h) they are issued beside the chain's first (K S or W S), and P V_new before the state's
    // product, each waited for at its first use (wgmma: compiler/passes/wgmma_waits.h), so that they
    // run beside the chain's products; else each where its result is needed.
    Tile QS, QK;
    auto off_chain_products = [&] {
      QS = dot(Q, S_dt);
      if (!cfg.scores) QK = dot(Q, K.T());
    };
    Tile V_new32;
    if (cfg.tform) {
      // W S = T diag(beta) diag(r_k exp(b)) K S (delta_rule_wy's W), so
      // V_new = U - W S = T (beta .* (V - r_k exp(b) .* (K S))): no W or U to read, one product more.
      Tile KS = dot(K, S_dt);
      if (cfg.early_products) off_chain_products();
      Tile V_minus = V.to(f32) - (ks_factor.valid() ? KS * expand_dims(ks_factor, 1) : KS);
      V_new32 = dot(T, (V_minus * expand_dims(beta_c, 1)).to(dt));
    } else {
      Tile WS = dot(W, S_dt);
      if (cfg.early_products) off_chain_products();
      V_new32 = U.to(f32) - WS;
    }
    Tile V_new = V_new32.to(dt);
    if (cfg.save_states) {
      store(h, {first_chunk + i, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S_dt);
      store(vn, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, V_new, in_seq);
    }
    // (diag(f) K)^T V_new = K^T (diag(f) V_new): the factor goes on the smaller fp32 tile. Formed here,
    // right after V_new, so that the fp32 V_new is dead before O's products (gated bv-128 walk: ptxas
    // 255 -> 212 registers).
    Tile V_state = k_factor.valid() ? (V_new32 * expand_dims(k_factor, 1)).to(dt) : V_new;

    auto update_state = [&] { S = blocks::state_update(S, K, V_state, b_last, /*in_place=*/true); };
    Tile O;
    if (cfg.early_products) {
      if (!cfg.scores) P = chunk_scores(QK, scale, q_norm, k_norm, gam, causal).to(dt);
      Tile PV = dot(P, V_new);
      update_state();  // its product in flight while O is summed
      O = output_state_share(QS, scale, q_factor) + PV;
    } else {
      if (!cfg.scores) P = chunk_scores(dot(Q, K.T()), scale, q_norm, k_norm, gam, causal).to(dt);
      O = output_state_share(dot(Q, S_dt), scale, q_factor);
      O = O + dot(P, V_new);
    }
    store(o, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt), in_seq);
    if (!cfg.early_products) update_state();
  };
  std::vector<Tile*> carried = next.carried_with(S);
  if (cfg.l2norm_qk) carried.insert(carried.end(), {&next_q_norm, &next_k_norm});
  if (cfg.tform) carried.push_back(&next_beta);
  for_range_carrying(0, num_chunks, body, carried);

  if (ht_out) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

// One program per chunk (all in parallel), as delta_rule_wy: the chunk's scores as the walk would form
// them (chunk_scores, with the walk's decays: differences of the gates' sums), rounded to the input
// dtype and stored for the walk's value blocks to read.
std::shared_ptr<ir::Kernel> build_delta_rule_scores(const DeltaRuleConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k;
  const DType dt = cfg.dtype;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_scores" : "delta_rule_scores");
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  const InverseNormTables norms = cfg.l2norm_qk ? InverseNormTables::declare(kb, /*with_q=*/true) : InverseNormTables();
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, cfg.varlen);
  Tensor scores = kb.tensor("scores", dt, 4);
  Tile scale = kb.scalar("scale", DType::f32);
  const ChunkReadyFlags flags = cfg.overlap ? ChunkReadyFlags::declare(kb) : ChunkReadyFlags();

  const auto [i_c, i_x] = chunk_program_ids(cfg);
  const ChunkBounds cb = index_tables.bounds(q, i_c, i_x, BT);
  const Tile b = cb.b, i_h = cb.i_h, t0 = cb.t0;
  Tile causal = expand_dims(iota(BT), 1) >= expand_dims(iota(BT), 0);
  Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, cb.in_seq);
  Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, cb.in_seq);
  Tile q_norm, k_norm, gam;
  if (cfg.l2norm_qk) {
    q_norm = norms.load_q(cb.global_chunk, i_h, 0, BT);
    k_norm = norms.load_k(cb.global_chunk, i_h, 0, BT);
  }
  if (cfg.gated) gam = gates.load(cb.global_chunk, i_h, BT).decays().between(causal);
  store(scores, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BT},
        chunk_scores(dot(Q, K.T()), scale, q_norm, k_norm, gam, causal).to(dt), cb.in_seq);
  if (cfg.overlap) flags.signal(cb.i_n, cb.chunk, i_h);
  return kb.finish();
}

// The split schedule's outputs (config split=1): one program per (chunk, sequence x head, V block), all
// in parallel, from the state before the chunk (h) and V_new that the state pass
// (build_delta_bwd_states) stored:
//   O = scale ((exp(b) .* Q) S + ((Q K^T) .* exp(b_r - b_c) .* M) V_new)
// The walk then carries only V_new and the state update from chunk to chunk: where few (sequence, head)
// pairs leave most SMs idle, its chunks go faster than the fused walk's.
std::shared_ptr<ir::Kernel> build_delta_rule_out(const DeltaRuleConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_out" : "delta_rule_out");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor g = cfg.gated ? kb.tensor("g", f32, 3) : Tensor();
  Tensor h = kb.tensor("h", dt, 4);
  Tensor vn = kb.tensor("v_new", dt, 4);
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, cfg.varlen);
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_c = program_id(0), i_x = program_id(1), i_v = program_id(2);
  const ChunkBounds cb = index_tables.bounds(q, i_c, i_x, BT);
  const Tile b = cb.b, i_h = cb.i_h, t0 = cb.t0;
  const AccessOptions& in_seq = cb.in_seq;
  Tile v0 = i_v * BV;
  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);

  Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile S = load(h, {cb.global_chunk, i_h, 0, v0}, {kIndex, kIndex, BK, BV});
  Tile V_new = load(vn, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
  Tile e_b, gam;  // exp(b) and exp(b_r - b_c), the decays summed directly
  if (cfg.gated) {
    Tile gc = load(g, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq);
    e_b = exp(cumsum(gc, 0));
    gam = exp(blocks::decays_between_rows(gc));
  }
  Tile P = chunk_scores(dot(Q, K.T()), scale, Tile(), Tile(), gam, row >= col).to(dt);
  Tile O = output_state_share(dot(Q, S), scale, e_b);
  O = O + dot(P, V_new);
  store(o, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt), in_seq);
  return kb.finish();
}

}  // namespace linac
