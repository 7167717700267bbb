// DeltaNet and gated DeltaNet backward in chunks: the UT transform recomputed, a forward walk storing the state
// before each chunk, a reverse walk storing the state gradient after each chunk, then every chunk's
// gradients in parallel (the equations are at the top of delta_rule_chunked_bwd.cpp). Memory: the
// per-chunk states, 2 * T*K*V/chunk elements in the input dtype, plus O(T*D) scratch: linear in T.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/op.h"

namespace linac {

struct DeltaChunkedBwdConfig {
  DType dtype = DType::f32;
  int chunk = 32;
  int64_t block_k = 64;  // K padded (the whole key dim in every kernel)
  int64_t block_v = 64;  // value columns per program of the walks (and of delta_rule_wy's u blocks)
  int64_t full_v = 64;   // V padded (the per-chunk kernel holds all of it)
  bool gated = false;    // gated_delta_rule: g [B,T,H] in, dg out
  bool initial_state = false;
  bool final_state_grad = false;
  bool initial_state_grad = false;
  bool varlen = false;
  int num_warps = 4;
  bool split_chunk = false;  // ungated: the per-chunk kernel as two (chunk_out, then chunk_ut)
};

std::shared_ptr<ir::Kernel> build_delta_bwd_states(const DeltaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_delta_bwd_dstates(const DeltaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_delta_bwd_chunk(const DeltaChunkedBwdConfig& cfg);
/// The ungated per-chunk kernel in two (split_chunk): the output's terms (dq; dk's output terms into
/// dk_part, f32; dW into dw, the input dtype), then the UT adjoint (dk, dv, dbeta).
std::shared_ptr<ir::Kernel> build_delta_bwd_chunk_out(const DeltaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_delta_bwd_chunk_ut(const DeltaChunkedBwdConfig& cfg);

/// Tuning keys of the chunked backward (chunk, bv, warps).
const std::vector<std::pair<std::string, std::string>>& delta_chunked_bwd_config_keys();

/// The plan of `linac run delta_rule|gated_delta_rule ... --backward` (inputs checked by the caller:
/// beta, do and for the gated form g present).
OpPlan plan_delta_rule_chunked_bwd(bool gated, const TensorMap& inputs, const OpOptions& opts,
                                   const std::vector<std::string>& wanted);

/// Representative kernels (head dim 64, plain and with every option) for dump/compile and test_ptxas.
std::vector<std::shared_ptr<ir::Kernel>> delta_chunked_bwd_kernels(bool gated, const OpOptions& opts);

}  // namespace linac
