// DeltaNet and Gated DeltaNet forward (docs/ops/delta_rule.md, docs/ops/gated_delta_rule.md): the DSL
// kernels of the ops "delta_rule" and "gated_delta_rule" (the ops: op.h).
//
//   S_t = alpha_t (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t,  o_t = scale q_t S_t
// with alpha_t = exp(g_t) for the gated form and 1 otherwise.
//
// The chunked form runs two kernels:
//   1. delta_rule_wy, one program per (chunk, sequence x head), all chunks in parallel: the UT
//      transform T = (I + A)^-1 of the chunk and the WY representation W = T diag(beta exp(b)) K,
//      U = T diag(beta) V, written to scratch tensors w [B,T,H,K] and u [B,T,H,V blocks,BV];
//   2. delta_rule_fwd, one program per (V block, sequence x head), walking the chunks in order with the
//      state in registers: V_new = U - W S, the output and the state update (the schedule of
//      linear_attn's fused chunk kernel).
// The recurrent form (--recurrent, recurrent.cpp) walks the tokens one by one.
#pragma once
#include <memory>

#include "linac/dsl.h"

namespace linac {

/// --l2norm-qk divides q and k by sqrt(sum x^2 + kDeltaL2NormEps) (fla's l2norm).
inline constexpr double kDeltaL2NormEps = 1e-6;

/// Compile-time configuration of the delta-rule kernels. Every field specializes the kernel.
struct DeltaRuleConfig {
  DType dtype = DType::f32;  // q, k, v, o and the w/u scratch
  int chunk = 64;            // BT: rows per chunk, a multiple of 16 (chunked form only)
  int block_k = 64;          // BK >= K (the whole key dim lives in one program; masked past K)
  int block_v = 64;          // BV: value columns per program (the UT kernel covers all of V in blocks of it)
  bool gated = false;        // g [B,T,H] present
  bool l2norm_qk = false;    // q and k rows normalized: the chunked kernels read their inverse norms (q_norms,
                             // k_norms: norm_tables.h), the recurrent one forms them
  bool initial_state = false;
  bool final_state = false;
  bool varlen = false;       // cu_seqlens [N+1] present, B == 1
  int num_warps = 4;         // of the walk (delta_rule_fwd, the recurrent kernel)
  int wy_warps = 4;          // of delta_rule_wy (config ut_warps): 2 where it forms T alone from halves, else 4
  int num_stages = 2;        // chunk loads of delta_rule_fwd pipelined one iteration ahead
  bool store_t = false;      // delta_rule_wy also stores T (t_mat [B,T,H,BT], rows, input dtype) for the backward
  bool save_states = false;  // delta_rule_fwd also stores S before each chunk (h) and V_new (v_new) for the backward
  bool split = false;        // the split schedule: a state pass (build_delta_bwd_states), then delta_rule_out
  int wy_block_v = 64;       // delta_rule_wy: U's value columns per product (delta_wy_block_v)
  int v_blocks = 0;          // delta_rule_wy: U's value blocks of wy_block_v, unrolled (0: a loop up to v's dim)
  int segment = 0;           // rows per segment of the segment-parallel forward (0: one walk per sequence)
  int ut_chunk = 0;          // delta_rule_wy: rows per UT transform where it composes each chunk from two (0: one)
  bool scores = false;       // the walk reads each chunk's scores from delta_rule_scores' table (scores [B,T,H,BT])
  bool tform = false;        // the walk forms V_new from T and v (t_mat, v, beta); delta_rule_wy stores T alone
  bool early_products = false;  // the walk issues its products off the chain beside the chain's (fwd.cpp)
  int producer_warps = 0;    // 4: a warpgroup of its own fills the walk's TMA ring (sm_90a)
  bool overlap = false;      // the walk runs beside delta_rule_wy and delta_rule_scores, waiting for each group of
                             // chunks' flag (chunk_ready: kernels/common/overlap.h); they take the heads as their
                             // grid's first axis and signal the flags
};

// The UT transform's inverse and the decays inside a chunk are linac/blocks.h's
// (blocks::unit_lower_inverse_blocks, blocks::chunk_decays).

/// The UT kernel's value columns per product: the walk's block, but at least 64 in 16 bits (its U
/// products measured slower in narrower blocks: docs/ops/delta_rule.md, "Measured"), and at least 128
/// where it `composes` chunks of 64 from two transforms (ut_chunk: two unrolled blocks of 64 spilled 8
/// bytes at its 96 registers, where few heads take 32-column walks), at most the padded value dim. u
/// holds whole blocks of it ([B, T, H, blocks x wy_block_v]); the walk's blocks divide it.
int delta_wy_block_v(DType dtype, int walk_block_v, int64_t padded_v, bool composes = false);

/// The warps of a walk over value blocks of `block_v` columns: 4 where the blocks are narrower than
/// min(128, V) (few heads; the backward's head dims over 128), faster there on an H200
/// (docs/ops/delta_rule.md, "Measured", session 25), else `wide_warps`. The forward's and the
/// backward's walks take it alike.
int delta_walk_warps(int64_t block_v, int64_t padded_v, int wide_warps);

/// The warps, pipeline stages and blocks per SM of a walk over the chunks (delta_rule_fwd,
/// delta_rule_segment_states): one rule for both.
void configure_delta_walk(dsl::KernelBuilder& kb, const DeltaRuleConfig& cfg);

/// Records the UT/WY kernel. Parameters: k [v] beta [gate_b gate_cuts gate_totals] [q] [cu_seqlens
/// chunk_indices] [w u] [t_mat] [q_norms k_norms] (tform: T alone, no v, w, u); the gates' sums
/// (kernels/common/chunk_gate_sums.h) it reads and the inverse norms it writes (--l2norm-qk,
/// norm_tables.h) indexed by global chunk.
/// Grid: (chunks, N*H), or (total chunks over all sequences, H) with varlen; chunk_indices [chunks, 2]
/// holds (sequence, chunk of the sequence) per program then.
std::shared_ptr<ir::Kernel> build_delta_rule_wy(const DeltaRuleConfig& cfg);
/// Records the chunk-walking kernel. Parameters: q k w u (tform: t_mat v beta) [gate_b gate_cuts
/// gate_totals] [scores] [q_norms k_norms] [initial_state] [final_state] [cu_seqlens] [segment_inputs]
/// [chunk_offsets] [h v_new] o scale; the gates' sums (kernels/common/chunk_gate_sums.h), the inverse
/// norms (--l2norm-qk, norm_tables.h) and the per-chunk tables are indexed by global chunk, from
/// chunk_offsets [N+1] (the first chunk of each sequence; a parameter where gated, normalizing or saving).
/// Grid: (V blocks, N*H). With cfg.segment > 0 it walks one segment per program from the state
/// entering it (grid (V blocks, N*H, segments)): segment_inputs [N, segments, H, K, V] in place of the
/// initial and final states, which the segments' combine reads and writes (kernels/common/
/// segment_combine.h). With save_states it also stores, as the backward's state walk would recompute
/// them, the state before each chunk in the input dtype (h [chunks, H, K, V]) and V_new (v_new [B,T,H,V]).
std::shared_ptr<ir::Kernel> build_delta_rule_fwd(const DeltaRuleConfig& cfg);
/// Records the segment-parallel forward's first kernel (cfg.segment > 0, dense inputs): per (column
/// block, sequence x head, segment), the segment walked from a zero state gives Q_s [K, V] (programs of
/// the V blocks, to segment_states [N, segments, H, K, V]) and the product of its chunks' transitions
/// P_s [K, K] (programs of P's column blocks after them, to segment_transitions [N, segments, H, K, K]),
/// so that the state after the segment is P_s S + Q_s for the state S entering it (fwd_segments.cpp).
/// Parameters: q k w u [gate_b gate_cuts gate_totals] [k_norms] [chunk_offsets] segment_states
/// segment_transitions (chunk_offsets where gated or normalizing).
/// Grid: (V blocks + K blocks, N*H, segments).
std::shared_ptr<ir::Kernel> build_delta_rule_segment_states(const DeltaRuleConfig& cfg);
/// Records the chunks' scores kernel (cfg.scores): per chunk, all chunks in parallel, the [BT, BT] scores
/// of its output, P = scale (Q K^T) .* (r_q r_k^T) .* exp(b_r - b_c) .* M (r the inverse norms with
/// --l2norm-qk, M causal), rounded to the input dtype, into scores [B,T,H,BT] (rows as q's): the walk
/// then reads them once per value block instead of forming them in each. Parameters: q k [gate_b
/// gate_cuts gate_totals] [q_norms k_norms] [cu_seqlens chunk_indices] scores scale. Grid as delta_rule_wy's.
std::shared_ptr<ir::Kernel> build_delta_rule_scores(const DeltaRuleConfig& cfg);
/// Records the split schedule's output kernel. Parameters: q k [g] h v_new [cu_seqlens chunk_indices] o
/// scale. Grid: (chunks, N*H, V blocks), or (total chunks, H, V blocks) with varlen.
std::shared_ptr<ir::Kernel> build_delta_rule_out(const DeltaRuleConfig& cfg);
/// Records the token-by-token kernel. Parameters: q k v beta [g] [initial_state] [final_state]
/// [cu_seqlens] o scale. Grid: (V blocks, N*H); cfg.chunk and num_stages are unused.
std::shared_ptr<ir::Kernel> build_delta_rule_recurrent(const DeltaRuleConfig& cfg);

}  // namespace linac
