// Linear attention backward (KERNELS.md section 1, "Backward"), plain or gated by a per-head scalar
// log-decay g: three walks with the shape of the forward (dq forward in time; dk and dv backward in
// time), a small dg kernel for the gate, and the plan that runs them. Memory stays O(T*D): chunk
// states are recomputed by the walks, none is stored per chunk. The split schedule (config split=1)
// stores them per chunk instead (O(T*K*V/chunk)) and computes the gradients chunk-parallel.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/op.h"
#include "kernels/op_support.h"

namespace linac {

/// The split schedule's chunks per program unless config group says otherwise.
inline constexpr int kDefaultChunkGroup = 4;

/// Compile-time configuration of the backward kernels. Every field specializes them.
struct LinearAttnBwdConfig {
  DType dtype = DType::f32;    // q, k, v, do and dq, dk, dv
  int chunk = 64;              // BT
  int64_t block_k = 64;        // K padded: the contraction width of the dv kernel
  int64_t block_v = 64;        // V padded: the contraction width of the dq and dk kernels
  int64_t split_k = 64;        // key columns per program of dq and dk (divides block_k)
  int64_t split_v = 64;        // value columns per program of dv (divides block_v)
  bool gated = false;          // g [B,T,H] present (and dg produced)
  bool initial_state = false;  // h0 present
  bool final_state_grad = false;  // dfinal_state present
  bool initial_state_grad = false;  // dinitial_state produced
  bool varlen = false;
  // --normalize's denominator D = LA(q, k, 1) folded into the dq and dk walks: the roles gain a second
  // pair of one column, (dD, 1) for dq and (1, dD) for dk, so each walk adds the denominator's
  // gradient to the numerator's with one state column more (dv needs none: 1 has no gradient).
  bool denominator = false;
  // The split schedule (config split=1): two state passes store the state before each chunk (S^T
  // walking forward, dH^T walking backward; [chunks, H, V, K] in the input dtype, O(T*K*V/chunk)), then
  // dq, dk and dv run one program per (chunk, head, column block). Sequential work per head drops
  // from three walks with every product to two walks with one product each; for few heads and long
  // sequences. Not with the denominator.
  bool split = false;
  int chunks_per_program = kDefaultChunkGroup;  // split: chunks one per-chunk program takes in turn (config group)
  bool final_state = false;  // the split forward (plan_linear_attn_split_fwd): the states pass stores S_T
  int num_warps = 8;
};

enum class LinearAttnBwdKernel {
  dq,  // forward walk over S^T; writes dq [, dg_q = per-block q.dq, dg_s = per-block <dfinal_state, S_T>]
  dk,  // reverse walk over dH^T; writes dk [, dg_k = per-block k.dk]
  dv,  // reverse walk over dH; writes dv [, dinitial_state]
  dg,  // gated only: dg = suffix sums of sum over blocks (dg_q - dg_k), plus sum of dg_s
  // The split schedule's state passes (with split, dq, dk and dv are per-chunk programs reading them):
  states,   // forward walk over S^T; writes s_states [, dg_s]
  dstates,  // reverse walk over dH^T; writes dh_states [, dinitial_state]
  // The split forward (same walks, the forward's roles): per chunk o from s_states (states pass first).
  out,
};

/// One backward kernel. Parameters (each only when the configuration uses it):
/// q k v do g initial_state dfinal_state cu_seqlens [chunk_offsets|chunk_indices, s_states|dh_states]
/// [den_do ones], its output, dg_q|dg_k|dg_s|dinitial_state, scale.
std::shared_ptr<ir::Kernel> build_linear_attn_bwd(const LinearAttnBwdConfig& cfg, LinearAttnBwdKernel which);

/// Tuning keys of the backward (chunk, bk, bv, warps).
const std::vector<std::pair<std::string, std::string>>& linear_attn_bwd_config_keys();

/// The plan of `linac run linear_attn --backward`.
OpPlan plan_linear_attn_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted);

/// The same with the denominator folded in (LinearAttnBwdConfig::denominator): inputs also hold
/// den_do (dL/dD, [B,T,H,1]) and ones ([B,T,H,1]); dq, dk (and dg) are the sums of the numerator's and
/// the denominator's gradients, dv the numerator's. No states. For the normalized backward's plan.
OpPlan plan_linear_attn_bwd_with_denominator(const TensorMap& inputs, const OpOptions& opts,
                                             const std::vector<std::string>& wanted);

/// The forward in the split schedule (config split=1 of `linac run linear_attn`): the backward's states
/// pass over S^T (also storing final_state when wanted), then one program per (chunk, head, value
/// block) for o. Plain or gated, initial_state, varlen; column blocks of `block_v` (the forward's bv).
OpPlan plan_linear_attn_split_fwd(const TensorMap& inputs, const SequenceLayout& seq, const LinearAttnBwdConfig& cfg,
                                  double scale, bool want_o, bool want_final_state);

/// Representative backward kernels for dump/compile (opts.dtype, head dim 64; plain and gated).
std::vector<std::shared_ptr<ir::Kernel>> linear_attn_bwd_kernels(const OpOptions& opts);

}  // namespace linac
