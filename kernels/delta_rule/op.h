// The ops "delta_rule" and "gated_delta_rule" (docs/ops/delta_rule.md, docs/ops/gated_delta_rule.md):
// their registry entries, and what their files share. op.cpp holds the registry entries and the
// forward's plans and defaults, op_bwd.cpp the backward's; the kernels they launch are in fwd.h, bwd.h
// and bwd_tokenwise.h (the math alone).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/config_schema.h"
#include "kernels/common/op_support.h"
#include "kernels/op.h"

namespace linac {

struct DeltaChunkedBwdConfig;

/// The ops "delta_rule" and "gated_delta_rule" for the registry.
OpDef delta_rule_op();
OpDef gated_delta_rule_op();

/// build_delta_bwd_states, recorded once per configuration (the forward's split schedule runs it too).
std::shared_ptr<ir::Kernel> delta_state_pass_kernel(const DeltaChunkedBwdConfig& cfg);

/// One of the forward's tensors that the backward takes instead of recomputing it (an output of the
/// forward, an input of --backward), in the input dtype.
struct DeltaSavedTensor {
  std::string name;    // saved_w, saved_t, saved_h, saved_v_new
  std::string tensor;  // the plan tensor that holds it on both sides (w, t_mat, h, v_new)
  const char* shape;   // as `linac list` shows it
  const char* what;
};
const std::vector<DeltaSavedTensor>& delta_saved_tensors();

/// The backward's default chunk for head dims K, V (`heads`: sequences x heads, 0 when unknown): 32, or
/// 16 where its kernels at 32 do not fit the call's GPU (kernels/common/fitting.h).
int delta_bwd_default_chunk(const OpOptions& opts, bool gated, int64_t K, int64_t V, int64_t heads = 0);

/// Tuning keys of the backward (the chunked form's chunk, bv, cv, ck, kwarps, kstages, warps; tokenwise).
TuningKeys delta_rule_bwd_tuning_keys();

/// The plan of `linac run delta_rule|gated_delta_rule ... --backward`: in chunks, or token by token with
/// --config tokenwise=1; with --l2norm-qk, q and k normalized around it.
OpPlan plan_delta_rule_bwd(bool gated, const TensorMap& inputs, const OpOptions& opts,
                           const std::vector<std::string>& wanted);
/// The chunked form's plan (inputs checked by the caller: beta, do and for the gated form g present).
OpPlan plan_delta_rule_chunked_bwd(bool gated, const TensorMap& inputs, const OpOptions& opts,
                                   const std::vector<std::string>& wanted);

/// The backward's representative kernels (chunked, then token by token) for dump/compile and test_ptxas.
std::vector<std::shared_ptr<ir::Kernel>> delta_rule_bwd_kernels(bool gated, const OpOptions& opts);
/// The chunked form's alone (head dim 64, plain and with every option).
std::vector<std::shared_ptr<ir::Kernel>> delta_chunked_bwd_kernels(bool gated, const OpOptions& opts);

}  // namespace linac
