// The public runtime API: compile and run a kernel you recorded with the DSL (linac/dsl.h).
//
//   #include "linac/dsl.h"
//   #include "linac/runtime.h"
//   std::shared_ptr<linac::ir::Kernel> k = build_my_kernel(/*chunk=*/64);   // KernelBuilder::finish()
//   namespace rt = linac::runtime;
//   fmt::print("{}", rt::print_ir(*k));                                   // the tile IR
//   std::string ptx = rt::compile(*k, rt::Arch::sm_90a).ptx;               // needs no GPU
//   std::vector<float> x(rows * 128), o(rows * 128);
//   rt::Args args = {{"x", rt::TensorView::of(x.data(), {rows, 128})},
//                    {"o", rt::TensorView::of(o.data(), {rows, 128})},
//                    {"s", 2.0}};
//   rt::Device ran = rt::run(*k, {rows, 1, 1}, args);             // GPU if usable, else the CPU
//   rt::Timing t = rt::time_on_gpu(*k, {rows, 1, 1}, args, 20);   // median ms of 20 runs
//
// Arguments are host arrays the caller owns (TensorView: pointer, dtype, shape; contiguous, row-major)
// bound to the kernel's parameters by name. run() reads them, runs the kernel over the grid on the
// CPU interpreter or on the GPU (copy in, launch, copy back the tensors the kernel stores to) and
// leaves the results in the caller's arrays. Every mistake (unknown or missing parameter, wrong
// dtype/rank, null data, no GPU) is a linac::UserError with a message that says what to change.
//
// Like dsl.h, this header includes no LLVM or compiler header: user code compiles in about a second.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "linac/dtype.h"
#include "linac/error.h"

namespace linac::ir {
struct Kernel;
}

namespace linac::runtime {

/// Where run() executes a kernel. `automatic` is the GPU when a CUDA driver and device are usable,
/// else the CPU interpreter.
enum class Device { automatic, cpu, gpu };

/// "auto", "cpu" or "gpu" ("cuda" is accepted for gpu), for command-line flags; UserError otherwise.
Device parse_device(std::string_view name);
/// "auto", "cpu" or "gpu".
std::string_view device_name(Device d);

/// True when a CUDA driver loads and a device can be used; otherwise false with the reason in *why.
/// Never throws. The first call initializes the driver (a moment, and some GPU memory).
bool gpu_available(std::string* why = nullptr);
/// The device `d` resolves to: cpu or gpu (automatic asks gpu_available()). Never automatic.
Device resolve(Device d);
/// One line describing the GPU ("NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"); UserError when
/// there is no usable GPU.
std::string gpu_summary();

/// A contiguous, row-major array in host memory owned by the caller, bound to a tensor parameter.
/// For bf16/f16 data hold the raw 16-bit patterns (see convert()).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;

  /// A view of `p` with the given shape; the dtype follows the pointer type (float -> f32,
  /// double -> f64, int32_t -> i32, int64_t -> i64). For bf16/f16 use the constructor with a dtype.
  static TensorView of(float* p, std::vector<int64_t> shape) { return {p, DType::f32, std::move(shape)}; }
  static TensorView of(double* p, std::vector<int64_t> shape) { return {p, DType::f64, std::move(shape)}; }
  static TensorView of(int32_t* p, std::vector<int64_t> shape) { return {p, DType::i32, std::move(shape)}; }
  static TensorView of(int64_t* p, std::vector<int64_t> shape) { return {p, DType::i64, std::move(shape)}; }

  /// Number of elements (the product of the shape; 1 for rank 0).
  int64_t numel() const;
  /// Size of the data in bytes.
  int64_t bytes() const;
};

/// Converts every element of `src` into `dst` (same number of elements, any float or int dtypes;
/// float -> bf16/f16 rounds to nearest even). The usual way to make bf16 inputs from float arrays
/// and to read bf16 outputs back. UserError when the element counts differ.
void convert(const TensorView& src, const TensorView& dst);

// ---- Checking a kernel against a reference on the host ---------------------------------------------
// The pattern of docs/dsl-guide.md ("Testing a kernel against a reference"): random inputs, rounded to
// the kernel's dtype before the reference in double sees them, poisoned outputs, the largest error
// relative to the largest reference value.
//
//   std::vector<float> qf = rt::random_uniform(B * T * H * K, /*seed=*/1);
//   rt::HostArray q(qf, DType::bf16, {B, T, H, K});       // qf now holds the bf16 values q holds
//   rt::HostArray o(DType::bf16, {B, T, H, V});           // an output, poisoned
//   rt::run(*kernel, grid, {{"q", q.view()}, ..., {"o", o.view()}});
//   double err = rt::max_relative_error(o.to_floats(), reference(qf, ...));

/// `x` rounded to `dtype` in place, to nearest even (bf16, f16; f32 leaves it as it is): the values a
/// kernel reading `dtype` sees, so that a reference computed from `x` measures the kernel and not the
/// inputs' rounding. UserError for a dtype that is not a float.
void round_to(std::vector<float>& x, DType dtype);

/// n floats uniform in [lo, hi), a function of (seed, n, lo, hi) alone: the same numbers on every
/// platform and standard library (std::uniform_real_distribution's are not), so that a failure seen
/// once can be rerun. One seed per input keeps each input fixed when another changes size.
std::vector<float> random_uniform(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

/// A host array in a kernel's dtype (raw 16-bit patterns for bf16/f16; see convert()), for run()'s
/// arguments. view() binds it; it owns its bytes, so it moves but does not copy.
class HostArray {
 public:
  /// From floats: `x` is rounded to `dtype` in place (round_to) and the array holds those values, so
  /// that a reference computed from `x` sees exactly what the kernel reads. UserError when the shape's
  /// element count is not x.size().
  HostArray(std::vector<float>& x, DType dtype, std::vector<int64_t> shape);
  /// An output of `shape` in `dtype`, poisoned (poison()).
  HostArray(DType dtype, std::vector<int64_t> shape);
  HostArray(HostArray&&) = default;
  HostArray& operator=(HostArray&&) = default;
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;

  const TensorView& view() const { return view_; }
  /// Every byte 0xFF: NaN in every float dtype, so that an element a kernel never writes fails a check
  /// instead of passing with a value from an earlier run. Call it before each run of an output.
  void poison();
  /// The elements as floats (16-bit values widened exactly).
  std::vector<float> to_floats() const;

 private:
  std::vector<uint8_t> bytes_;
  TensorView view_;
};

/// max |x - ref| / max |ref| over all elements, a NaN in x counting as infinitely wrong: one number per
/// run that does not let a bad element hide in an average. UserError when the sizes differ.
double max_relative_error(const std::vector<float>& x, const std::vector<double>& ref);

/// A value bound to one kernel parameter: a tensor view or a number (for a scalar parameter; it is
/// converted to the parameter's dtype, e.g. rounded to f32). A default-constructed Arg is the number 0,
/// so `args["q"] = view;` works.
class Arg {
 public:
  Arg() = default;
  Arg(TensorView t) : tensor_(std::move(t)), is_tensor_(true) {}
  /// Any C++ number (int, int64_t, size_t, float, double, ...).
  template <class T>
    requires std::is_arithmetic_v<T>
  Arg(T x) : scalar_(static_cast<double>(x)) {}

  bool is_tensor() const { return is_tensor_; }
  const TensorView& tensor() const { return tensor_; }
  double scalar() const { return scalar_; }

 private:
  TensorView tensor_;
  double scalar_ = 0;
  bool is_tensor_ = false;
};

/// Arguments by parameter name: every parameter of the kernel exactly once.
using Args = std::map<std::string, Arg>;

/// The grid of programs: program_id(0) runs over [0, x), program_id(1) over [0, y), ...
struct Grid {
  int64_t x = 1, y = 1, z = 1;
};

/// The kernel's tile IR in its canonical text form. Save it as FILE.tir to feed the CLI
/// (`linac compile FILE.tir --emit ptx`) or to diff two versions of a kernel.
std::string print_ir(const ir::Kernel& k);

/// GPU architectures the backend emits PTX for.
enum class Arch { sm_80, sm_90a };

/// "sm_80" or "sm_90a" (also "sm_90") -> Arch; UserError otherwise.
Arch parse_arch(std::string_view name);
/// "sm_80" or "sm_90a".
std::string_view arch_name(Arch a);
/// The architecture run() compiles for on this machine's GPU (sm_90a from Hopper on, else sm_80);
/// UserError when there is no usable GPU.
Arch gpu_arch();

/// Every stage of one kernel compiled for a GPU architecture (what `linac compile --emit` prints).
struct Compiled {
  std::string entry;        // the PTX entry point's name
  std::string tir;          // tile IR as recorded
  std::string layouts;      // tile IR with the register layout of every value
  std::string smem_plan;    // the shared-memory plan
  std::string llvm_ir;      // LLVM IR before optimization
  std::string llvm_ir_opt;  // LLVM IR after O3
  std::string ptx;          // PTX, with .loc lines pointing at the DSL source
  int num_threads = 0;      // threads per program (num_warps * 32)
  int64_t smem_bytes = 0;   // dynamic shared memory per program
  /// ptxas's report of the PTX (`ptxas -v`; filled when ptxas is installed: $PTXAS, PATH or
  /// /usr/local/cuda/bin; empty otherwise): registers per thread, spill stores and loads and the stack
  /// frame in bytes. A kernel that spills runs slower: try fewer rows per program or more warps.
  std::optional<int> registers;
  std::optional<int64_t> spill_store_bytes, spill_load_bytes, stack_bytes;
};

/// Compiles `k` to PTX for `arch` (and runs ptxas on it when installed: Compiled::registers). Needs no GPU. UserError for a program the backend cannot lower
/// (the message starts with the DSL file:line). Honors LINAC_OVERRIDE_DIR as run() does (a stage read
/// from a file; see docs/dsl-guide.md).
Compiled compile(const ir::Kernel& k, Arch arch = Arch::sm_90a);

/// Runs `k` over `grid` on `device` with `args`; returns the device it ran on (cpu or gpu). The
/// arguments are checked against the kernel's parameters first (names, tensor or scalar, dtype,
/// rank, non-null data). Tensors the kernel stores to are written back into the caller's arrays;
/// the others are only read. On the GPU the kernel is compiled for the device on first use (kept in
/// memory and in the disk cache) and the call returns when the results are on the host.
/// UserError when the GPU was asked for and there is none.
Device run(const ir::Kernel& k, Grid grid, const Args& args, Device device = Device::automatic);

/// Timing of a kernel on the GPU.
struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  int runs = 0;
};

/// Times `k` on the GPU: copies the arguments to the device once, launches `warmup` times, then
/// `runs` launches each timed with CUDA events; reports the median and the minimum. The caller's
/// arrays are not written. Tensors stay on the device between launches, so small inputs may sit in
/// the L2 cache. UserError when there is no usable GPU or the arguments are wrong.
Timing time_on_gpu(const ir::Kernel& k, Grid grid, const Args& args, int runs = 20, int warmup = 3);

}  // namespace linac::runtime
