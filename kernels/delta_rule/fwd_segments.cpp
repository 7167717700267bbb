// The delta rules' segment-parallel forward, its first kernel (docs/ops/delta_rule.md, "Few heads:
// sequence parallelism"). Per chunk the state update is affine in the state,
//   S' = A S + B,   A = exp(b_C) I - K_d^T W  [K, K],   B = K_d^T U  [K, V]   (K_d = diag(exp(b_C - b)) K),
// so a segment maps the state entering it to P S + Q, with P the product of its chunks' A and Q the
// segment walked from a zero state. Both are walks of the same chain: Q carries U's columns from zero,
// P carries I's columns with U = 0 (A P = exp(b_C) P + K_d^T (0 - W P)). The segments' combine
// (kernels/common/segment_combine.h) then forms the states entering them, S_{s+1} = P_s S_s + Q_s,
// and delta_rule_fwd walks each segment from its own (fwd.cpp).
#include <algorithm>

#include "kernels/common/chunk_gate_sums.h"
#include "kernels/common/prologue.h"
#include "kernels/delta_rule/fwd.h"
#include "kernels/delta_rule/norm_tables.h"
#include "linac/blocks.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

// One program per (column block, sequence x head, segment): blocks below the number of U's V blocks
// walk Q's columns, those after them P's (BV columns each). A P program's U loads are masked whole
// (they read zeros); its store goes to segment_transitions, a Q program's to segment_states. The chain
// per chunk is delta_rule_fwd's with the outputs left out, in the same roundings:
//   X = U - W S,   S = exp(b_C) S + (exp(b_C - b) r_k .* K)^T X.
std::shared_ptr<ir::Kernel> build_delta_rule_segment_states(const DeltaRuleConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_segment_states" : "delta_rule_segment_states");
  configure_delta_walk(kb, cfg);
  Tensor q = kb.tensor("q", dt, 4);  // for the sequence bounds (B, T, H)
  Tensor k = kb.tensor("k", dt, 4);
  Tensor w = kb.tensor("w", dt, 4);
  Tensor u = kb.tensor("u", dt, 4);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  const InverseNormTables norms = cfg.l2norm_qk ? InverseNormTables::declare(kb, /*with_q=*/false) : InverseNormTables();
  const bool tables = cfg.gated || cfg.l2norm_qk;  // per-chunk tables, by global chunk
  Tensor chunk_offsets = tables ? kb.tensor("chunk_offsets", DType::i32, 1) : Tensor();
  Tensor seg_states = kb.tensor("segment_states", f32, 5);
  Tensor transitions = kb.tensor("segment_transitions", f32, 5);

  Tile i_c = program_id(0), i_s = program_id(2);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, Tensor(), /*varlen=*/false, 1);
  const auto [b, bos, eos] = segment_bounds(seq_rows, i_s, cfg.segment);
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  // Which columns: Q's block i_v (is_p = 0) or P's columns from p0 (is_p = 1).
  Tile v_blocks = (seg_states.dim(4) + (BV - 1)) / BV;
  Tile is_p = minimum(i_c / v_blocks, 1);
  Tile i_v = minimum(i_c, v_blocks - 1);
  Tile p0 = maximum(i_c - v_blocks, 0) * BV;

  // P starts as I's columns p0 .. p0 + BV, Q as zeros.
  Tile rows_k = expand_dims(iota(BK), 1), cols = expand_dims(iota(BV), 0);
  Tile S = where(rows_k == cols + p0, is_p.to(f32), 0.0f);
  AccessOptions in_seq{.limits = {{1, eos}}};
  AccessOptions u_rows{.limits = {{1, eos * (1 - is_p)}}};  // none for P's columns: U = 0

  // The gates' sums and the keys' inverse norms an iteration ahead, as delta_rule_fwd loads them, from
  // the segment's first chunk.
  Tile first_chunk = tables ? load(chunk_offsets, {i_n}, {kIndex}) + i_s * (cfg.segment / BT) : Tile();
  GateSums next;
  if (cfg.gated) next = gates.load(first_chunk, i_h, BT);
  Tile next_k_norm = cfg.l2norm_qk ? norms.load_k(first_chunk, i_h, 0, BT) : Tile();
  auto body = [&](Tile i) {
    Tile t0 = bos + i * BT;
    Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile W = load(w, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile U = load(u, {b, t0, i_h, i_v * BV}, {kIndex, BT, kIndex, BV}, u_rows);
    Tile k_factor, b_last;  // invalid: ones, no decay
    if (cfg.l2norm_qk) {
      k_factor = next_k_norm;
      next_k_norm = norms.load_k(first_chunk + i + 1, i_h, 0, BT);
    }
    if (cfg.gated) {
      const ChunkLogDecays dec = next.decays();
      next = gates.load(first_chunk + i + 1, i_h, BT);
      b_last = dec.total;
      k_factor = k_factor.valid() ? k_factor * dec.to_end() : dec.to_end();
    }
    Tile X32 = U.to(f32) - dot(W, S.to(dt));
    Tile X = k_factor.valid() ? (X32 * expand_dims(k_factor, 1)).to(dt) : X32.to(dt);
    S = blocks::state_update(S, K, X, b_last, /*in_place=*/true);
  };
  std::vector<Tile*> carried = next.carried_with(S);
  if (cfg.l2norm_qk) carried.push_back(&next_k_norm);
  for_range_carrying(0, num_chunks, body, carried);

  store(seg_states, {i_n, i_s, i_h, 0, i_v * BV}, {kIndex, kIndex, kIndex, BK, BV}, S,
        {.limits = {{4, seg_states.dim(4) * (1 - is_p)}}});
  store(transitions, {i_n, i_s, i_h, 0, p0}, {kIndex, kIndex, kIndex, BK, BV}, S,
        {.limits = {{4, transitions.dim(4) * is_p}}});
  return kb.finish();
}

}  // namespace linac
