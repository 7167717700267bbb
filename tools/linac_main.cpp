// The linac command line: list ops, run them on .npy files, print their IR.
//
// Every failure the user can cause ends in exactly one line "linac: error: ..." on stderr and exit
// status 1; nothing is written unless the whole run succeeded. Bugs in linac exit with status 2.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cstdlib>
#include <fmt/format.h>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/parser.h"
#include "compiler/ir/printer.h"
#include "compiler/nvptx/codegen.h"
#include "kernels/common/op_support.h"
#include "kernels/op.h"
#include "linac/error.h"
#include "runtime/autotune.h"
#include "runtime/cuda_driver.h"
#include "runtime/disk_cache.h"
#include "runtime/executor.h"
#include "runtime/npy.h"
#include "runtime/op_call.h"
#include "runtime/output_files.h"
#include "tools/dump.h"

namespace linac {
namespace {

constexpr const char* kUsage = R"(usage: linac <command> [options]

commands:
  list                      list the ops of the library with their inputs and outputs
  run OP NAME=FILE.npy ...  run an op on .npy inputs, write .npy outputs (see 'linac run --help')
  compile OP|FILE.tir       print a stage of an op's kernels (see 'linac compile --help')
  bench OP --shape ...      time an op on the GPU on random inputs (see 'linac bench --help')
  cache ls|clear|prune      inspect or empty the kernel cache (see 'linac cache --help')
  tune OP --shape ...       autotune OP's configuration on this GPU (see 'linac tune --help')
  plan OP --shape ...       the launches and device memory of one call, without a GPU (see 'linac plan --help')
  dump OP --dir D           write every stage of OP's kernels, annotated PTX and resources to D

Environment: LINAC_DEVICE (default device for run), LINAC_CACHE_DIR, LINAC_DISABLE_CACHE, LINAC_CACHE_LOG,
LINAC_DUMP (a directory: every stage of every kernel compiled for the GPU), LINAC_OVERRIDE_DIR (a
directory of stage files that replace the compiler's, see 'linac dump --help'), LINAC_DEBUG (whole error
messages), LINAC_CUDA_DEVICE (GPU ordinal). See README.md.
)";

constexpr const char* kRunUsage = R"(usage: linac run OP NAME=FILE.npy ... -o NAME=FILE.npy [-o ...] [options]

Runs OP on the named inputs and writes the named outputs as float32 .npy files.
  -o NAME=FILE          an output to write (repeatable); at least one
  --device cpu|cuda     where to run (default: $LINAC_DEVICE or cpu = the CPU interpreter)
  --dtype fp32|bf16|fp16  precision the inputs are cast to before the kernel runs (default fp32)
  --chunk-size N        chunk size: 16, 32, 64 or 128 (default: the op's)
  --scale X             query scale (default K^-1/2)
  --config K=V,...      tuning parameters (see 'linac list'); never change results beyond rounding
  --recurrent           the token-by-token (decode) form instead of the chunked one
  --backward            gradients: add do=FILE [dfinal_state=FILE]; outputs dq, dk, dv, ...
  --normalize           (linear_attn) normalized output q S / (q z + eps)
  --no-normalize        (poly) plain kernel sum without the denominator
  --l2norm-qk           (delta_rule, gated_delta_rule) L2-normalize q and k inside the kernel
  --a A --b B --c C     (poly) coefficients of f(x) = a + b x + c x^2 (default 1, 1, 0.5)
  --noise-dropout P     (linear_attn, poly) o <- (1-P) o (1+psi), psi ~ N(0, P) per element, from a
                        counter-based generator (kernels/common/noise_dropout.h); with --backward, the gradients
                        of the same noisy output (the same --seed regenerates the same noise)
  --seed S              seed of the noise-dropout generator (default 0)
An option the op does not use is an error.
Example:
  linac run linear_attn q=q.npy k=k.npy v=v.npy -o o=o.npy -o final_state=s.npy
)";

constexpr const char* kCompileUsage = R"(usage: linac compile OP|FILE.tir [--emit STAGE] [--out DIR] [--dtype D] [--config K=V,...] [--target sm_80|sm_90a]
       [--shape B=..,T=..,H=..,K=..[,V=..] [--gated] [--normalize] [--l2norm-qk] [--backward] [--states] [--saving]]

Prints one stage of OP's kernels at their default configuration, or of a .tir file (parsed and
verified first). Needs no GPU.
  --emit STAGE          tir (default): the tile IR as recorded
                        layouts: the tile IR with the layout of every value
                        smem: the shared-memory plan
                        llvm: LLVM IR before optimization; llvm-opt: after O3
                        ptx: the PTX (with .loc lines pointing at the DSL source)
  --dtype D             input dtype the op's kernels are specialized for (default bf16)
  --config K=V,...      tuning parameters of the op's kernels (see 'linac list')
  --target T            GPU architecture for the backend stages (default sm_90a)
  --out DIR             one file per kernel, DIR/<i>-<kernel>.<stage> (each a module the parser or ptxas
                        reads back; printed to stdout without it, the kernels follow one another and
                        several do not make one valid module)
  --shape S             instead of the representative kernels, exactly those a call at shape S
                        launches (its plan, at the default or --config configuration)
  --gated, --normalize, --backward   with --shape: the gated call (linear_attn's g) / the normalized
                        form / the backward's kernels
  --l2norm-qk           with --shape: the call that L2-normalizes q and k inside the kernels (the delta rules)
  --states              with --shape: the call with an initial state and asking for the final state
  --saving              with --shape: the forward that also saves the backward's tensors (outputs saved_*:
                        the delta rules, poly; the training pair's first half, as 'linac bench --backward'
                        times it)
With LINAC_OVERRIDE_DIR set, stages come from its files where it has them (see 'linac dump --help').
)";

constexpr const char* kBenchUsage = R"(usage: linac bench OP --shape B=8,T=4096,H=16,K=128[,V=128] [options]

Times OP on the GPU on random inputs with CUDA events (3 warm-up runs, then the median of --iters
runs, cycling through copies of the inputs that together exceed twice the L2 cache). Prints the
time, the bandwidth achieved and the fraction of the HBM floor: the floor is the time the op's bytes
take at the peak memory bandwidth (floor ms / median ms; 1 would be running at the memory's speed).
The bytes are every tensor of the op's plan once: its inputs in the kernel dtype, its outputs and the
scratch it allocates (e.g. poly's degree-2 state), each of which a run reads or writes at least once.
  --shape B=..,T=..,H=..,K=..[,V=..]  problem size (V defaults to K)
  --dtype fp32|bf16|fp16  input precision (default bf16)
  --gated               add a per-head log-decay gate g (linear_attn)
  --normalize           the normalized form (linear_attn)
  --l2norm-qk           the call that L2-normalizes q and k inside the kernels (the delta rules)
  --chunk-size N        chunk size (default: the op's)
  --config K=V,...      tuning parameters (see 'linac list')
  --iters N             timed runs (default 50)
  --backward            also time the backward (ops with --backward: gradients from random do; at the
                        backward kernels' defaults) and report fwd+bwd and the backward's device memory.
                        Ops whose forward saves intermediates for it (saved_* outputs: the delta rules, poly)
                        time the training pair, the forward saving them and the backward given them,
                        and the backward that recomputes them beside it
  --bwd-config K=V,...  the backward's configuration (e.g. linear_attn: chunk, bk, bv, warps)
  --peak-gbs X          peak memory bandwidth in GB/s (default: the device's, 2 x memory clock x bus
                        width: about 4800 on an H200)
  --json FILE           also write the result as JSON (with bytes, floor_ms, peak_gbs, fraction_of_floor)
)";

constexpr const char* kPlanUsage = R"(usage: linac plan OP --shape B=..,T=..,H=..,K=..[,V=..] [options]

Prints what one call of OP allocates on the device and launches, without a GPU: every tensor of its
plan (inputs in the kernel dtype, outputs, scratch; a GPU run allocates exactly these, once per call)
with dtype, shape and size, the total, the bytes per token, and each launch's kernel and grid.
  --shape B=..,T=..,H=..,K=..[,V=..]  problem size (V defaults to K)
  --dtype fp32|bf16|fp16  input precision (default bf16)
  --gated               add the gate (linear_attn)
  --normalize           the normalized form (linear_attn)
  --l2norm-qk           the call that L2-normalizes q and k inside the kernels (the delta rules)
  --backward            the backward call (random do; ops with --backward)
  --chunk-size N, --config K=V,...   as for run
  --json FILE           also write it as JSON (device_bytes, tensors, launches)
)";

constexpr const char* kCacheUsage = R"(usage: linac cache ls | clear | prune --max-size SIZE

The kernel cache ($LINAC_CACHE_DIR, else $XDG_CACHE_HOME/linac, else ~/.cache/linac):
  ls                    one line per entry: key, size, age, kernel
  clear                 remove every entry
  prune --max-size S    remove least recently used entries until the cache is at most S bytes
                        (suffixes K, M, G allowed)
)";

[[noreturn]] void usage_error(const std::string& msg) { throw UserError(msg); }

bool is_help(const std::string& a) { return a == "--help" || a == "-h"; }

/// Splits "name=path" into its parts.
std::pair<std::string, std::string> split_binding(const std::string& arg) {
  auto eq = arg.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size())
    usage_error(fmt::format("expected NAME=FILE.npy, got '{}'", arg));
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

std::string value_of(const std::vector<std::string>& args, size_t& i) {
  if (i + 1 >= args.size()) usage_error(fmt::format("{} needs a value", args[i]));
  return args[++i];
}

int parse_int(const std::string& flag, const std::string& s) {
  try {
    size_t pos = 0;
    int v = std::stoi(s, &pos);
    if (pos == s.size()) return v;
  } catch (const std::exception&) {
  }
  usage_error(fmt::format("{} expects an integer, got '{}'", flag, s));
}

double parse_double(const std::string& flag, const std::string& s) {
  try {
    size_t pos = 0;
    double v = std::stod(s, &pos);
    if (pos == s.size()) return v;
  } catch (const std::exception&) {
  }
  usage_error(fmt::format("{} expects a number, got '{}'", flag, s));
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda" || s == "gpu") return Device::cuda;
  usage_error(fmt::format("unknown device '{}' (expected cpu or cuda)", s));
}

DType parse_input_dtype(const std::string& s) {
  auto d = parse_dtype(s);
  if (!d || (*d != DType::f32 && *d != DType::bf16 && *d != DType::f16))
    usage_error(fmt::format("--dtype {}: expected fp32, bf16 or fp16", s));
  return *d;
}

HostTensor to_host(NpyArray a) { return HostTensor{a.dtype, std::move(a.shape), std::move(a.data), {}}; }

int cmd_list() {
  for (const auto& op : op_registry()) {
    fmt::print("{}  {}\n", op.name, op.summary);
    for (const auto& in : op.inputs)
      fmt::print("    in  {:<14} {:<10} {}{}\n", in.name, in.shape, in.help, in.required ? "" : " (optional)");
    for (const auto& out : op.outputs)
      fmt::print("    out {:<14} {:<10} {}{}\n", out.name, out.shape, out.help, out.required ? "" : " (optional)");
    for (const auto& [key, help] : op.config_keys) fmt::print("    cfg {:<14} {}\n", key, help);
  }
  return 0;
}

int cmd_run(const std::vector<std::string>& args) {
  if (args.empty() || is_help(args[0])) {
    fmt::print("{}", kRunUsage);
    return args.empty() ? 1 : 0;
  }
  const OpDef& op = find_op(args[0]);
  OpOptions opts;
  if (const char* env = std::getenv("LINAC_DEVICE"); env && *env) opts.device = parse_device(env);
  std::map<std::string, std::string> input_files;
  std::vector<std::pair<std::string, std::string>> output_files;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (is_help(a)) {
      fmt::print("{}", kRunUsage);
      return 0;
    } else if (a == "-o" || a == "--output") {
      output_files.push_back(split_binding(value_of(args, i)));
    } else if (a == "--device") {
      opts.device = parse_device(value_of(args, i));
    } else if (a == "--dtype") {
      opts.dtype = parse_input_dtype(value_of(args, i));
    } else if (a == "--chunk-size") {
      opts.chunk_size = parse_int(a, value_of(args, i));
    } else if (a == "--scale") {
      opts.scale = parse_double(a, value_of(args, i));
    } else if (a == "--config") {
      opts.config = parse_config(value_of(args, i));
    } else if (a == "--recurrent") {
      opts.recurrent = true;
    } else if (a == "--backward") {
      opts.backward = true;
    } else if (a == "--normalize") {
      opts.normalize = true;
    } else if (a == "--no-normalize") {
      opts.no_normalize = true;
    } else if (a == "--l2norm-qk") {
      opts.l2norm_qk = true;
    } else if (a == "--a") {
      opts.a = parse_double(a, value_of(args, i));
    } else if (a == "--b") {
      opts.b = parse_double(a, value_of(args, i));
    } else if (a == "--c") {
      opts.c = parse_double(a, value_of(args, i));
    } else if (a == "--noise-dropout") {
      opts.noise_dropout = parse_double(a, value_of(args, i));
      if (!(*opts.noise_dropout >= 0 && *opts.noise_dropout < 1)) usage_error("--noise-dropout must be in [0, 1)");
    } else if (a == "--seed") {
      const int64_t seed = parse_int(a, value_of(args, i));
      if (seed < 0) usage_error("--seed must be non-negative");
      opts.seed = static_cast<uint64_t>(seed);
    } else if (a.starts_with("-")) {
      usage_error(fmt::format("unknown option '{}' for 'run' (see linac run --help)", a));
    } else {
      auto [name, path] = split_binding(a);
      if (input_files.count(name)) usage_error(fmt::format("input '{}' given twice", name));
      input_files[name] = path;
    }
  }
  // Check every name against the op's signature before reading any file.
  for (const auto& [name, path] : input_files) {
    bool known = false;
    for (const auto& spec : op.inputs) known |= spec.name == name;
    if (!known) usage_error(fmt::format("{} has no input named '{}'", op.name, name));
  }
  for (const auto& spec : op.inputs)
    if (spec.required && !input_files.count(spec.name))
      usage_error(fmt::format("{} needs input '{}' {}", op.name, spec.name, spec.shape));
  if (output_files.empty()) usage_error("no output requested: add -o NAME=FILE.npy");
  std::vector<std::string> wanted;
  for (const auto& [name, path] : output_files) {
    bool known = false;
    for (const auto& spec : op.outputs) known |= spec.name == name;
    if (!known) usage_error(fmt::format("{} has no output named '{}'", op.name, name));
    for (const auto& w : wanted)
      if (w == name) usage_error(fmt::format("output '{}' requested twice", name));
    for (const auto& [other, other_path] : output_files)
      if (other != name && std::filesystem::path(other_path).lexically_normal() == std::filesystem::path(path).lexically_normal())
        usage_error(fmt::format("outputs '{}' and '{}' would both be written to {}", other, name, path));
    wanted.push_back(name);
  }

  TensorMap inputs;
  for (const auto& [name, path] : input_files) {
    HostTensor t = to_host(read_npy(path));
    if (name == "cu_seqlens") {
      if (t.dtype != DType::i32 && t.dtype != DType::i64)
        usage_error(fmt::format("{}: cu_seqlens must be int32 or int64, got {}", path, dtype_name(t.dtype)));
    } else if (t.dtype != DType::f32 && t.dtype != DType::f16 && t.dtype != DType::f64) {
      usage_error(fmt::format("{}: {} must be float32, float16 or float64, got {}", path, name, dtype_name(t.dtype)));
    }
    inputs[name] = std::move(t);
  }
  TensorMap outputs = run_op(op, inputs, opts, wanted);
  // Every output or none (runtime/output_files.h).
  std::vector<NpyArray> arrays;  // alive until commit: special files are written then
  arrays.reserve(output_files.size());
  OutputFiles files;
  for (const auto& [name, path] : output_files) {
    auto it = outputs.find(name);
    if (it == outputs.end()) throw InternalError(fmt::format("op {} did not produce output {}", op.name, name));
    HostTensor f = it->second.cast(DType::f32);
    const NpyArray& a = arrays.emplace_back(NpyArray{f.dtype, f.shape, std::move(f.data)});
    files.add(path, [&a](std::FILE* file, const std::string& p) { write_npy_to(file, a, p); });
  }
  files.commit();
  return 0;
}

/// Options shared by the commands that compile kernels without running them (compile, dump).
struct KernelSelection {
  OpOptions opts;  // dtype and config of an op's kernels (and backward)
  nvptx::GpuTarget target;
  std::optional<ProblemShape> shape;  // the kernels of a call at this shape instead of the representative ones
  bool gated = false;
  bool states = false;  // with shape: an initial state in, the final state out
  bool saving = false;  // with shape: the forward that also saves the backward's tensors (saved_*)
  KernelSelection() : target(nvptx::GpuTarget::for_sm(90)) { opts.dtype = DType::bf16; }
};

ProblemShape parse_shape(const std::string& spec);
TensorMap synthetic_inputs(const OpDef& op, const ProblemShape& ps, bool backward);
TensorMap shape_only_inputs(const OpDef& op, const ProblemShape& ps, bool backward);
std::vector<std::string> synthetic_outputs(bool backward, bool gated);

/// Consumes args[i] (and its value) if it is --dtype, --config, --target, --shape, --gated, --states,
/// --saving, --normalize, --l2norm-qk or --backward.
bool parse_selection_option(const std::vector<std::string>& args, size_t& i, KernelSelection& sel) {
  if (args[i] == "--shape") {
    sel.shape = parse_shape(value_of(args, i));
  } else if (args[i] == "--gated") {
    sel.gated = true;
  } else if (args[i] == "--states") {
    sel.states = true;
  } else if (args[i] == "--saving") {
    sel.saving = true;
  } else if (args[i] == "--backward") {
    sel.opts.backward = true;
  } else if (args[i] == "--normalize") {
    sel.opts.normalize = true;
  } else if (args[i] == "--l2norm-qk") {
    sel.opts.l2norm_qk = true;
  } else if (args[i] == "--dtype") {
    sel.opts.dtype = parse_input_dtype(value_of(args, i));
  } else if (args[i] == "--config") {
    sel.opts.config = parse_config(value_of(args, i));
  } else if (args[i] == "--target") {
    std::string t = value_of(args, i);
    if (t != "sm_80" && t != "sm_90a" && t != "sm_90") usage_error(fmt::format("--target {}: expected sm_80 or sm_90a", t));
    sel.target.sm = t == "sm_80" ? 80 : 90;
  } else {
    return false;
  }
  return true;
}

/// The selection's options with the defaults of a call on its target: the target's shared memory (the
/// SM count stays the reference GPU's).
OpOptions options_on_target(const KernelSelection& sel) {
  OpOptions opts = sel.opts;
  opts.sm = sel.target.sm;
  opts.max_smem_per_block = sel.target.max_smem_bytes();
  return opts;
}

/// The kernels of an op (at the selection's dtype and config) or of a .tir file (parsed, verified).
std::vector<std::shared_ptr<ir::Kernel>> load_kernels(const std::string& what, const KernelSelection& sel) {
  if (what.ends_with(".tir") && (sel.shape || sel.gated || sel.states || sel.saving || sel.opts.backward))
    usage_error("--shape, --gated, --states, --saving and --backward select an op's kernels, not a .tir file's");
  const bool call_form = sel.opts.normalize || sel.opts.l2norm_qk;
  if (what.ends_with(".tir") && call_form)
    usage_error("--normalize and --l2norm-qk select an op's kernels, not a .tir file's");
  if (!what.ends_with(".tir") && (sel.gated || sel.states || sel.saving || sel.opts.backward || call_form) &&
      !sel.shape)
    usage_error("--gated, --states, --saving, --normalize, --l2norm-qk and --backward need --shape B=..,T=..,H=..,K=.. "
                "(the call whose kernels to take)");
  if (!what.ends_with(".tir") && sel.shape) {
    // Exactly the kernels a call at this shape launches (its plan, made on the host), each once.
    const OpDef& op = find_op(what);
    if (sel.opts.backward && std::find(op.flags.begin(), op.flags.end(), "backward") == op.flags.end())
      usage_error(fmt::format("{} has no backward yet", op.name));
    if (sel.states && std::none_of(op.inputs.begin(), op.inputs.end(), [](const OpArgSpec& a) { return a.name == "initial_state"; }))
      usage_error(fmt::format("--states: {} takes no initial state", op.name));
    std::vector<std::string> saved;
    for (const auto& o : op.outputs)
      if (o.name.starts_with("saved_")) saved.push_back(o.name);
    if (sel.saving && saved.empty()) usage_error(fmt::format("--saving: {}'s forward saves nothing for its backward", op.name));
    if (sel.saving && sel.opts.backward)
      usage_error("--saving selects the forward that saves the backward's tensors; --backward the backward's kernels");
    ProblemShape ps = *sel.shape;
    ps.gated = sel.gated;
    OpOptions opts = options_on_target(sel);
    opts.device = Device::cpu;
    check_op_options(op, opts);
    TensorMap inputs = shape_only_inputs(op, ps, opts.backward);
    std::vector<std::string> outputs = synthetic_outputs(opts.backward, sel.gated);
    if (sel.states) {
      inputs["initial_state"] = HostTensor::zeros(DType::f32, {ps.B, ps.H, ps.K, ps.V});
      if (opts.backward) {
        inputs["dfinal_state"] = HostTensor::zeros(DType::f32, {ps.B, ps.H, ps.K, ps.V});
        outputs.push_back("dinitial_state");
      } else {
        outputs.push_back("final_state");
      }
    }
    if (sel.saving) outputs.insert(outputs.end(), saved.begin(), saved.end());
    OpPlan plan = op.prepare(inputs, opts, outputs);
    std::vector<std::shared_ptr<ir::Kernel>> kernels;
    for (const auto& l : plan.launches)
      if (std::find(kernels.begin(), kernels.end(), l.kernel) == kernels.end()) kernels.push_back(l.kernel);
    return kernels;
  }
  if (!what.ends_with(".tir")) return find_op(what).kernels(options_on_target(sel));  // as with --shape
  std::ifstream f(what, std::ios::binary);
  if (!f) usage_error(fmt::format("{}: cannot open", what));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return {ir::parse(text, what)};
}

int cmd_compile(const std::vector<std::string>& args) {
  if (args.empty() || is_help(args[0])) {
    fmt::print("{}", kCompileUsage);
    return args.empty() ? 1 : 0;
  }
  std::string emit = "tir";
  std::string out_dir;
  KernelSelection sel;
  for (size_t i = 1; i < args.size(); ++i) {
    if (is_help(args[i])) {
      fmt::print("{}", kCompileUsage);
      return 0;
    } else if (args[i] == "--emit") {
      emit = value_of(args, i);
    } else if (args[i] == "--out") {
      out_dir = value_of(args, i);
    } else if (!parse_selection_option(args, i, sel)) {
      usage_error(fmt::format("unknown option '{}' for 'compile' (see linac compile --help)", args[i]));
    }
  }
  // Each --emit stage: where compile_kernel may stop for it, the field that holds it, its file extension.
  struct EmitStage {
    const char* name;
    nvptx::Stage last;
    std::string nvptx::CompiledKernel::*text;
    const char* extension;
  };
  static const EmitStage kStages[] = {
      {"tir", nvptx::Stage::layouts, &nvptx::CompiledKernel::tir, "tir"},
      {"layouts", nvptx::Stage::layouts, &nvptx::CompiledKernel::tir_layouts, "layouts.tir"},
      {"smem", nvptx::Stage::smem, &nvptx::CompiledKernel::smem_plan, "smem.txt"},
      {"llvm", nvptx::Stage::llvm, &nvptx::CompiledKernel::llvm_ir, "ll"},
      {"llvm-opt", nvptx::Stage::llvm_opt, &nvptx::CompiledKernel::llvm_ir_opt, "opt.ll"},
      {"ptx", nvptx::Stage::ptx, &nvptx::CompiledKernel::ptx, "ptx"}};
  const EmitStage* stage = std::find_if(std::begin(kStages), std::end(kStages), [&](const EmitStage& e) { return emit == e.name; });
  if (stage == std::end(kStages))
    usage_error(fmt::format("--emit {}: expected one of tir, layouts, smem, llvm, llvm-opt, ptx", emit));
  auto stage_text = [&](const ir::Kernel& k) -> std::string {
    if (emit == "tir") return ir::print(k);  // no backend stage at all: a .tir file of any size prints
    return nvptx::compile_kernel(k, sel.target, nvptx::stage_override_from_env(k), stage->last).*(stage->text);
  };
  const auto kernels = load_kernels(args[0], sel);
  if (out_dir.empty()) {
    for (const auto& k : kernels) fmt::print("{}", stage_text(*k));
    return 0;
  }
  // One file per kernel: each a whole module that the parser (tir) or ptxas (ptx) reads back.
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) usage_error(fmt::format("--out {}: cannot create the directory: {}", out_dir, ec.message()));
  std::vector<std::string> texts;
  for (const auto& k : kernels) texts.push_back(stage_text(*k));
  OutputFiles files;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const std::string path = fmt::format("{}/{}-{}.{}", out_dir, i, kernels[i]->name, stage->extension);
    files.add(path, [&texts, i](std::FILE* f, const std::string& p) { write_bytes(f, texts[i].data(), texts[i].size(), p); });
    fmt::print("{}\n", path);
  }
  files.commit();
  return 0;
}

/// Parses "--shape B=..,T=..,H=..,K=..[,V=..]".
ProblemShape parse_shape(const std::string& spec) {
  std::map<std::string, int64_t> shape;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    auto [key, val] = split_binding(item);
    if (key != "B" && key != "T" && key != "H" && key != "K" && key != "V")
      usage_error(fmt::format("--shape: unknown dimension '{}' (expected B, T, H, K, V)", key));
    if (shape.count(key)) usage_error(fmt::format("--shape: {} given twice", key));
    shape[key] = parse_int("--shape " + key, val);
    if (shape[key] < 1) usage_error(fmt::format("--shape: {} must be positive", key));
    pos = comma == std::string::npos ? spec.size() : comma + 1;
  }
  for (const char* d : {"B", "T", "H", "K"})
    if (!shape.count(d)) usage_error(fmt::format("--shape needs {} (e.g. --shape B=8,T=4096,H=16,K=128)", d));
  if (!shape.count("V")) shape["V"] = shape["K"];
  return ProblemShape{shape["B"], shape["T"], shape["H"], shape["K"], shape["V"], false};
}

constexpr const char* kTuneUsage = R"(usage: linac tune OP --shape B=..,T=..,H=..,K=..[,V=..] [--dtype bf16] [--gated] [--backward] [--list]

Tunes OP's configuration on this GPU for the shape (progress on stderr), stores the winner in the
tuning database (<cache dir>/tuning.db; later runs use it) and prints every candidate. Each
candidate must match the CPU interpreter on a small input and repeat bitwise; survivors are timed at
the shape's B, H and head dims on at most 1024 tokens (the kernels' cost grows per chunk, so the
ranking holds, and tuning a long sequence costs no more than a short one).
  --list                print the candidate configurations for the shape and dtype, one per line
                        ("default" first), and exit; needs no GPU
  --backward            tune the backward's kernels instead (candidates checked on dq, dk, dv from a
                        random do); `run --backward` and `bench --backward` then use the winner. The
                        backward is never tuned on first use: without this, it runs at its defaults.
)";

/// kTuneUsage and the ops it applies to, from the registry.
void print_tune_usage() {
  std::vector<std::string> tunable;
  for (const auto& op : op_registry())
    if (op.tuning_space) tunable.push_back(op.name);
  fmt::print("{}Ops with a tuning space: {}\n", kTuneUsage, fmt::join(tunable, ", "));
}

int cmd_tune(const std::vector<std::string>& args) {
  if (args.empty() || is_help(args[0])) {
    print_tune_usage();
    return args.empty() ? 1 : 0;
  }
  const OpDef& op = find_op(args[0]);
  OpOptions opts;
  opts.device = Device::cuda;
  opts.dtype = DType::bf16;
  std::optional<ProblemShape> shape;
  bool gated = false, list = false;
  for (size_t i = 1; i < args.size(); ++i) {
    if (is_help(args[i])) {
      print_tune_usage();
      return 0;
    } else if (args[i] == "--shape") {
      shape = parse_shape(value_of(args, i));
    } else if (args[i] == "--dtype") {
      opts.dtype = parse_input_dtype(value_of(args, i));
    } else if (args[i] == "--gated") {
      gated = true;
    } else if (args[i] == "--list") {
      list = true;
    } else if (args[i] == "--backward") {
      opts.backward = true;
    } else {
      usage_error(fmt::format("unknown option '{}' for 'tune' (see linac tune --help)", args[i]));
    }
  }
  if (!shape) usage_error("tune needs --shape B=..,T=..,H=..,K=..");
  shape->gated = gated;
  const auto& space = opts.backward ? op.bwd_tuning_space : op.tuning_space;
  if (!space) usage_error(fmt::format("{} has no {}tuning space", op.name, opts.backward ? "backward " : ""));
  if (list) {
    for (const Config& c : space(*shape, opts)) fmt::print("{}\n", config_str(c));
    return 0;
  }
  set_device_limits(opts);
  TuneResult r = tune(op, *shape, opts, true);
  fmt::print("{} {} {} on {}: tuned in {:.1f} s\n", op.name, shape->str(), dtype_name(opts.dtype),
             cuda::device_info().name, r.seconds);
  if (r.timed.T != shape->T)
    fmt::print("(candidates timed at {}: the real B, H and head dims, the sequence cut to {} tokens)\n",
               r.timed.str(), r.timed.T);
  fmt::print("{:<32} {:>10}  {}\n", "config", "median ms", "status");
  for (const auto& c : r.candidates)
    fmt::print("{:<32} {:>10}  {}\n", config_str(c.config), c.median_ms > 0 ? fmt::format("{:.4f}", c.median_ms) : "-",
               c.status);
  return 0;
}

constexpr const char* kDumpUsage = R"(usage: linac dump OP|FILE.tir --dir D [--dtype D] [--config K=V,...] [--target sm_80|sm_90a]
       [--shape B=..,T=..,H=..,K=..[,V=..] [--gated] [--normalize] [--l2norm-qk] [--backward] [--states] [--saving]]

Writes, per kernel of OP (or of the .tir file), into D/<n>-<kernel>/: the tile IR as recorded, with
layouts, the shared-memory plan, LLVM IR before and after O3, the PTX, the PTX annotated with the DSL
source lines its .loc directives point at, and — when ptxas is installed — the cubin and ptxas's
resource report (registers, spills, stack), plus the SASS when cuobjdump is installed:
  1-recorded.tir 2-layouts.tir 3-smem-plan.txt 4-lowered.ll 5-optimized.ll 6-kernel.ptx
  7-annotated.txt [8-kernel.cubin 9-resources.txt 10-kernel.sass]
Options as 'linac compile' (--dtype, --config, --target; --shape S [--gated] [--normalize] [--l2norm-qk]
[--backward] [--states] [--saving]: the
kernels a call at shape S launches, e.g. linac dump linear_attn --shape B=8,T=4096,H=16,K=128 --backward).

Overriding a stage (as Triton's kernel override): edit a file of D, then set LINAC_OVERRIDE_DIR=D
for any command that compiles (run, bench, tune, compile, dump, and programs using linac/runtime.h).
A kernel's stage is replaced by D/<n>-<kernel>/6-kernel.ptx (linked as it is), else 5-optimized.ll
(then PTX is emitted from it), else 4-lowered.ll (then O3 and PTX): the latest stage present wins,
so delete 6-kernel.ptx to start from an edited .ll. 1-recorded.tir ties the directory to the kernel
with exactly that tile IR (other dtypes and configurations are compiled as usual); a directory named
<kernel> without it serves every kernel of that name. Each replacement prints
"linac: kernel K: STAGE replaced by FILE" on stderr; overridden kernels get their own cache entries.
Example:
  linac dump linear_attn --dir D && $EDITOR D/0-linear_attn_fwd/6-kernel.ptx
  LINAC_OVERRIDE_DIR=D linac run linear_attn ... --device cuda
)";

int cmd_dump(const std::vector<std::string>& args) {
  if (args.empty() || is_help(args[0])) {
    fmt::print("{}", kDumpUsage);
    return args.empty() ? 1 : 0;
  }
  KernelSelection sel;
  std::string dir;
  for (size_t i = 1; i < args.size(); ++i) {
    if (is_help(args[i])) {
      fmt::print("{}", kDumpUsage);
      return 0;
    } else if (args[i] == "--dir") {
      dir = value_of(args, i);
    } else if (!parse_selection_option(args, i, sel)) {
      usage_error(fmt::format("unknown option '{}' for 'dump' (see linac dump --help)", args[i]));
    }
  }
  if (dir.empty()) usage_error("dump needs --dir D");
  std::vector<std::shared_ptr<ir::Kernel>> kernels = load_kernels(args[0], sel);
  for (const auto& line : dump_kernels(kernels, dir, sel.target)) fmt::print("{}\n", line);
  return 0;
}

/// The options `plan` and `bench` share: a synthetic call of an op on random inputs.
struct SyntheticCall {
  OpOptions opts;
  std::optional<ProblemShape> shape;
  bool gated = false;
  std::string json;
};

/// Consumes args[i] (and its value) if it is one of the shared options; false otherwise.
bool parse_synthetic_option(const OpDef& op, const std::vector<std::string>& args, size_t& i, SyntheticCall& call) {
  const std::string& a = args[i];
  if (a == "--shape") {
    call.shape = parse_shape(value_of(args, i));
  } else if (a == "--dtype") {
    call.opts.dtype = parse_input_dtype(value_of(args, i));
  } else if (a == "--gated") {
    call.gated = true;
  } else if (a == "--normalize") {
    if (std::find(op.flags.begin(), op.flags.end(), "normalize") == op.flags.end())
      usage_error(fmt::format("{} has no --normalize", op.name));
    call.opts.normalize = true;
  } else if (a == "--l2norm-qk") {  // refused for ops without it by check_op_options, as for compile
    call.opts.l2norm_qk = true;
  } else if (a == "--backward") {
    if (std::find(op.flags.begin(), op.flags.end(), "backward") == op.flags.end())
      usage_error(fmt::format("{} has no backward yet", op.name));
    call.opts.backward = true;
  } else if (a == "--chunk-size") {
    call.opts.chunk_size = parse_int(a, value_of(args, i));
  } else if (a == "--config") {
    call.opts.config = parse_config(value_of(args, i));
  } else if (a == "--json") {
    call.json = value_of(args, i);
  } else {
    return false;
  }
  return true;
}

/// The random gradient of o of a synthetic backward call.
HostTensor synthetic_do(const ProblemShape& ps) { return random_uniform({ps.B, ps.T, ps.H, ps.V}, 7); }

/// The op's random inputs at the call's shape (plus do for the backward).
TensorMap synthetic_inputs(const OpDef& op, const ProblemShape& ps, bool backward) {
  if (!op.random_inputs) usage_error(fmt::format("{} has no input generator", op.name));
  TensorMap inputs = op.random_inputs(ps, 1);
  if (backward) inputs["do"] = synthetic_do(ps);
  return inputs;
}

/// The inputs of synthetic_inputs() as shapes alone (no data: HostTensor::zeros holds none), for what
/// needs only a plan (`plan`, `compile --shape`): the names, dtypes and layouts come from the op's input
/// generator at a probe size whose dims tell each other apart, so nothing of the call's size is allocated.
TensorMap shape_only_inputs(const OpDef& op, const ProblemShape& ps, bool backward) {
  const ProblemShape probe{2, 3, 5, 7, 11, ps.gated};
  TensorMap shaped;
  for (const auto& [name, t] : synthetic_inputs(op, probe, backward)) {
    std::vector<int64_t> shape;
    for (int64_t d : t.shape) {
      const int64_t real = d == probe.B ? ps.B : d == probe.T ? ps.T : d == probe.H ? ps.H : d == probe.K ? ps.K
                           : d == probe.V ? ps.V : -1;
      if (real < 0) throw InternalError(fmt::format("{}'s input {} has a dimension {} at the probe size", op.name, name, d));
      shape.push_back(real);
    }
    shaped[name] = HostTensor::zeros(t.dtype, std::move(shape));
  }
  return shaped;
}

/// The outputs a synthetic forward or backward call asks for.
std::vector<std::string> synthetic_outputs(bool backward, bool gated) {
  if (!backward) return {"o"};
  std::vector<std::string> grads = {"dq", "dk", "dv"};
  if (gated) grads.push_back("dg");
  return grads;
}

void write_text_file(const std::string& path, const std::string& text) { write_file_atomically(path, text); }

int cmd_plan(const std::vector<std::string>& args) {
  if (args.empty() || is_help(args[0])) {
    fmt::print("{}", kPlanUsage);
    return args.empty() ? 1 : 0;
  }
  const OpDef& op = find_op(args[0]);
  SyntheticCall call;
  call.opts.device = Device::cpu;
  call.opts.dtype = DType::bf16;
  for (size_t i = 1; i < args.size(); ++i) {
    if (is_help(args[i])) {
      fmt::print("{}", kPlanUsage);
      return 0;
    }
    if (!parse_synthetic_option(op, args, i, call))
      usage_error(fmt::format("unknown option '{}' for 'plan' (see linac plan --help)", args[i]));
  }
  if (!call.shape) usage_error("plan needs --shape B=..,T=..,H=..,K=..");
  const OpOptions& opts = call.opts;
  ProblemShape ps = *call.shape;
  ps.gated = call.gated;
  check_op_options(op, opts);
  OpPlan plan = op.prepare(shape_only_inputs(op, ps, opts.backward), opts, synthetic_outputs(opts.backward, call.gated));
  int64_t total = 0;
  std::string tensors_json, launches_json;
  fmt::print("{} {}{}: {} launch(es)\n", op.name, ps.str(), opts.backward ? " backward" : "", plan.launches.size());
  for (const auto& l : plan.launches) {
    fmt::print("  launch {:<28} grid [{}, {}, {}]{}\n", l.kernel->name, l.grid[0], l.grid[1], l.grid[2],
               l.overlaps > 0 ? fmt::format(", beside the {} before it (waits for their flags)", l.overlaps) : "");
    launches_json += fmt::format("{}{{\"kernel\": \"{}\", \"grid\": [{}, {}, {}], \"overlaps\": {}}}",
                                 launches_json.empty() ? "" : ", ", l.kernel->name, l.grid[0], l.grid[1], l.grid[2],
                                 l.overlaps);
  }
  for (const auto& [name, t] : plan.tensors) {
    const auto bytes = t.nbytes();
    total += bytes;
    fmt::print("  tensor {:<16} {:<5} [{}] {:.3f} MB\n", name, dtype_name(t.dtype), fmt::join(t.shape, ", "), bytes / 1e6);
    tensors_json += fmt::format("{}\"{}\": {{\"dtype\": \"{}\", \"shape\": [{}], \"bytes\": {}}}",
                                tensors_json.empty() ? "" : ", ", name, dtype_name(t.dtype), fmt::join(t.shape, ", "), bytes);
  }
  fmt::print("device memory {:.3f} MB ({:.2f} KB per token)\n", total / 1e6, total / 1e3 / static_cast<double>(ps.B * ps.T));
  if (!call.json.empty())
    write_text_file(call.json, fmt::format("{{\"op\": \"{}\", \"backward\": {}, \"device_bytes\": {}, "
                                           "\"tensors\": {{{}}}, \"launches\": [{}]}}\n",
                                           op.name, opts.backward, total, tensors_json, launches_json));
  return 0;
}

int cmd_bench(const std::vector<std::string>& args) {
  if (args.empty() || is_help(args[0])) {
    fmt::print("{}", kBenchUsage);
    return args.empty() ? 1 : 0;
  }
  const OpDef& op = find_op(args[0]);
  SyntheticCall call;
  call.opts.device = Device::cuda;
  call.opts.dtype = DType::bf16;
  int iters = 50;
  std::optional<double> peak_gbs;
  std::optional<Config> bwd_config;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (is_help(a)) {
      fmt::print("{}", kBenchUsage);
      return 0;
    } else if (parse_synthetic_option(op, args, i, call)) {
      continue;
    } else if (a == "--bwd-config") {
      bwd_config = parse_config(value_of(args, i));
    } else if (a == "--iters") {
      iters = parse_int(a, value_of(args, i));
      if (iters < 1) usage_error("--iters must be at least 1");
    } else if (a == "--peak-gbs") {
      peak_gbs = parse_double(a, value_of(args, i));
      if (!(*peak_gbs > 0)) usage_error("--peak-gbs must be positive");
    } else {
      usage_error(fmt::format("unknown option '{}' for 'bench' (see linac bench --help)", a));
    }
  }
  if (!call.shape) usage_error("bench needs --shape B=..,T=..,H=..,K=..");
  if (bwd_config && !call.opts.backward) usage_error("--bwd-config configures the backward: add --backward");
  // --config configures the forward here; a key only the backward's kernels take belongs in --bwd-config
  // (the forward would refuse it with a list of its own keys, which does not say where it goes).
  for (const auto& [key, value] : call.opts.config)
    for (const auto& [name, help] : op.config_keys)
      if (name == key && help.starts_with("--backward"))
        usage_error(fmt::format("--config {}: a key of {}'s backward; bench's --config configures the forward: give "
                                "--backward --bwd-config {}={}",
                                key, op.name, key, value));
  const int64_t B = call.shape->B, T = call.shape->T, H = call.shape->H, K = call.shape->K, V = call.shape->V;
  const bool gated = call.gated, backward = call.opts.backward;
  const std::string& json = call.json;
  OpOptions opts = call.opts;
  opts.backward = false;  // the forward first; the backward after it
  ProblemShape ps{B, T, H, K, V, gated};
  TensorMap inputs = synthetic_inputs(op, ps, false);  // do joins them for the backward (the forward refuses it)
  check_op_options(op, call.opts);
  // The setup of a new process before its first launch, step by step: the CUDA driver and context,
  // the configuration (tuning database, or tuning), the op's inputs (q, k, v cast to the kernel dtype,
  // outputs allocated: proportional to the problem, paid by every call that passes fp32 arrays) and
  // the kernels (disk cache, or compiling). "To first launch" is all of it but the inputs.
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  auto t0 = clock::now();
  set_device_limits(opts);  // loads the driver
  auto t1 = clock::now();
  opts.config = autotuned_config(op, inputs, opts);
  auto t2 = clock::now();
  cast_qkv(inputs, opts.dtype);
  OpPlan plan = op.prepare(inputs, opts, {"o"});
  auto t3 = clock::now();
  prepare_kernels_on_gpu(plan);
  auto t4 = clock::now();
  const double first_launch_ms = ms(t0, t2) + ms(t3, t4);
  fmt::print(stderr,
             "linac bench: setup to first launch {:.1f} ms (CUDA init {:.1f} ms, configuration {:.1f} ms, kernels {:.1f} ms); "
             "inputs {:.1f} ms\n",
             first_launch_ms, ms(t0, t1), ms(t1, t2), ms(t3, t4), ms(t2, t3));
  BenchResult r = bench_on_gpu(plan, iters, /*per_launch=*/true);
  std::string config = config_str(opts.config);
  // The HBM floor: the plan's bytes at the peak memory bandwidth (unknown when the driver reports no
  // memory clock or bus width and --peak-gbs is not given).
  if (!peak_gbs && cuda::device_info().peak_memory_bytes_per_s() > 0)
    peak_gbs = cuda::device_info().peak_memory_bytes_per_s() / 1e9;
  const std::optional<double> floor_ms = peak_gbs ? std::optional(r.bytes / (*peak_gbs * 1e6)) : std::nullopt;
  const std::optional<double> fraction = floor_ms ? std::optional(*floor_ms / r.median_ms) : std::nullopt;
  fmt::print("{} B={} T={} H={} K={} V={} {}{} [{}]: median {:.4f} ms, min {:.4f} ms over {} runs ({} input sets), "
             "{:.1f} GB/s, {}\n",
             op.name, B, T, H, K, V, dtype_name(opts.dtype), gated ? " gated" : "", config, r.median_ms, r.min_ms,
             r.iters, r.rotations, r.bytes / (r.median_ms * 1e6),
             fraction ? fmt::format("{:.2f} of the HBM floor ({:.0f} GB/s peak)", *fraction, *peak_gbs)
                      : std::string("HBM floor unknown (the driver reports no peak bandwidth: pass --peak-gbs)"));
  // "name 0.1234 ms, ..." for each launch timed alone.
  auto kernel_times = [](const BenchResult& res) {
    std::string parts;
    for (const auto& [name, ms] : res.launch_ms) parts += fmt::format("{}{} {:.4f} ms", parts.empty() ? "" : ", ", name, ms);
    return parts;
  };
  if (!r.launch_ms.empty()) fmt::print("  per kernel (each timed alone, median): {}\n", kernel_times(r));
  // The backward: gradients of every differentiable input from a random do, at the backward kernels'
  // defaults or --bwd-config (the forward's tuned configuration has keys of its own kernels). For ops
  // whose forward can save intermediates for the backward (outputs saved_*: the delta rules, poly), the
  // training pair is timed: the forward saving them, then the backward given them; the backward that
  // recomputes them from the inputs alone is timed beside it.
  BenchResult rb, rs, rr;
  std::vector<std::string> saved;
  for (const auto& o : op.outputs)
    if (o.name.starts_with("saved_")) saved.push_back(o.name);
  auto in_parens = [&](const BenchResult& res) {
    const std::string parts = kernel_times(res);
    return parts.empty() ? parts : " (" + parts + ")";
  };
  if (backward) {
    inputs["do"] = synthetic_do(ps);
    OpOptions bo = opts;
    bo.config.clear();
    bo.backward = true;
    bo.config = bwd_config ? *bwd_config : autotuned_config(op, inputs, bo);  // `linac tune --backward`'s entry
    // The forward's keys that shape what it saves (poly's segment) hold for the backward too.
    for (const auto& key : op.saved_layout_keys)
      if (opts.config.count(key) && !bo.config.count(key)) bo.config[key] = opts.config.at(key);
    if (!saved.empty()) {
      OpPlan rplan = op.prepare(inputs, bo, synthetic_outputs(true, gated));
      rr = bench_on_gpu(rplan, iters, /*per_launch=*/true);
      fmt::print("backward recomputing the forward's intermediates [{}]: median {:.4f} ms{}\n", config_str(bo.config),
                 rr.median_ms, in_parens(rr));
      std::vector<std::string> wanted{"o"};
      wanted.insert(wanted.end(), saved.begin(), saved.end());
      TensorMap fwd_inputs = inputs;
      fwd_inputs.erase("do");
      OpPlan splan = op.prepare(fwd_inputs, opts, wanted);
      rs = bench_on_gpu(splan, iters, /*per_launch=*/true);
      fmt::print("forward saving {} for the backward: median {:.4f} ms{}\n", fmt::join(saved, ", "), rs.median_ms,
                 in_parens(rs));
      TensorMap got = run_op(op, fwd_inputs, opts, wanted);
      for (const auto& n : saved) inputs[n] = std::move(got.at(n));
      // Forward outputs the backward takes with them (poly's o).
      for (const auto& in : op.inputs)
        if (!inputs.count(in.name) && got.count(in.name)) inputs[in.name] = got.at(in.name);
      // The saved tensors fix the backward's chunk (the forward's).
      bo.config.erase("chunk");
    }
    OpPlan bplan = op.prepare(inputs, bo, synthetic_outputs(true, gated));
    rb = bench_on_gpu(bplan, iters, /*per_launch=*/true);
    const double fwd_ms = saved.empty() ? r.median_ms : rs.median_ms;
    fmt::print("backward{} [{}]: median {:.4f} ms{}; forward+backward {:.4f} ms; the backward's device memory {:.1f} MB "
               "(every tensor of the call: inputs{}, do, gradients, scratch)\n",
               saved.empty() ? "" : " from the saved tensors", config_str(bo.config), rb.median_ms, in_parens(rb),
               fwd_ms + rb.median_ms, rb.bytes / 1e6, saved.empty() ? "" : ", saved tensors");
  }
  if (!json.empty()) {
    auto number_or_null = [](const std::optional<double>& x) {
      return x ? fmt::format("{}", *x) : std::string("null");
    };
    std::string text = fmt::format(
        "{{\"op\": \"{}\", \"shape\": {{\"B\": {}, \"T\": {}, \"H\": {}, \"K\": {}, \"V\": {}}}, \"dtype\": \"{}\", "
        "\"gated\": {}, \"median_ms\": {}, \"min_ms\": {}, \"iters\": {}, \"rotations\": {}, \"bytes\": {}, "
        "\"floor_ms\": {}, \"peak_gbs\": {}, \"fraction_of_floor\": {}, \"config\": \"{}\", "
        "\"setup_ms\": {{\"to_first_launch\": {}, \"cuda_init\": {}, \"configuration\": {}, \"kernels\": {}, "
        "\"inputs\": {}}}}}\n",
        op.name, B, T, H, K, V, dtype_name(opts.dtype), gated, r.median_ms, r.min_ms, r.iters, r.rotations, r.bytes,
        number_or_null(floor_ms), number_or_null(peak_gbs), number_or_null(fraction), config, first_launch_ms,
        ms(t0, t1), ms(t1, t2), ms(t3, t4), ms(t2, t3));
    if (backward)
      text.insert(text.rfind('}'), fmt::format(", \"fwd_ms\": {}, \"bwd_ms\": {}, \"bwd_device_bytes\": {}",
                                               saved.empty() ? r.median_ms : rs.median_ms, rb.median_ms, rb.bytes));
    if (backward && !saved.empty())
      text.insert(text.rfind('}'), fmt::format(", \"saved_for_backward\": true, \"fwd_plain_ms\": {}, "
                                               "\"bwd_recompute_ms\": {}", r.median_ms, rr.median_ms));
    write_text_file(json, text);
  }
  return 0;
}

int64_t parse_size(const std::string& s) {
  if (s.empty()) usage_error("--max-size needs a value");
  int64_t mult = 1;
  std::string digits = s;
  switch (s.back()) {
    case 'K': case 'k': mult = int64_t{1} << 10; digits.pop_back(); break;
    case 'M': case 'm': mult = int64_t{1} << 20; digits.pop_back(); break;
    case 'G': case 'g': mult = int64_t{1} << 30; digits.pop_back(); break;
    default: break;
  }
  int64_t n = parse_int("--max-size", digits);
  if (n < 0) usage_error("--max-size must not be negative");
  return n * mult;
}

int cmd_cache(const std::vector<std::string>& args) {
  if (args.empty() || is_help(args[0])) {
    fmt::print("{}", kCacheUsage);
    return args.empty() ? 1 : 0;
  }
  const std::string& sub = args[0];
  DiskCache cache = DiskCache::open_default();
  if (sub == "ls") {
    if (args.size() > 1) usage_error(fmt::format("unknown option '{}' for 'cache ls'", args[1]));
    auto entries = cache.list();
    uint64_t total = 0;
    auto now = std::chrono::system_clock::now();
    for (const auto& e : entries) {
      total += e.size_bytes;
      std::string entry = "?";
      if (e.meta_json) {
        auto pos = e.meta_json->find("\"entry\":\"");
        if (pos != std::string::npos) {
          pos += 9;
          entry = e.meta_json->substr(pos, e.meta_json->find('"', pos) - pos);
        }
      }
      auto age = std::chrono::duration_cast<std::chrono::seconds>(now - e.mtime).count();
      fmt::print("{}  {:>9} bytes  {:>7}s ago  {}\n", e.key.substr(0, 16), e.size_bytes, age, entry);
    }
    fmt::print("{} entries, {} bytes in {}\n", entries.size(), total, cache.root().string());
    return 0;
  }
  if (sub == "clear") {
    if (args.size() > 1) usage_error(fmt::format("unknown option '{}' for 'cache clear'", args[1]));
    fmt::print("removed {} entries from {}\n", cache.clear(), cache.root().string());
    return 0;
  }
  if (sub == "prune") {
    int64_t max_size = -1;
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "--max-size")
        max_size = parse_size(value_of(args, i));
      else
        usage_error(fmt::format("unknown option '{}' for 'cache prune'", args[i]));
    }
    if (max_size < 0) usage_error("cache prune needs --max-size SIZE");
    if (!cache.prune(static_cast<uint64_t>(max_size)))
      fmt::print("another process is pruning {}; nothing done\n", cache.root().string());
    return 0;
  }
  usage_error(fmt::format("unknown cache command '{}' (ls, clear, prune)", sub));
}

int main_impl(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || is_help(args[0])) {
    fmt::print("{}", kUsage);
    return args.empty() ? 1 : 0;
  }
  std::string cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "list") return cmd_list();
  if (cmd == "run") return cmd_run(rest);
  if (cmd == "compile") return cmd_compile(rest);
  if (cmd == "bench") return cmd_bench(rest);
  if (cmd == "cache") return cmd_cache(rest);
  if (cmd == "tune") return cmd_tune(rest);
  if (cmd == "dump") return cmd_dump(rest);
  if (cmd == "plan") return cmd_plan(rest);
  usage_error(fmt::format("unknown command '{}' (commands: list, run, compile, dump, bench, tune, cache; see linac --help)", cmd));
}

/// One line: the first line of the message, so a multi-line message never breaks the contract.
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace
}  // namespace linac

int main(int argc, char** argv) {
  try {
    const int rc = linac::main_impl(argc, argv);
    // What went to standard output must have arrived (a full disk, a closed pipe).
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      fmt::print(stderr, "linac: error: cannot write to standard output: {}\n", std::strerror(errno));
      return 1;
    }
    return rc;
  } catch (const linac::UserError& e) {
    // One line by contract; LINAC_DEBUG=1 shows the whole message (e.g. a linker's log).
    const char* debug = std::getenv("LINAC_DEBUG");
    fmt::print(stderr, "linac: error: {}\n", debug && *debug == '1' ? e.what() : linac::first_line(e.what()));
    return 1;
  } catch (const linac::InternalError& e) {
    fmt::print(stderr, "linac: {}\n", linac::first_line(e.what()));
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "linac: internal error: {}\n", linac::first_line(e.what()));
    return 2;
  }
}
