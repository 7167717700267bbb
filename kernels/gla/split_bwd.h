// GLA backward, split schedule (--backward --config split=1, dense inputs): the state recurrences walk
// alone in key x value blocks, storing the state before and its gradient after every chunk; then every
// chunk's gradients are computed in parallel. For few sequences x heads at long T, where the walks of the
// default schedule leave SMs idle. The equations are at the top of split_bwd.cpp.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

struct GlaSplitBwdConfig {
  DType dtype = DType::f32;
  int chunk = 64;              // rows per chunk (as gla_bwd_intra's)
  int64_t block_k = 64;        // K padded: gla_bwd_inter holds the whole state of its chunk
  int64_t block_v = 64;        // V padded
  int64_t state_block_k = 32;  // key columns per program of the state passes
  int64_t state_block_v = 32;  // value columns per program of the state passes
  int state_warps = 4;
  int state_stages = 2;        // the state passes' chunk loads pipelined one chunk ahead
  int num_warps = 8;           // of gla_bwd_inter
  bool initial_state = false;
  bool final_state = false;       // gla_bwd_states stores S_T (the backward: for dg's final-state term)
  bool final_state_grad = false;
  bool initial_state_grad = false;
  bool decay_queries = true;      // gla_bwd_gates also stores qd (the forward's split schedule needs kd only)
};

/// Every chunk's decayed operands, in parallel (one program per chunk and batch x head): qd = Q .* exp(L)
/// (unless !decay_queries), kd = K .* exp(R) ([B, T, H, K], dtype) and etot = exp(tot) ([B, NT, H, K],
/// fp32). Parameters: q k g [qd] kd etot. The forward's split schedule uses it and gla_bwd_states too.
std::shared_ptr<ir::Kernel> build_gla_bwd_gates(const GlaSplitBwdConfig& cfg);

/// The forward state pass (kernels/common/state_pass.h): h[b, c, h] = the state before chunk c ([B, NT, H, K, V]
/// in dtype) and, with final_state, S_T. Parameters: kd v etot [initial_state] [final_state] h.
std::shared_ptr<ir::Kernel> build_gla_bwd_states(const GlaSplitBwdConfig& cfg);

/// The reverse state pass (kernels/common/state_pass.h): dh[b, c, h] = dL/dS after chunk c ([B, NT, H, K, V] in
/// dtype), dinitial_state at the end. Parameters: qd do etot [dfinal_state] [dinitial_state] dh scale.
std::shared_ptr<ir::Kernel> build_gla_bwd_dstates(const GlaSplitBwdConfig& cfg);

/// Every chunk's dq, dk, dv from h, dh and gla_bwd_intra's parts, and dg's sums within the chunk (its
/// total into dg_chunk [B, NT, H, K]), one program per (chunk, batch x head). Parameters: q k v g do h
/// dh dq_intra dk_intra dv_intra dq dk dv dg dg_chunk scale.
std::shared_ptr<ir::Kernel> build_gla_bwd_inter(const GlaSplitBwdConfig& cfg);

/// dg's offset per chunk: the later chunks' totals and the final state's term ([B, NT, H, K]), one
/// program per batch x head walking blocks of chunks from the last. Parameters: dg_chunk [dfinal_state
/// final_state] dg_offset.
std::shared_ptr<ir::Kernel> build_gla_bwd_dg_offsets(const GlaSplitBwdConfig& cfg);

/// dg completed: each chunk's rows plus its offset, one program per (chunk, batch x head). Parameters:
/// dg_offset dg.
std::shared_ptr<ir::Kernel> build_gla_bwd_dg_add(const GlaSplitBwdConfig& cfg);

}  // namespace linac
