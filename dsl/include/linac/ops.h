// The library's ops on tensors the caller owns: the C++ door for engines and frameworks.
//
//   #include "linac/ops.h"
//   namespace ops = linac::ops;
//   ops::Tensors in = {{"q", ops::Tensor::cuda(q, linac::DType::bf16, {B, T, H, K})},
//                      {"k", ops::Tensor::cuda(k, linac::DType::bf16, {B, T, H, K})},
//                      {"v", ops::Tensor::cuda(v, linac::DType::bf16, {B, T, H, V})},
//                      {"g", ops::Tensor::cuda(g, linac::DType::f32, {B, T, H, K})}};
//   ops::Tensors out = {{"o", ops::Tensor::cuda(o, linac::DType::bf16, {B, T, H, V})}};
//   ops::run("gla", in, out, {}, my_stream);                  // queued on my_stream, returns at once
//   ops::Options bwd; bwd.backward = true;                   // gradients: inputs gain do, outputs dq, dk, ...
//
// Tensors are descriptions of memory (pointer, dtype, shape; contiguous, row-major): memory in the host
// runs the op on the CPU interpreter, CUDA memory runs it on the GPU, on the caller's stream, with scratch
// memory from the caller's allocator (default: linac's stream-ordered caching allocator). Inputs and
// outputs are bound to the op's arguments by name (`linac list` names them); the caller provides every
// output it wants (output_spec() gives its shape) and outputs it leaves out are not returned.
//
// The first call at a given op, options, dtypes and shapes prepares the call: it records the kernels,
// compiles them for the GPU (or loads them from the disk cache), looks up (or tunes, unless
// LINAC_AUTOTUNE=0) the configuration, and uploads the plan's constant tables. Later calls with the same
// key do no host synchronisation, no host<->device copy, no device allocation beyond the allocator's and no
// disk access: a CUDA graph can capture them. Exception: varlen calls key on the values of cu_seqlens,
// which are read to the host (a copy and a wait) unless the caller also passes them in host memory as
// "cu_seqlens_cpu".
//
// Every mistake (unknown op or argument, wrong dtype or shape, device mix, non-contiguous strides) is a
// linac::UserError with a message that says what to change. Thread-safe. Like dsl.h, this header
// includes no LLVM or compiler header.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "linac/dtype.h"
#include "linac/error.h"

namespace linac {
struct PreparedCall;  // runtime/op_call.cpp
}

namespace linac::ops {

/// Where a tensor's memory lives.
enum class Memory { host, cuda };

/// A tensor the caller owns. `strides` (in elements) may be left empty for a contiguous tensor; when
/// given they must be the contiguous ones (linac names the tensor otherwise).
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  Memory memory = Memory::host;
  int device = 0;  // CUDA device ordinal of cuda memory
  std::vector<int64_t> strides;

  static Tensor host(void* data, DType dtype, std::vector<int64_t> shape) {
    return {data, dtype, std::move(shape), Memory::host, 0, {}};
  }
  static Tensor cuda(void* data, DType dtype, std::vector<int64_t> shape, int device = 0) {
    return {data, dtype, std::move(shape), Memory::cuda, device, {}};
  }
  int64_t numel() const;
};

/// Tensors by argument name.
using Tensors = std::map<std::string, Tensor>;

/// A CUstream (nullptr: the legacy default stream).
using Stream = void*;

/// Scratch memory for GPU calls, stream-ordered: memory freed on a stream may be handed out again for
/// work queued later on that stream (as PyTorch's caching allocator does).
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// `bytes` of device memory usable by work on `stream`, aligned to at least 256 bytes.
  virtual void* allocate(std::size_t bytes, Stream stream) = 0;
  /// Returns memory once the work queued on `stream` so far is done with it.
  virtual void deallocate(void* p, std::size_t bytes, Stream stream) = 0;
};

/// linac's own allocator: keeps freed blocks per stream and size for reuse (never returns them to the
/// driver while the process runs). Thread-safe.
Allocator& default_allocator();

/// What an op call does besides its inputs: the CLI's switches and tuning parameters.
struct Options {
  bool backward = false;      // gradients: inputs gain do [, dfinal_state]; outputs dq, dk, dv, ...
  bool recurrent = false;     // the token-by-token (decode) form
  bool normalize = false;     // linear_attn: divide by scale*q.z + eps
  bool no_normalize = false;  // poly: the unnormalized kernel sum
  bool l2norm_qk = false;     // delta rules: L2-normalize q and k in the kernel
  std::optional<double> scale;            // default K^-1/2
  std::optional<double> a, b, c;          // poly: f(x) = a + b x + c x^2
  std::optional<double> noise_dropout;    // linear_attn, poly
  uint64_t seed = 0;                      // of the noise-dropout generator
  std::optional<int> chunk_size;          // rows per chunk; the op's (tuned) default when unset
  std::map<std::string, int64_t> config;  // tuning parameters (see `linac list`)

  /// Parses "key=value,..." (the C ABI's and Python's spelling): backward=1, recurrent=1, normalize=1,
  /// no_normalize=1, l2norm_qk=1, scale=S, a=, b=, c=, noise_dropout=P, seed=N, chunk_size=C; any
  /// other key=integer is a tuning parameter. UserError on malformed text.
  static Options parse(std::string_view text);
};

/// Runs `op` ("linear_attn", "gla", "delta_rule", "gated_delta_rule", "poly") on `inputs`, writing the
/// `outputs` the caller provides. GPU work is queued on `stream` and the call returns without waiting;
/// host tensors run on the CPU interpreter before the call returns. `allocator` null: default_allocator().
void run(std::string_view op, const Tensors& inputs, const Tensors& outputs, const Options& options = {},
         Stream stream = nullptr, Allocator* allocator = nullptr);

/// A call prepared once for an op, options, memory space, dtypes and shapes, then run on new addresses:
/// the leanest path, for an engine's loop or a binding that caches its calls (linac's Python package).
/// It skips what run() does per call (checking the tensors, building the call's key, finding it): run()
/// with the same tensors does the same work. Addresses must be in the memory space (and on the CUDA
/// device) the call was prepared for; each is checked only for null and alignment.
///
///   ops::Call call = ops::Call::prepare("gla", in, out);  // compiles, tunes, as run()'s first call
///   void* ins[] = {g, k, q, v};  // in call.input_names() order: the names sorted
///   void* outs[] = {o};
///   call.run(ins, outs, stream);
class Call {
 public:
  Call() = default;
  /// Prepares `op` for tensors like these (their data is not read). Varlen calls (cu_seqlens) cannot be
  /// prepared: their plan depends on the offsets' values; ops::run handles them.
  static Call prepare(std::string_view op, const Tensors& inputs, const Tensors& outputs, const Options& options = {});

  /// Queues the call on `stream` (host memory: runs on the CPU interpreter before returning) with the
  /// inputs' and outputs' addresses in the order of input_names() and output_names(). GPU scratch is
  /// `workspace` when given (workspace_bytes() bytes, 16-byte aligned, usable by work on `stream`),
  /// else from `allocator` (null: default_allocator()).
  void run(std::span<void* const> inputs, std::span<void* const> outputs, Stream stream = nullptr,
           Allocator* allocator = nullptr, void* workspace = nullptr) const;

  const std::vector<std::string>& input_names() const;
  const std::vector<std::string>& output_names() const;
  /// GPU scratch bytes a run needs (0 for host memory, whose scratch linac allocates itself).
  std::size_t workspace_bytes() const;
  Memory memory() const;
  /// Kernels one run launches (dtype conversions of inputs included).
  std::size_t kernel_launches() const;

 private:
  const PreparedCall& impl() const;
  std::shared_ptr<const PreparedCall> impl_;
};

/// The dtype and shape of one output of `op` for these inputs (their data is not read, except a
/// host cu_seqlens).
struct OutputSpec {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
};
OutputSpec output_spec(std::string_view op, const Tensors& inputs, std::string_view output,
                       const Options& options = {});

/// The names of the library's ops, in a stable order.
std::vector<std::string> op_names();

/// Calls prepared so far in this process (one per op, options, dtypes and shapes; tests and benchmarks
/// read it to see that a repeated call reused its preparation).
int64_t prepared_calls();

}  // namespace linac::ops
