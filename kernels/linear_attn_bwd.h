// Linear attention backward (KERNELS.md section 1, "Backward"), plain or gated by a per-head scalar
// log-decay g: two DSL kernels and the plan that runs them. Memory stays O(T*D): chunk states are
// recomputed by a forward walk, the state gradient is carried by a reverse walk, none is stored per chunk.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/op.h"

namespace linac {

/// Compile-time configuration of the two backward kernels. Every field specializes them.
struct LinearAttnBwdConfig {
  DType dtype = DType::f32;    // q, k, v, do and dq, dk, dv
  int chunk = 64;              // BT
  int block_k = 64;            // BK >= K (one program holds the whole key dim)
  int block_v = 64;            // BV >= V (one program holds the whole value dim: dq and dk sum over V)
  bool gated = false;          // g [B,T,H] present (and dg produced)
  bool initial_state = false;  // h0 present
  bool final_state_grad = false;  // dfinal_state present
  bool initial_state_grad = false;  // dinitial_state produced
  bool varlen = false;
  int num_warps = 8;
};

/// Forward walk: recomputes the state before each chunk and writes dq; with a gate also writes
/// dg_partial = q.dq per token and, with dfinal_state, dg_state = <dfinal_state, S_T> per (n, h).
/// Parameters: q k v do [g] [h0] [dht] [cu_seqlens] dq [dg] [dg_state] scale.
std::shared_ptr<ir::Kernel> build_linear_attn_bwd_dq(const LinearAttnBwdConfig& cfg);
/// Reverse walk: carries dS (the gradient w.r.t. the state after the chunk) and writes dk, dv, [dg]
/// and [dinitial_state]. Parameters: q k v do [g] [dht] [cu_seqlens] [dg_state] dk dv [dg] [dh0] scale.
std::shared_ptr<ir::Kernel> build_linear_attn_bwd_dkv(const LinearAttnBwdConfig& cfg);

/// The plan of `linac run linear_attn --backward`.
OpPlan plan_linear_attn_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted);

/// Representative backward kernels for dump/compile (opts.dtype, default sizes; plain and gated).
std::vector<std::shared_ptr<ir::Kernel>> linear_attn_bwd_kernels(const OpOptions& opts);

}  // namespace linac
