// Ops: what users run. An op checks its named inputs, builds (or reuses) its DSL kernels for the
// configuration at hand, launches them on a device and returns named outputs. The CLI, the tests and
// the benchmark all go through this one interface.
#pragma once
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/common/host_tensor.h"

namespace linac::ir {
struct Kernel;
}

namespace linac {

enum class Device { cpu, cuda };

/// Options common to every op; fields an op does not use are ignored by it.
struct OpOptions {
  Device device = Device::cpu;
  DType dtype = DType::f32;           // precision the inputs are cast to before the kernel runs
  std::optional<int> chunk_size;      // BT; the op's default when unset
  std::optional<double> scale;        // defaults to K^-1/2
  bool recurrent = false;             // --recurrent: the token-by-token (decode) form of the op
  bool backward = false;              // --backward: gradients (inputs gain do [, dfinal_state])
  bool normalize = false;             // --normalize (linear_attn): divide by scale*q.z + eps
  bool no_normalize = false;          // --no-normalize (poly): the unnormalized kernel sum
  bool l2norm_qk = false;             // --l2norm-qk (delta rules): L2-normalize q and k in the kernel
  std::optional<double> a, b, c;      // --a/--b/--c (poly): f(x) = a + b x + c x^2
  std::optional<double> noise_dropout;  // --noise-dropout P (linear_attn, poly): see kernels/common/noise_dropout.h
  uint64_t seed = 0;                    // --seed: of the noise-dropout generator
  /// Dynamic shared memory one block may have on the GPU the call runs on (set by the runtime for CUDA
  /// calls; 0: not known, e.g. `linac plan`: defaults are then made for the reference GPU,
  /// kernels/common/device_limits.h).
  int64_t max_smem_per_block = 0;
  /// Streaming multiprocessors of that GPU (set with it; 0: not known): how many programs fill it.
  int64_t num_sms = 0;
  /// Its compute capability x 10 (set with it; 0: not known): the target whose shared-memory plan the
  /// defaults must fit.
  int sm = 0;
  /// Tuning parameters by name (e.g. {"bv": 128, "warps": 8}); see OpDef::config_keys. They change
  /// speed, never results beyond rounding.
  std::map<std::string, int64_t> config;
};

/// Parses "key=value,key=value" (integers) for --config; UserError on malformed text.
std::map<std::string, int64_t> parse_config(const std::string& text);

/// A problem size, for tuning and benchmarks (ops with other inputs map them onto these).
struct ProblemShape {
  int64_t B = 1, T = 1, H = 1, K = 64, V = 64;
  bool gated = false;
  std::string str() const;  // "B=8,T=4096,H=16,K=128,V=128[,gated]"
};

/// A configuration: tuning parameter -> value (see OpDef::config_keys).
using Config = std::map<std::string, int64_t>;
std::string config_str(const Config& c);  // "bv=128,warps=8" ("default" when empty)

struct OpArgSpec {
  std::string name;
  bool required = true;
  std::string shape;  // documentation, e.g. "[B,T,H,K]"
  std::string help;
};

/// The inputs and outputs of one op call, by name.
using TensorMap = std::map<std::string, HostTensor>;

/// One launch of a kernel: its grid and, per parameter name, a tensor of the plan or a scalar.
struct KernelLaunch {
  std::shared_ptr<ir::Kernel> kernel;
  std::array<int64_t, 3> grid = {1, 1, 1};
  std::map<std::string, std::string> tensors;  // parameter -> name in OpPlan::tensors
  std::map<std::string, double> scalars;       // parameter -> value
  /// How many of the launches right before this one it runs at the same time as, on the GPU: its
  /// producers, whose parts it waits for through flags (dsl.h, wait_for) instead of for their end. It
  /// still follows every launch before those, and the launches after it follow it. On the GPU it is
  /// queued before its producers, which start once its programs have (programmatic dependent launch,
  /// sm_90 on), so its programs must fit the GPU at once and leave SMs to theirs
  /// (kernels/common/overlap.h). The producers then run at once with each other too: none may read
  /// what another writes (a plan where one does is refused by its op). On the CPU launches run in
  /// order, so the flags are all set when it waits.
  int overlaps = 0;
};

/// What an op does for given inputs, independent of the device: the tensors it needs (inputs cast to
/// the kernel dtype, outputs allocated), the launches in order, and which tensors are its outputs.
struct OpPlan {
  TensorMap tensors;
  std::vector<KernelLaunch> launches;
  std::map<std::string, std::string> outputs;  // output name -> name in tensors
  /// Tensors zeroed at the start of every run: the flags of overlapping launches (KernelLaunch::overlaps).
  std::vector<std::string> cleared;
  std::vector<std::string> output_tensors() const;
};

struct OpDef {
  std::string name;
  std::string summary;
  std::vector<OpArgSpec> inputs;
  std::vector<OpArgSpec> outputs;
  /// The optional switches of OpOptions the op implements: "recurrent", "normalize", "no_normalize",
  /// "l2norm_qk", "coefficients" (a/b/c). Passing another is a UserError (check_op_options).
  std::vector<std::string> flags;
  /// Tuning parameters the op accepts in OpOptions::config, with a one-line description each.
  std::vector<std::pair<std::string, std::string>> config_keys;
  /// Checks the inputs and plans the launches. `wanted` names the outputs to produce.
  std::function<OpPlan(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted)>
      prepare;
  /// Random inputs of the given size (fixed seed), for tuning and benchmarks.
  std::function<TensorMap(const ProblemShape& shape, uint64_t seed)> random_inputs;
  /// The problem size of real inputs (the tuning database's key).
  std::function<ProblemShape(const TensorMap& inputs)> shape_of;
  /// Candidate configurations for the autotuner at this size, for opts.dtype on the GPU of opts (its
  /// SM count: kernels/common/device_limits.h).
  std::function<std::vector<Config>(const ProblemShape& shape, const OpOptions& opts)> tuning_space;
  /// Candidate configurations of the backward (--backward's kernels), for `linac tune --backward`.
  std::function<std::vector<Config>(const ProblemShape& shape, const OpOptions& opts)> bwd_tuning_space;
  /// The op's kernels for opts.dtype and opts.config (defaults elsewhere), for dump/compile; a
  /// representative set when the kernels depend on inputs (e.g. with and without a gate).
  std::function<std::vector<std::shared_ptr<ir::Kernel>>(const OpOptions& opts)> kernels;
  /// Users' ops (linac/user_op.h): the op computing this one's gradients (inputs: this op's inputs and
  /// "d" + each output; outputs: "d" + each input). Empty for the library's ops, which take backward=1.
  std::string gradient_op;
  /// --config keys of the forward that shape its saved_* outputs: a backward given those tensors takes
  /// the forward's values of them (poly's segment).
  std::vector<std::string> saved_layout_keys;
};

/// UserError if `opts` sets a switch `op` does not implement (see OpDef::flags).
void check_op_options(const OpDef& op, const OpOptions& opts);


/// Every op of the library, in a stable order.
const std::vector<OpDef>& op_registry();
/// The library's ops, then the ops added since (users' ops, linac/user_op.h), in that order. An op
/// lives until the process exits: the pointers stay valid.
std::vector<const OpDef*> all_ops();
/// Adds an op for every door (find_op, all_ops). An op added again under a name replaces the earlier
/// one for new calls (a user's library reloaded); calls prepared for the earlier one keep running it.
/// UserError when the name is one of the library's ops. Thread-safe.
void add_op(OpDef op);
/// The op named `name`, or UserError listing the known ops.
const OpDef& find_op(const std::string& name);

}  // namespace linac
