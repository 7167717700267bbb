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
  bool l2norm_qk = false;    // normalize q and k rows inside the kernels
  bool initial_state = false;
  bool final_state = false;
  bool varlen = false;       // cu_seqlens [N+1] present, B == 1
  int num_warps = 4;         // of the walk (delta_rule_fwd, the recurrent kernel)
  int wy_warps = 4;          // of delta_rule_wy: 4 faster than 8 (docs/ops/delta_rule.md, "Measured")
  int num_stages = 2;        // chunk loads of delta_rule_fwd pipelined one iteration ahead
  bool store_t = false;      // delta_rule_wy also stores T (t_mat [B,T,H,BT], rows, input dtype) for the backward
  bool save_states = false;  // delta_rule_fwd also stores S before each chunk (h) and V_new (v_new) for the backward
  bool split = false;        // the split schedule: a state pass (build_delta_bwd_states), then delta_rule_out
  int v_blocks = 0;          // delta_rule_wy: U's value blocks of block_v, unrolled (0: a loop up to v's dim)
};

// The UT transform's inverse, the decays inside a chunk and the l2norm of rows are linac/blocks.h's
// (blocks::unit_lower_inverse_blocks, blocks::chunk_decays, blocks::inverse_norms).

/// Records the UT/WY kernel. Parameters: k v beta [g] [cu_seqlens chunk_indices] w u.
/// Grid: (chunks, N*H), or (total chunks over all sequences, H) with varlen; chunk_indices [chunks, 2]
/// holds (sequence, chunk of the sequence) per program then.
std::shared_ptr<ir::Kernel> build_delta_rule_wy(const DeltaRuleConfig& cfg);
/// Records the chunk-walking kernel. Parameters: q k w u [g] [initial_state] [final_state]
/// [cu_seqlens] [chunk_offsets h v_new] o scale. Grid: (V blocks, N*H). With save_states it also stores,
/// as the backward's state walk would recompute them, the state before each chunk in the input dtype
/// (h [chunks, H, K, V], chunk_offsets [N+1] the first chunk of each sequence) and V_new (v_new [B,T,H,V]).
std::shared_ptr<ir::Kernel> build_delta_rule_fwd(const DeltaRuleConfig& cfg);
/// Records the split schedule's output kernel. Parameters: q k [g] h v_new [cu_seqlens chunk_indices] o
/// scale. Grid: (chunks, N*H, V blocks), or (total chunks, H, V blocks) with varlen.
std::shared_ptr<ir::Kernel> build_delta_rule_out(const DeltaRuleConfig& cfg);
/// Records the token-by-token kernel. Parameters: q k v beta [g] [initial_state] [final_state]
/// [cu_seqlens] o scale. Grid: (V blocks, N*H); cfg.chunk and num_stages are unused.
std::shared_ptr<ir::Kernel> build_delta_rule_recurrent(const DeltaRuleConfig& cfg);

}  // namespace linac
