// The linac command line: list ops, run them on .npy files, print their IR.
//
// Every failure the user can cause ends in exactly one line "linac: error: ..." on stderr and exit
// status 1; nothing is written unless the whole run succeeded. Bugs in linac exit with status 2.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/parser.h"
#include "compiler/ir/printer.h"
#include "compiler/nvptx/codegen.h"
#include "kernels/op.h"
#include "linac/error.h"
#include "runtime/executor.h"
#include "runtime/npy.h"

namespace linac {
namespace {

constexpr const char* kUsage = R"(usage: linac <command> [options]

commands:
  list                      list the ops of the library with their inputs and outputs
  run OP NAME=FILE.npy ...  run an op on .npy inputs, write .npy outputs (see 'linac run --help')
  compile OP|FILE.tir       print a stage of an op's kernels (see 'linac compile --help')

Environment: LINAC_DEVICE (default device for run: cpu or cuda).
)";

constexpr const char* kRunUsage = R"(usage: linac run OP NAME=FILE.npy ... -o NAME=FILE.npy [-o ...] [options]

Runs OP on the named inputs and writes the named outputs as float32 .npy files.
  -o NAME=FILE          an output to write (repeatable); at least one
  --device cpu|cuda     where to run (default: $LINAC_DEVICE or cpu = the CPU interpreter)
  --dtype fp32|bf16|fp16  precision the inputs are cast to before the kernel runs (default fp32)
  --chunk-size N        chunk size: 16, 32, 64 or 128 (default: the op's)
  --scale X             query scale (default K^-1/2)
Example:
  linac run linear_attn q=q.npy k=k.npy v=v.npy -o o=o.npy -o final_state=s.npy
)";

constexpr const char* kCompileUsage = R"(usage: linac compile OP|FILE.tir [--emit STAGE] [--dtype fp32|bf16|fp16] [--target sm_80|sm_90a]

Prints one stage of OP's kernels at their default configuration, or of a .tir file (parsed and
verified first). Needs no GPU.
  --emit STAGE          tir (default): the tile IR as recorded
                        layouts: the tile IR with the layout of every value
                        smem: the shared-memory plan
                        llvm: LLVM IR before optimization; llvm-opt: after O3
                        ptx: the PTX (with .loc lines pointing at the DSL source)
  --dtype D             input dtype the op's kernels are specialized for (default bf16)
  --target T            GPU architecture for the backend stages (default sm_90a)
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

HostTensor to_host(NpyArray a) { return HostTensor{a.dtype, std::move(a.shape), std::move(a.data)}; }

int cmd_list() {
  for (const auto& op : op_registry()) {
    fmt::print("{}  {}\n", op.name, op.summary);
    for (const auto& in : op.inputs)
      fmt::print("    in  {:<14} {:<10} {}{}\n", in.name, in.shape, in.help, in.required ? "" : " (optional)");
    for (const auto& out : op.outputs)
      fmt::print("    out {:<14} {:<10} {}{}\n", out.name, out.shape, out.help, out.required ? "" : " (optional)");
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
  for (const auto& [name, path] : output_files) {
    auto it = outputs.find(name);
    if (it == outputs.end()) throw InternalError(fmt::format("op {} did not produce output {}", op.name, name));
    HostTensor f = it->second.cast(DType::f32);
    write_npy(path, NpyArray{f.dtype, f.shape, std::move(f.data)});
  }
  return 0;
}

int cmd_compile(const std::vector<std::string>& args) {
  if (args.empty() || is_help(args[0])) {
    fmt::print("{}", kCompileUsage);
    return args.empty() ? 1 : 0;
  }
  std::string emit = "tir";
  DType dtype = DType::bf16;
  nvptx::GpuTarget target;
  for (size_t i = 1; i < args.size(); ++i) {
    if (is_help(args[i])) {
      fmt::print("{}", kCompileUsage);
      return 0;
    } else if (args[i] == "--emit") {
      emit = value_of(args, i);
    } else if (args[i] == "--dtype") {
      dtype = parse_input_dtype(value_of(args, i));
    } else if (args[i] == "--target") {
      std::string t = value_of(args, i);
      if (t == "sm_80")
        target.sm = 80;
      else if (t == "sm_90a" || t == "sm_90")
        target.sm = 90;
      else
        usage_error(fmt::format("--target {}: expected sm_80 or sm_90a", t));
    } else {
      usage_error(fmt::format("unknown option '{}' for 'compile' (see linac compile --help)", args[i]));
    }
  }
  static const char* kStages[] = {"tir", "layouts", "smem", "llvm", "llvm-opt", "ptx"};
  if (std::find(std::begin(kStages), std::end(kStages), emit) == std::end(kStages))
    usage_error(fmt::format("--emit {}: expected one of tir, layouts, smem, llvm, llvm-opt, ptx", emit));
  auto print_stage = [&](const ir::Kernel& k) {
    if (emit == "tir") {
      fmt::print("{}", ir::print(k));
      return;
    }
    nvptx::CompiledKernel c = nvptx::compile_kernel(k, target);
    const std::string& text = emit == "layouts"  ? c.tir_layouts
                              : emit == "smem"   ? c.smem_plan
                              : emit == "llvm"   ? c.llvm_ir
                              : emit == "llvm-opt" ? c.llvm_ir_opt
                                                 : c.ptx;
    fmt::print("{}", text);
  };
  if (args[0].ends_with(".tir")) {
    std::FILE* f = std::fopen(args[0].c_str(), "rb");
    if (!f) usage_error(fmt::format("{}: cannot open", args[0]));
    std::string text;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
    print_stage(*ir::parse(text, args[0]));
    return 0;
  }
  for (const auto& k : find_op(args[0]).default_kernels(dtype)) print_stage(*k);
  return 0;
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
  usage_error(fmt::format("unknown command '{}' (commands: list, run, compile; see linac --help)", cmd));
}

/// One line: the first line of the message, so a multi-line message never breaks the contract.
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace
}  // namespace linac

int main(int argc, char** argv) {
  try {
    return linac::main_impl(argc, argv);
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
