// linear_attn backward, split schedule (--backward --config split=1; plain form, dense inputs, head dims
// up to 128): the state recurrences walk alone in key x value blocks, storing the state before and its
// gradient after every chunk, then every chunk's gradients are computed in parallel. For few sequences x
// heads at long T, where the three walks of the default leave SMs idle. Equations in the .cpp.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

struct LinearAttnSplitBwdConfig {
  DType dtype = DType::f32;
  int chunk = 64;
  int64_t block_k = 64;        // K padded: linear_attn_bwd_chunk holds a chunk's state whole
  int64_t block_v = 64;        // V padded
  int64_t state_block_k = 32;  // key columns per program of the state passes
  int64_t state_block_v = 32;  // value columns per program of the state passes
  int state_warps = 4;
  int state_stages = 2;
  int num_warps = 8;           // of linear_attn_bwd_chunk
  bool initial_state = false;
  bool final_state_grad = false;
  bool initial_state_grad = false;
  bool accumulate_dqdk = false;  // linear_attn_bwd_chunk adds dq and dk to what the tensors hold
};

/// The forward state pass (kernels/common/state_pass.h): h[b, c, h] = the state before chunk c ([B, NT, H, K, V],
/// dtype). Parameters: k v [initial_state] h.
std::shared_ptr<ir::Kernel> build_linear_attn_bwd_states(const LinearAttnSplitBwdConfig& cfg);
/// The reverse pass (kernels/common/state_pass.h): dh[b, c, h] = dL/dS after chunk c; dinitial_state at the
/// end. Parameters: q do [dfinal_state] [dinitial_state] dh scale.
std::shared_ptr<ir::Kernel> build_linear_attn_bwd_dstates(const LinearAttnSplitBwdConfig& cfg);
/// Every chunk's dq, dk, dv from h and dh, one program per (chunk, batch x head). Parameters: q k v do h
/// dh dq dk dv scale.
std::shared_ptr<ir::Kernel> build_linear_attn_bwd_chunk(const LinearAttnSplitBwdConfig& cfg);

}  // namespace linac
