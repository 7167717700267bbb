// The plan of the token-by-token form (recurrent.h) for the ops that run it under --recurrent
// (linear_attn, gla): input checks, defaults and the one launch.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/config_schema.h"
#include "kernels/common/recurrent.h"
#include "kernels/op.h"

namespace linac {

/// prepare() of `op` under --recurrent. The op's g, when given, has the shape `gate` implies
/// (RecurrentGate::none: the op takes no g); `gate_required` makes g mandatory. `config_keys` are
/// the op's tuning keys (all accepted; bv and warps apply here).
OpPlan plan_recurrent(const std::string& op, RecurrentGate gate, bool gate_required, const TuningKeys& config_keys,
                      const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted);

/// The recurrent kernel for K = V = 64 with the given gate, initial and final state, at opts.dtype and
/// opts.config (for OpDef::kernels).
std::vector<std::shared_ptr<ir::Kernel>> recurrent_kernels(const OpOptions& opts, RecurrentGate gate);

}  // namespace linac
