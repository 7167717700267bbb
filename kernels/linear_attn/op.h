// The op "linear_attn" (docs/ops/linear_attn.md): its registry entry, and the plans that its files
// share. op.cpp holds the registry entry and the forward's plans and defaults, op_bwd.cpp the
// backward's; the kernels they launch are in fwd.h, normalized.h, bwd.h, split_bwd.h and
// normalized_bwd.h (the math alone).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/config_schema.h"
#include "kernels/common/op_support.h"
#include "kernels/op.h"

namespace linac {

/// The op "linear_attn" for the registry.
OpDef linear_attn_op();

/// Tuning keys of the backward (chunk, bk, bv, warps, split, sbk, sbv): its walks', the split
/// schedule's and the switch between them.
TuningKeys linear_attn_bwd_tuning_keys();

/// The plan of `linac run linear_attn --backward`.
OpPlan plan_linear_attn_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted);
/// Whether the plain backward of these sequences runs its split schedule (split_bwd.h): `--config split`,
/// else the default rule (few walks, plain form, 16-bit, dense, head dims up to 128).
bool linear_attn_bwd_takes_split(const SequenceLayout& seq, const OpOptions& opts, bool gated);

/// The same with the denominator folded in (LinearAttnBwdConfig::denominator): inputs also hold
/// den_do (dL/dD, [B,T,H,1]) and ones ([B,T,H,1]); dq, dk (and dg) are the sums of the numerator's and
/// the denominator's gradients, dv the numerator's. No states. For the normalized backward's plan.
OpPlan plan_linear_attn_bwd_with_denominator(const TensorMap& inputs, const OpOptions& opts,
                                             const std::vector<std::string>& wanted);

/// Representative backward kernels for dump/compile (opts.dtype, head dim 64; plain and gated).
std::vector<std::shared_ptr<ir::Kernel>> linear_attn_bwd_kernels(const OpOptions& opts);

/// The plan of the normalized backward (normalized_bwd.h). Inputs q k v [g] [cu_seqlens] do; outputs
/// dq dk dv [dg].
OpPlan plan_linear_attn_normalized_bwd(const TensorMap& inputs, const OpOptions& opts,
                                       const std::vector<std::string>& wanted);
/// Its own kernel (the prep) at head dim 64, for the ptxas check.
std::vector<std::shared_ptr<ir::Kernel>> linear_attn_normalized_bwd_kernels(const OpOptions& opts);

}  // namespace linac
