// The public runtime API (dsl/include/linac/runtime.h) over the internal pieces: ir::print,
// nvptx::compile_kernel, interp::run, and GpuKernel with device buffers.
#include "linac/runtime.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <set>

#include "compiler/interp/interp.h"
#include "compiler/ir/ir.h"
#include "compiler/ir/printer.h"
#include "compiler/nvptx/codegen.h"
#include "kernels/common/host_tensor.h"
#include "runtime/cuda_driver.h"
#include "runtime/gpu_kernel.h"
#include "runtime/ptxas.h"

namespace linac::runtime {

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string param_list(const ir::Kernel& k) {
  std::vector<std::string> names;
  for (const auto& p : k.params) names.push_back(p.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

/// The argument of each parameter in parameter order, after checking the whole binding: the interpreter
/// and the GPU launcher check kinds/dtypes/ranks too, but only this layer knows the caller's names.
std::vector<const Arg*> bind(const ir::Kernel& k, const Args& args) {
  for (const auto& [name, arg] : args)
    if (!k.find_param(name))
      throw UserError(fmt::format("kernel '{}' has no parameter named '{}' (parameters: {})", k.name, name,
                                  param_list(k)));
  std::vector<const Arg*> bound;
  for (const auto& p : k.params) {
    auto it = args.find(p.name);
    const ir::Type& t = p.value->type;
    if (it == args.end())
      throw UserError(fmt::format("kernel '{}': no argument for parameter '{}' ({})", k.name, p.name, t.str()));
    const Arg& a = it->second;
    if (t.is_tensor()) {
      if (!a.is_tensor())
        throw UserError(fmt::format("kernel '{}': parameter '{}' is a tensor ({}), got the number {}", k.name,
                                    p.name, t.str(), a.scalar()));
      const TensorView& v = a.tensor();
      if (v.dtype != t.dtype)
        throw UserError(fmt::format("kernel '{}': parameter '{}' has dtype {}, the TensorView has {}", k.name,
                                    p.name, dtype_name(t.dtype), dtype_name(v.dtype)));
      if (static_cast<int>(v.shape.size()) != t.rank())
        throw UserError(fmt::format("kernel '{}': parameter '{}' has rank {}, the TensorView has shape {}", k.name,
                                    p.name, t.rank(), shape_str(v.shape)));
      for (int64_t d : v.shape)
        if (d < 0)
          throw UserError(fmt::format("kernel '{}': argument '{}' has a negative size in its shape {}", k.name,
                                      p.name, shape_str(v.shape)));
      if (v.data == nullptr && v.numel() > 0)
        throw UserError(fmt::format("kernel '{}': argument '{}' has no data (null pointer)", k.name, p.name));
    } else if (a.is_tensor()) {
      throw UserError(fmt::format("kernel '{}': parameter '{}' is a scalar ({}), got a tensor", k.name, p.name,
                                  t.str()));
    } else if (!std::isfinite(a.scalar()) && is_int(t.dtype)) {
      throw UserError(fmt::format("kernel '{}': parameter '{}' is {}, got {}", k.name, p.name, t.str(), a.scalar()));
    }
    bound.push_back(&a);
  }
  return bound;
}

void check_grid(const ir::Kernel& k, const Grid& g) {
  if (g.x < 0 || g.y < 0 || g.z < 0)
    throw UserError(fmt::format("kernel '{}': grid ({}, {}, {}) has a negative extent", k.name, g.x, g.y, g.z));
}

/// Tensor parameters the kernel stores to: the ones run() copies back from the GPU.
/// Why the driver is unusable, without the driver's hint, which names the CLI's flag: API users
/// choose the device in code.
std::string driver_reason(std::string why) {
  const std::string cli_hint = "; run with --device cpu";
  if (why.size() >= cli_hint.size() && why.compare(why.size() - cli_hint.size(), cli_hint.size(), cli_hint) == 0)
    why.erase(why.size() - cli_hint.size());
  return why;
}

void require_gpu() {
  std::string why;
  if (!cuda::driver_available(&why))
    throw UserError(fmt::format("a GPU was asked for but none is usable ({}); Device::cpu or Device::automatic "
                                "runs the kernel on the CPU interpreter",
                                driver_reason(why)));
}

void run_cpu(const ir::Kernel& k, Grid grid, const std::vector<const Arg*>& bound) {
  std::vector<interp::Arg> args;
  for (const Arg* a : bound) {
    if (a->is_tensor()) {
      const TensorView& v = a->tensor();
      args.emplace_back(interp::TensorArg{v.data, v.dtype, v.shape, contiguous_strides(v.shape)});
    } else {
      args.emplace_back(a->scalar());
    }
  }
  interp::run(k, interp::Grid{grid.x, grid.y, grid.z}, args);
}

/// The caller's tensors copied to the device, by parameter name.
struct DeviceArgs {
  std::vector<DeviceTensor> tensors;  // reserved up front: the args refer to them
  std::map<std::string, GpuArg> args;
};

DeviceArgs upload(const ir::Kernel& k, const std::vector<const Arg*>& bound) {
  DeviceArgs d;
  d.tensors.reserve(bound.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    const Arg& a = *bound[i];
    const std::string& name = k.params[i].name;
    if (!a.is_tensor()) {
      d.args[name] = a.scalar();
      continue;
    }
    const TensorView& v = a.tensor();
    DeviceTensor t;
    t.dtype = v.dtype;
    t.shape = v.shape;
    // At least 16 bytes: a kernel may read (masked) the first element of an empty tensor.
    t.buffer = cuda::DeviceBuffer(std::max<size_t>(static_cast<size_t>(v.bytes()), 16));
    if (v.bytes() > 0) t.buffer.copy_from_host(v.data, static_cast<size_t>(v.bytes()));
    d.tensors.push_back(std::move(t));
    d.args[name] = d.tensors.back().ref();
  }
  return d;
}

void run_gpu(const ir::Kernel& k, Grid grid, const std::vector<const Arg*>& bound) {
  require_gpu();
  // Compile (or fetch) before touching device memory, so a compile error leaves nothing behind.
  std::shared_ptr<GpuKernel> gk = GpuKernel::get(k);
  DeviceArgs d = upload(k, bound);
  gk->launch({grid.x, grid.y, grid.z}, d.args);
  cuda::synchronize();
  const std::set<std::string> stored = ir::stored_params(k);
  for (size_t i = 0; i < bound.size(); ++i) {
    if (!bound[i]->is_tensor() || !stored.count(k.params[i].name)) continue;
    const TensorView& v = bound[i]->tensor();
    if (v.bytes() > 0) cuda::copy_to_host(v.data, std::get<DeviceTensorRef>(d.args.at(k.params[i].name)).ptr, v.bytes());
  }
}

double get_element(const TensorView& v, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(v.data);
  switch (v.dtype) {
    case DType::i1: return p[i] != 0;
    case DType::i32: return reinterpret_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
    case DType::f16: return f16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::f32: return reinterpret_cast<const float*>(p)[i];
    case DType::f64: return reinterpret_cast<const double*>(p)[i];
  }
  throw InternalError("get_element: unknown dtype");
}

void set_element(const TensorView& v, int64_t i, double x) {
  auto* p = static_cast<uint8_t*>(v.data);
  switch (v.dtype) {
    case DType::i1: p[i] = x != 0; return;
    case DType::i32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(x); return;
    case DType::i64: reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(x); return;
    case DType::f16: reinterpret_cast<uint16_t*>(p)[i] = float_to_f16_bits(static_cast<float>(x)); return;
    case DType::bf16: reinterpret_cast<uint16_t*>(p)[i] = float_to_bf16_bits(static_cast<float>(x)); return;
    case DType::f32: reinterpret_cast<float*>(p)[i] = static_cast<float>(x); return;
    case DType::f64: reinterpret_cast<double*>(p)[i] = x; return;
  }
  throw InternalError("set_element: unknown dtype");
}

}  // namespace

Device parse_device(std::string_view name) {
  if (name == "auto") return Device::automatic;
  if (name == "cpu") return Device::cpu;
  if (name == "gpu" || name == "cuda") return Device::gpu;
  throw UserError(fmt::format("unknown device '{}' (expected auto, cpu or gpu)", name));
}

std::string_view device_name(Device d) {
  switch (d) {
    case Device::automatic: return "auto";
    case Device::cpu: return "cpu";
    case Device::gpu: return "gpu";
  }
  return "?";
}

bool gpu_available(std::string* why) {
  std::string reason;
  if (cuda::driver_available(&reason)) return true;
  if (why) *why = driver_reason(reason);
  return false;
}

Device resolve(Device d) {
  if (d != Device::automatic) return d;
  return gpu_available() ? Device::gpu : Device::cpu;
}

std::string gpu_summary() {
  require_gpu();
  return cuda::device_info().summary();
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorView::bytes() const { return numel() * dtype_bytes(dtype); }

void convert(const TensorView& src, const TensorView& dst) {
  const int64_t n = src.numel();
  if (n != dst.numel())
    throw UserError(fmt::format("convert: source {} has {} elements, destination {} has {}", shape_str(src.shape), n,
                                shape_str(dst.shape), dst.numel()));
  if (n > 0 && (src.data == nullptr || dst.data == nullptr)) throw UserError("convert: null data pointer");
  if (src.dtype == dst.dtype) {
    std::memmove(dst.data, src.data, static_cast<size_t>(src.bytes()));
    return;
  }
  for (int64_t i = 0; i < n; ++i) set_element(dst, i, get_element(src, i));
}

std::string print_ir(const ir::Kernel& k) { return ir::print(k); }

Arch parse_arch(std::string_view name) {
  if (name == "sm_80") return Arch::sm_80;
  if (name == "sm_90a" || name == "sm_90") return Arch::sm_90a;
  throw UserError(fmt::format("unknown GPU architecture '{}' (expected sm_80 or sm_90a)", name));
}

std::string_view arch_name(Arch a) { return a == Arch::sm_80 ? "sm_80" : "sm_90a"; }

Arch gpu_arch() {
  require_gpu();
  // The same rule GpuKernel::get uses to pick its target.
  return cuda::device_info().sm() >= 90 ? Arch::sm_90a : Arch::sm_80;
}

Compiled compile(const ir::Kernel& k, Arch arch) {
  nvptx::CompiledKernel c =
      nvptx::compile_kernel(k, nvptx::GpuTarget::for_sm(arch == Arch::sm_80 ? 80 : 90), nvptx::stage_override_from_env(k));
  Compiled out;
  out.entry = std::move(c.entry);
  out.tir = std::move(c.tir);
  out.layouts = std::move(c.tir_layouts);
  out.smem_plan = std::move(c.smem_plan);
  out.llvm_ir = std::move(c.llvm_ir);
  out.llvm_ir_opt = std::move(c.llvm_ir_opt);
  out.ptx = std::move(c.ptx);
  out.num_threads = c.num_threads;
  out.smem_bytes = c.smem_bytes;
  if (auto r = ptxas_resources(out.ptx, arch == Arch::sm_80 ? "sm_80" : "sm_90a", out.entry)) {
    out.registers = r->registers;
    out.spill_store_bytes = r->spill_store_bytes;
    out.spill_load_bytes = r->spill_load_bytes;
    out.stack_bytes = r->stack_frame_bytes;
  }
  return out;
}

Device run(const ir::Kernel& k, Grid grid, const Args& args, Device device) {
  std::vector<const Arg*> bound = bind(k, args);
  check_grid(k, grid);
  Device where = resolve(device);
  if (where == Device::cpu)
    run_cpu(k, grid, bound);
  else
    run_gpu(k, grid, bound);
  return where;
}

Timing time_on_gpu(const ir::Kernel& k, Grid grid, const Args& args, int runs, int warmup) {
  std::vector<const Arg*> bound = bind(k, args);
  check_grid(k, grid);
  if (runs < 1) throw UserError(fmt::format("time_on_gpu: runs must be at least 1, got {}", runs));
  if (warmup < 0) throw UserError(fmt::format("time_on_gpu: warmup must not be negative, got {}", warmup));
  require_gpu();
  std::shared_ptr<GpuKernel> gk = GpuKernel::get(k);
  DeviceArgs d = upload(k, bound);
  const std::array<int64_t, 3> g = {grid.x, grid.y, grid.z};
  for (int i = 0; i < warmup; ++i) gk->launch(g, d.args);
  cuda::synchronize();
  std::vector<double> times;
  cuda::EventTimer timer;
  for (int i = 0; i < runs; ++i) {
    timer.start();
    gk->launch(g, d.args);
    timer.stop();
    times.push_back(timer.elapsed_ms());
  }
  cuda::synchronize();  // surfaces a fault in the last launch here rather than in a later call
  std::sort(times.begin(), times.end());
  return Timing{times[times.size() / 2], times.front(), runs};
}

}  // namespace linac::runtime
