// A tile IR kernel made ready to launch on the GPU: compiled to PTX (compiler/nvptx), linked to a
// cubin by the driver, both kept in the disk cache, loaded once per process.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "compiler/nvptx/codegen.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_module.h"

namespace linac {

/// A contiguous, row-major tensor at a device address someone else owns: what a launch binds to a
/// tensor parameter. `shape` must outlive the launch call (not the kernel's run).
struct DeviceTensorRef {
  cuda::DevicePtr ptr = 0;
  DType dtype = DType::f32;
  std::span<const int64_t> shape;
};

/// A tensor in device memory that owns its buffer (contiguous, row-major).
struct DeviceTensor {
  cuda::DeviceBuffer buffer;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;

  DeviceTensorRef ref() const { return {buffer.ptr(), dtype, shape}; }
};

/// The value bound to one kernel parameter: a tensor or a scalar.
using GpuArg = std::variant<DeviceTensorRef, double>;

class GpuKernel {
 public:
  /// The kernel compiled for the current device, from the process's table, the disk cache, or a
  /// fresh compile (in that order). Thread-safe.
  static std::shared_ptr<GpuKernel> get(const ir::Kernel& k);

  /// Launches over `grid` (x, y, z), binding parameters by name; checks every argument against the
  /// parameter (kind, dtype, rank) first. Asynchronous on `stream`.
  void launch(const std::array<int64_t, 3>& grid, const std::map<std::string, GpuArg>& args,
              cuda::Stream stream = 0) const;
  /// The same with the arguments in the order of the kernel's parameters (ir::Kernel::params): the
  /// launch path of op calls, which resolve names once per plan.
  void launch(const std::array<int64_t, 3>& grid, std::span<const GpuArg> args, cuda::Stream stream = 0) const;

  /// The most 8-byte values a launch passes (a rank-4 tensor takes 9: address, 4 sizes, 4 strides).
  static constexpr size_t kMaxParamValues = 512;
  /// The most tensor maps a kernel takes (nvptx::TensorMapParamInfo).
  static constexpr size_t kMaxTensorMaps = 16;
  /// A tensor map a launch encodes for the kernel (nvptx::TensorMapParamInfo), from the tensor whose
  /// address is values[address_at]: encoded per launch, since the map holds the address.
  struct MapArg {
    size_t address_at = 0;
    int element_bytes = 2, rank = 0, swizzle_bytes = 0;
    std::array<int64_t, 5> shape{}, box{};
    bool usable = false;  // the driver could describe it (the kernel was told so: its flag is 1)
  };
  /// A launch's parameters as the kernel reads them: one 8-byte value per address, size, stride,
  /// scalar and tensor map flag, in order, then the tensor maps. `addresses` are the positions of the
  /// tensors' addresses, one per tensor argument.
  struct ParamValues {
    std::vector<uint64_t> values;
    std::vector<size_t> addresses;
    std::vector<MapArg> maps;
  };
  /// Checks `args` against the parameters (kind, dtype, rank) and encodes them; addresses are not
  /// checked (a plan encodes once with stand-in addresses and patches them per call).
  ParamValues encode(std::span<const GpuArg> args) const;
  /// Queues the kernel over `grid` with encoded parameter values (no checks: encode() made them), its
  /// tensor maps encoded from the addresses in `values`.
  void launch_values(const std::array<int64_t, 3>& grid, std::span<const uint64_t> values,
                     std::span<const MapArg> maps, cuda::Stream stream = 0, bool early = false) const;

  const nvptx::CompiledKernel& compiled() const { return compiled_; }
  const cuda::LinkedModule& module() const { return *module_; }
  /// Local-memory bytes the kernel uses for register spills (0 when it fits in registers).
  int64_t spill_bytes() const;
  /// Whether this process compiled it (false: from the disk cache).
  bool compiled_here() const { return compiled_here_; }

  /// Kernels compiled (not found in a cache) by this process so far.
  static int compile_count();

 private:
  nvptx::CompiledKernel compiled_;
  std::unique_ptr<cuda::LinkedModule> module_;
  bool compiled_here_ = false;
};

}  // namespace linac
