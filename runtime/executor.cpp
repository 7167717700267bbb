#include "runtime/executor.h"

#include <algorithm>
#include <fmt/format.h>

#include "compiler/interp/interp.h"
#include "runtime/autotune.h"
#include "runtime/gpu_kernel.h"

namespace linac {

std::vector<std::string> OpPlan::output_tensors() const {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : outputs) out.push_back(tensor);
  return out;
}

namespace {

void run_on_cpu(OpPlan& plan) {
  for (const auto& l : plan.launches) {
    std::vector<interp::Arg> args;
    for (const auto& p : l.kernel->params) {
      if (auto it = l.tensors.find(p.name); it != l.tensors.end()) {
        HostTensor& t = plan.tensors.at(it->second);
        args.emplace_back(interp::TensorArg{t.data.data(), t.dtype, t.shape, t.strides()});
      } else if (auto s = l.scalars.find(p.name); s != l.scalars.end()) {
        args.emplace_back(s->second);
      } else {
        throw InternalError(fmt::format("launch of {} has no argument for {}", l.kernel->name, p.name));
      }
    }
    interp::run(*l.kernel, interp::Grid{l.grid[0], l.grid[1], l.grid[2]}, args);
  }
}

using DeviceTensors = std::map<std::string, DeviceTensor>;

DeviceTensors upload(const OpPlan& plan) {
  DeviceTensors dev;
  for (const auto& [name, t] : plan.tensors) {
    DeviceTensor d;
    d.dtype = t.dtype;
    d.shape = t.shape;
    // At least 16 bytes: kernels may read (masked) the first element of an empty tensor.
    d.buffer = cuda::DeviceBuffer(std::max<size_t>(t.data.size(), 16));
    if (!t.data.empty()) d.buffer.copy_from_host(t.data.data(), t.data.size());
    dev.emplace(name, std::move(d));
  }
  return dev;
}

void launch_one(const KernelLaunch& l, GpuKernel& kernel, const DeviceTensors& dev) {
  std::map<std::string, GpuArg> args;
  for (const auto& [param, tensor] : l.tensors) args[param] = &dev.at(tensor);
  for (const auto& [param, value] : l.scalars) args[param] = value;
  kernel.launch(l.grid, args);
}

void launch_all(const OpPlan& plan, const std::vector<std::shared_ptr<GpuKernel>>& kernels, const DeviceTensors& dev) {
  for (size_t i = 0; i < plan.launches.size(); ++i) launch_one(plan.launches[i], *kernels[i], dev);
}

std::vector<std::shared_ptr<GpuKernel>> get_kernels(const OpPlan& plan) {
  // Compile (or fetch) every kernel before touching device memory, so a compile error leaves nothing.
  std::vector<std::shared_ptr<GpuKernel>> kernels;
  for (const auto& l : plan.launches) kernels.push_back(GpuKernel::get(*l.kernel));
  return kernels;
}

void run_on_gpu(OpPlan& plan) {
  auto kernels = get_kernels(plan);
  DeviceTensors dev = upload(plan);
  launch_all(plan, kernels, dev);
  cuda::synchronize();
  for (const auto& name : plan.output_tensors()) {
    HostTensor& t = plan.tensors.at(name);
    if (!t.data.empty()) dev.at(name).buffer.copy_to_host(t.data.data(), t.data.size());
  }
}

}  // namespace

TensorMap execute(OpPlan& plan, Device device) {
  for (const auto& name : plan.output_tensors()) plan.tensors.at(name).fill_bytes(0xFF);
  if (device == Device::cpu)
    run_on_cpu(plan);
  else
    run_on_gpu(plan);
  TensorMap out;
  for (const auto& [output, tensor] : plan.outputs) out[output] = plan.tensors.at(tensor);
  return out;
}

void prepare_kernels_on_gpu(const OpPlan& plan) { get_kernels(plan); }

BenchResult bench_on_gpu(OpPlan& plan, int iters, bool per_launch, double budget_ms) {
  auto kernels = get_kernels(plan);
  BenchResult r;
  for (const auto& [name, t] : plan.tensors) r.bytes += static_cast<int64_t>(t.data.size());
  const int64_t l2 = cuda::device_info().l2_bytes;
  r.rotations = static_cast<int>(std::clamp<int64_t>((2 * l2 + r.bytes - 1) / std::max<int64_t>(r.bytes, 1), 1, 8));
  std::vector<DeviceTensors> sets;
  for (int i = 0; i < r.rotations; ++i) sets.push_back(upload(plan));
  cuda::EventTimer timer;
  if (budget_ms > 0) {
    timer.start();
    launch_all(plan, kernels, sets[0]);
    timer.stop();
    const double first_ms = std::max<double>(timer.elapsed_ms(), 1e-3);
    iters = std::clamp(static_cast<int>(budget_ms / first_ms), std::min(iters, 3), iters);
  } else {
    for (int i = 0; i < 3; ++i) launch_all(plan, kernels, sets[i % sets.size()]);
  }
  cuda::synchronize();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    timer.start();
    launch_all(plan, kernels, sets[i % sets.size()]);
    timer.stop();
    times.push_back(timer.elapsed_ms());
  }
  std::sort(times.begin(), times.end());
  r.iters = iters;
  r.median_ms = times[times.size() / 2];
  r.min_ms = times.front();
  if (per_launch && plan.launches.size() > 1) {
    std::vector<std::vector<double>> per(plan.launches.size());
    for (int i = 0; i < iters; ++i) {
      for (size_t j = 0; j < plan.launches.size(); ++j) {
        timer.start();
        launch_one(plan.launches[j], *kernels[j], sets[i % sets.size()]);
        timer.stop();
        per[j].push_back(timer.elapsed_ms());
      }
    }
    for (size_t j = 0; j < per.size(); ++j) {
      std::sort(per[j].begin(), per[j].end());
      r.launch_ms.emplace_back(plan.launches[j].kernel->name, per[j][per[j].size() / 2]);
    }
  }
  return r;
}

TensorMap run_op(const OpDef& op, const TensorMap& inputs, const OpOptions& opts,
                 const std::vector<std::string>& wanted) {
  check_op_options(op, opts);
  OpOptions o = opts;
  // On the GPU, a run without an explicit configuration uses the tuned one (tuning on first use).
  if (o.device == Device::cuda) o.config = autotuned_config(op, inputs, o);
  OpPlan plan = op.prepare(inputs, o, wanted);
  return execute(plan, o.device);
}

}  // namespace linac
