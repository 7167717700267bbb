// Runs an OpPlan on a device: the CPU interpreter, or the GPU (upload, launch, download).
#pragma once
#include "kernels/op.h"

namespace linac {

/// Executes every launch of `plan` in order on `device`; returns the plan's outputs by output name.
/// Output tensors are poisoned (all bytes 0xFF: NaN for floats) before the run, so an element a
/// kernel fails to write cannot pass for a result.
TensorMap execute(OpPlan& plan, Device device);

/// Compiles (or fetches from the caches) every kernel of the plan for the GPU.
void prepare_kernels_on_gpu(const OpPlan& plan);

/// Timing of a plan's launches on the GPU.
struct BenchResult {
  double median_ms = 0, min_ms = 0;
  int iters = 0;
  int rotations = 1;      // independent copies of the tensors cycled through so L2 holds none of them
  /// Every tensor of the plan once: the inputs in the kernel dtype, the outputs and the op's scratch
  /// (e.g. poly's state2), each of which a run reads or writes at least once.
  int64_t bytes = 0;
  /// Per launch of the plan (in order): its kernel's name and the median of its own CUDA-event
  /// intervals (a second pass that times each launch alone; their sum can exceed median_ms slightly).
  std::vector<std::pair<std::string, double>> launch_ms;
};

/// Times `plan` on the GPU with CUDA events: warm-up, then `iters` runs (each run = all launches),
/// cycling through enough copies of the tensors to exceed twice the L2 cache; median and minimum.
/// With `per_launch`, a second pass times each launch alone (BenchResult::launch_ms): for `linac bench`,
/// not for the tuner, which needs only the total. With `budget_ms` > 0 (the tuner), one warm-up run
/// instead of three, and at most as many runs (at least 3) as fit in budget_ms at the warm-up's time:
/// a candidate of poly at 50 ms per run then costs 5 runs instead of 13.
BenchResult bench_on_gpu(OpPlan& plan, int iters, bool per_launch = false, double budget_ms = 0);

}  // namespace linac
