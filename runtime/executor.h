// Runs an OpPlan on a device: the CPU interpreter, or the GPU (upload, launch, download).
#pragma once
#include "kernels/op.h"

namespace linac {

/// Executes every launch of `plan` in order on `device`; returns the plan's outputs by output name.
/// Output tensors are poisoned (all bytes 0xFF: NaN for floats) before the run, so an element a
/// kernel fails to write cannot pass for a result.
TensorMap execute(OpPlan& plan, Device device);

}  // namespace linac
