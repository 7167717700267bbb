// Runs an OpPlan's launches on memory: the one place where a plan meets the CPU interpreter or the GPU.
// Op calls on caller-owned tensors (runtime/op_call.h) and runs on plan-owned tensors (execute(), the
// tuner and `linac bench`) both resolve their plan once (ResolvedPlan) and then run it on pointers.
#pragma once
#include <span>
#include <variant>

#include "kernels/op.h"
#include "runtime/cuda_driver.h"
#include "runtime/gpu_kernel.h"

namespace linac {

/// A plan's launches with parameter names resolved: each argument is a tensor (an index into the
/// memory the run is given, with the shape the kernel sees) or a scalar.
struct ResolvedPlan {
  struct TensorParam {
    int slot = 0;  // index into the pointers given to run_on_cpu / launch_on_gpu
    DType dtype = DType::f32;
    std::vector<int64_t> shape;
  };
  using Param = std::variant<TensorParam, double>;
  struct Launch {
    std::shared_ptr<ir::Kernel> kernel;
    std::shared_ptr<GpuKernel> gpu;  // set by prepare_gpu()
    std::array<int64_t, 3> grid = {1, 1, 1};
    std::vector<Param> params;  // in the kernel's parameter order
    // Set by prepare_gpu(): the encoded parameter values (sizes, strides, scalars; addresses zero) and,
    // per tensor parameter, where its address goes and the slot it comes from. A call copies the values
    // and patches the addresses: no per-call checks or encoding.
    std::vector<uint64_t> values;
    std::vector<std::pair<size_t, int>> address_slots;
    std::vector<GpuKernel::MapArg> maps;  // encoded per call from the patched addresses
    int overlaps = 0;                     // KernelLaunch::overlaps
  };
  std::vector<Launch> launches;
  /// OpPlan::cleared: (slot, bytes) of each tensor zeroed at the start of every run.
  std::vector<std::pair<int, int64_t>> cleared;

  /// Compiles (or fetches from the caches) every kernel for the GPU; a compile error leaves the plan
  /// without GPU kernels.
  void prepare_gpu();
};

/// Resolves `plan`, whose tensor `name` is slot slot_of.at(name).
ResolvedPlan resolve_plan(const OpPlan& plan, const std::map<std::string, int>& slot_of);

/// Runs every launch in order on the CPU interpreter; slots[i] is the host address of slot i.
void run_on_cpu(const ResolvedPlan& plan, std::span<void* const> slots);
/// Queues every launch in order on `stream`, but a launch that overlaps its producers before them, which
/// start early beside it (programmatic dependent launch); slots[i] is the device address of slot i.
void launch_on_gpu(const ResolvedPlan& plan, std::span<const cuda::DevicePtr> slots, cuda::Stream stream);

/// Executes every launch of `plan` in order on `device`, on copies of its tensors that it owns (uploaded
/// for the GPU); returns the plan's outputs by output name. Output tensors are poisoned (all bytes 0xFF:
/// NaN for floats) before the run, so an element a kernel fails to write cannot pass for a result.
/// For the tuner and tests; callers with their own memory use linac/ops.h.
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
