// The op "gla" (docs/ops/gla.md): its registry entry, and what its files share. op.cpp holds the
// registry entry and the forward's plans and defaults, op_bwd.cpp the backward's; the kernels they
// launch are in fwd.h, split_bwd.h, bwd.h and bwd_tokenwise.h (the math alone).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/config_schema.h"
#include "kernels/op.h"

namespace linac {

/// The op "gla" for the registry (--recurrent runs kernels/common/recurrent.h's token-by-token form).
OpDef gla_op();

/// Tuning keys of gla's backward (chunk, bk, bv, warps, iwarps, take, fuse, split, sbk, sbv, tokenwise).
TuningKeys gla_bwd_tuning_keys();

/// The plan of gla's backward. Inputs q k v g [initial_state] [cu_seqlens] do [dfinal_state];
/// outputs dq dk dv dg [dinitial_state]. In chunks, or token by token with --config tokenwise=1.
OpPlan plan_gla_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted);
/// The chunked form's plan (inputs checked by plan_gla_bwd).
OpPlan plan_gla_chunked_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted);

/// The backward's kernels at head dim 64 with every option, chunked then token by token (for the ptxas
/// check).
std::vector<std::shared_ptr<ir::Kernel>> gla_bwd_kernels(const OpOptions& opts);
/// The chunked form's alone (head dim 64, plain and with every option).
std::vector<std::shared_ptr<ir::Kernel>> gla_chunked_bwd_kernels(const OpOptions& opts);

}  // namespace linac
