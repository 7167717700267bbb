// Linear attention backward (docs/ops/linear_attn.md, "Backward"), plain or gated by a per-head scalar
// log-decay g: three walks with the shape of the forward (dq forward in time; dk and dv backward in
// time) and a small dg kernel for the gate, in the DSL (their plan is in op_bwd.cpp). Memory stays
// O(T*D): chunk states are recomputed by the walks, none is stored per chunk.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

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
  int num_warps = 8;
  int producer_warps = 0;  // 4: a warpgroup of its own fills the walks' TMA ring (sm_90a)
};

enum class LinearAttnBwdKernel {
  dq,  // forward walk over S^T; writes dq [, dg_q = per-block q.dq, dg_s = per-block <dfinal_state, S_T>]
  dk,  // reverse walk over dH^T; writes dk [, dg_k = per-block k.dk]
  dv,  // reverse walk over dH; writes dv [, dinitial_state]
  dg,  // gated only: dg = suffix sums of sum over blocks (dg_q - dg_k), plus sum of dg_s
};

/// One backward kernel. Parameters (each only when the configuration uses it):
/// q k v do g initial_state dfinal_state cu_seqlens [den_do ones], its output, dg_q|dg_k|dg_s|dinitial_state, scale.
std::shared_ptr<ir::Kernel> build_linear_attn_bwd(const LinearAttnBwdConfig& cfg, LinearAttnBwdKernel which);

}  // namespace linac
