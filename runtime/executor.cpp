#include "runtime/executor.h"

#include <fmt/format.h>

#include "compiler/interp/interp.h"
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

void run_on_gpu(OpPlan& plan) {
  // Compile (or fetch) every kernel before touching device memory, so a compile error leaves nothing.
  std::vector<std::shared_ptr<GpuKernel>> kernels;
  for (const auto& l : plan.launches) kernels.push_back(GpuKernel::get(*l.kernel));
  std::map<std::string, DeviceTensor> dev;
  for (auto& [name, t] : plan.tensors) {
    DeviceTensor d;
    d.dtype = t.dtype;
    d.shape = t.shape;
    // At least 16 bytes: kernels may read (masked) the first element of an empty tensor.
    d.buffer = cuda::DeviceBuffer(std::max<size_t>(t.data.size(), 16));
    if (!t.data.empty()) d.buffer.copy_from_host(t.data.data(), t.data.size());
    dev.emplace(name, std::move(d));
  }
  for (size_t i = 0; i < plan.launches.size(); ++i) {
    const auto& l = plan.launches[i];
    std::map<std::string, GpuArg> args;
    for (const auto& [param, tensor] : l.tensors) args[param] = &dev.at(tensor);
    for (const auto& [param, value] : l.scalars) args[param] = value;
    kernels[i]->launch(l.grid, args);
  }
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

TensorMap run_op(const OpDef& op, const TensorMap& inputs, const OpOptions& opts,
                 const std::vector<std::string>& wanted) {
  OpPlan plan = op.prepare(inputs, opts, wanted);
  return execute(plan, opts.device);
}

}  // namespace linac
