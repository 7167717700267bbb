// Kernels on the GPU: PTX -> cubin through the driver's linker (cuLinkCreate / cuLinkAddData /
// cuLinkComplete), cubin -> loaded module and function, and what ptxas and the driver report about
// the result (registers, spills, shared memory). Needs the driver of runtime/cuda_driver.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/cuda_driver.h"

namespace linac::cuda {

/// What ptxas reported about one function in a verbose log. A field is empty when the log had no
/// line for it.
struct PtxasFunctionStats {
  std::string name;
  std::optional<int> registers;
  std::optional<std::int64_t> stack_frame_bytes;
  std::optional<std::int64_t> spill_store_bytes;
  std::optional<std::int64_t> spill_load_bytes;
  /// "N bytes lmem" from the driver linker's own summary, which it prints even when the ptxas
  /// lines are missing because the link came from the driver's JIT cache.
  std::optional<std::int64_t> local_bytes;
};

/// Parses a ptxas-style verbose log (the driver linker's CU_JIT_LOG_VERBOSE info log, nvJitLink's,
/// or `ptxas -v` output), one entry per function in order of first mention, e.g. from
///   ptxas info    : Function properties for k
///       8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
///   ptxas info    : Used 255 registers, 360 bytes cmem[0]
///   info    : Function properties for 'k':
///   info    : used 255 registers, used 1 barriers, 8 stack, 0 bytes smem, 536 bytes cmem[0], 8 bytes lmem
/// Lines it does not know are skipped; a log without such lines gives an empty vector.
std::vector<PtxasFunctionStats> parse_ptxas_info_log(std::string_view log);

/// A function's resources as the driver reports them (cuFuncGetAttribute).
struct KernelAttributes {
  int num_regs = 0;
  /// Local memory per thread: register spills plus stack arrays. Non-zero in a hot kernel is
  /// usually a performance bug.
  int local_bytes = 0;
  int static_shared_bytes = 0;
  int const_bytes = 0;
  /// The most threads per block this function can be launched with (registers permitting).
  int max_threads_per_block = 0;
  /// PTX ISA version the function was compiled from, times 10 (80 for PTX 8.0).
  int ptx_version = 0;
  /// SASS version of the binary, times 10 (90 for sm_90).
  int binary_version = 0;
};

/// Reads the attributes of a loaded function.
KernelAttributes function_attributes(Function f);

/// PTX compiled and linked for the current device, with the linker's logs.
struct CubinResult {
  std::vector<std::uint8_t> cubin;
  std::string info_log;   // verbose: per-function registers, stack, spills
  std::string error_log;  // warnings when the link succeeded
};

/// Compiles PTX for the current device without loading it (opt_level is ptxas's -O, 0 to 4). A
/// rejected PTX is a UserError carrying the linker's error log: the PTX may be the user's own,
/// fed back in place of linac's. `what` names the PTX in messages.
CubinResult compile_ptx(const std::string& ptx, int opt_level = 3, std::string_view what = "kernel");

class LinkedModule;

/// compile_ptx then load_cubin: the PTX's entry `kernel_name`, ready to launch.
LinkedModule link_ptx(const std::string& ptx, const std::string& kernel_name, int opt_level = 3);

/// The PTX compiled and loaded by the driver's JIT as a whole program (cuModuleLoadDataEx), for kernels
/// the linker's separate compilation would compile worse: it ignores setmaxnreg (C7504, "to maintain
/// compatibility across compilation units"; producer warps). No cubin comes back (cubin() is empty):
/// the driver's own JIT cache (~/.nv/ComputeCache) keeps the result between processes.
LinkedModule jit_ptx(const std::string& ptx, const std::string& kernel_name, int opt_level = 3);

/// Loads a cubin (e.g. from the kernel cache) and finds its entry `kernel_name`. `info_log` is the
/// log saved with the cubin, if any, so spill counts survive the cache. A cubin the device cannot
/// load (built for another GPU, truncated) is a UserError; a missing entry is an InternalError.
LinkedModule load_cubin(std::vector<std::uint8_t> cubin, const std::string& kernel_name, std::string info_log = {});

/// A loaded module holding one kernel, with what is known about how it was built: the cubin (for
/// the kernel cache), the linker's info log, the function's attributes and, when the log has them,
/// ptxas's spill counts. Move-only; unloads the module when destroyed.
class LinkedModule {
 public:
  LinkedModule() = default;
  ~LinkedModule();
  LinkedModule(LinkedModule&& other) noexcept;
  LinkedModule& operator=(LinkedModule&& other) noexcept;
  LinkedModule(const LinkedModule&) = delete;
  LinkedModule& operator=(const LinkedModule&) = delete;

  Function function() const { return function_; }
  const std::string& kernel_name() const { return kernel_name_; }
  const std::vector<std::uint8_t>& cubin() const { return cubin_; }
  const std::string& info_log() const { return info_log_; }
  const std::string& error_log() const { return error_log_; }
  const KernelAttributes& attributes() const { return attributes_; }
  int num_regs() const { return attributes_.num_regs; }
  /// Bytes ptxas spilled to and reloaded from local memory in this kernel, from the info log.
  /// Empty when the log does not say: a module loaded from a cubin without its log, or a link the
  /// driver answered from its JIT cache (~/.nv/ComputeCache; CUDA_CACHE_DISABLE=1 turns it off).
  /// attributes().local_bytes is always known.
  std::optional<std::int64_t> spill_store_bytes() const { return spill_store_bytes_; }
  std::optional<std::int64_t> spill_load_bytes() const { return spill_load_bytes_; }

 private:
  friend LinkedModule load_cubin(std::vector<std::uint8_t> cubin, const std::string& kernel_name, std::string info_log);
  friend LinkedModule link_ptx(const std::string& ptx, const std::string& kernel_name, int opt_level);
  friend LinkedModule jit_ptx(const std::string& ptx, const std::string& kernel_name, int opt_level);
  /// Takes ownership of a loaded module and finds its entry, with what the log says of it.
  static LinkedModule adopt(void* module, const std::string& kernel_name, std::string info_log);
  void release() noexcept;

  std::uintptr_t module_ = 0;  // CUmodule
  Function function_ = Function::none;
  std::string kernel_name_;
  std::vector<std::uint8_t> cubin_;
  std::string info_log_;
  std::string error_log_;
  KernelAttributes attributes_;
  std::optional<std::int64_t> spill_store_bytes_;
  std::optional<std::int64_t> spill_load_bytes_;
};

}  // namespace linac::cuda
