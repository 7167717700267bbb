// The C ABI (linac/linac.h) over the C++ ops API (linac/ops.h): argument translation, status codes and
// the per-thread last error. No exception crosses the boundary.
#include "linac/linac.h"

#include <array>
#include <dlfcn.h>
#include <fmt/format.h>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "kernels/op.h"
#include "linac/ops.h"
#include "runtime/cuda_driver.h"
#include "runtime/user_ops.h"

namespace {

using linac::DType;
namespace ops = linac::ops;

thread_local std::string g_last_error;
thread_local std::string g_describe;
thread_local std::string g_loaded_ops;

/// Runs `f`, turning every exception into a status and the last error.
template <class F>
linac_status guarded(F&& f) {
  try {
    g_last_error.clear();
    f();
    return LINAC_OK;
  } catch (const linac::UserError& e) {
    g_last_error = e.what();
    const bool no_gpu = g_last_error.find("no CUDA driver") != std::string::npos ||
                        g_last_error.find("CUDA tensors given, but") != std::string::npos;
    return no_gpu ? LINAC_ERROR_NO_GPU : LINAC_ERROR_INVALID;
  } catch (const linac::InternalError& e) {
    g_last_error = e.what();
  } catch (const std::bad_alloc&) {
    g_last_error = "out of host memory";
  } catch (const std::exception& e) {
    g_last_error = fmt::format("linac internal error: {}", e.what());
  } catch (...) {
    g_last_error = "linac internal error: unknown exception";
  }
  return LINAC_ERROR_INTERNAL;
}

DType to_dtype(int32_t code, const char* name) {
  switch (code) {
    case LINAC_F32: return DType::f32;
    case LINAC_F16: return DType::f16;
    case LINAC_BF16: return DType::bf16;
    case LINAC_F64: return DType::f64;
    case LINAC_I32: return DType::i32;
    case LINAC_I64: return DType::i64;
  }
  throw linac::UserError(fmt::format("tensor '{}' has unknown dtype code {}", name, code));
}

int32_t from_dtype(DType t) {
  switch (t) {
    case DType::f32: return LINAC_F32;
    case DType::f16: return LINAC_F16;
    case DType::bf16: return LINAC_BF16;
    case DType::f64: return LINAC_F64;
    case DType::i32: return LINAC_I32;
    case DType::i64: return LINAC_I64;
    case DType::i1: break;
  }
  throw linac::InternalError("an op output of dtype i1");
}

ops::Tensors to_tensors(const linac_named_tensor* ts, int n, const char* what) {
  if (n < 0) throw linac::UserError(fmt::format("negative number of {}", what));
  if (n > 0 && ts == nullptr) throw linac::UserError(fmt::format("{} is null but its count is {}", what, n));
  ops::Tensors out;
  for (int i = 0; i < n; ++i) {
    const char* name = ts[i].name;
    if (name == nullptr) throw linac::UserError(fmt::format("{} {} has no name", what, i));
    const linac_tensor& t = ts[i].tensor;
    if (t.ndim < 0 || t.ndim > 8) throw linac::UserError(fmt::format("tensor '{}' has {} dimensions", name, t.ndim));
    if (t.ndim > 0 && t.shape == nullptr) throw linac::UserError(fmt::format("tensor '{}' has no shape", name));
    ops::Tensor r;
    r.data = t.data;
    r.dtype = to_dtype(t.dtype, name);
    r.shape.assign(t.shape, t.shape + t.ndim);
    if (t.strides) r.strides.assign(t.strides, t.strides + t.ndim);
    if (t.device_type == LINAC_DEVICE_CPU)
      r.memory = ops::Memory::host;
    else if (t.device_type == LINAC_DEVICE_CUDA)
      r.memory = ops::Memory::cuda, r.device = t.device_id;
    else
      throw linac::UserError(fmt::format("tensor '{}' has device type {}; linac takes CPU (1) or CUDA (2) memory", name,
                                         t.device_type));
    if (!out.emplace(name, std::move(r)).second)
      throw linac::UserError(fmt::format("{} name '{}' more than once", what, name));
  }
  return out;
}

/// An allocator that forwards to the caller's C functions.
class CAllocator final : public ops::Allocator {
 public:
  explicit CAllocator(const linac_allocator& a) : a_(a) {}
  void* allocate(std::size_t bytes, ops::Stream stream) override {
    void* p = a_.allocate(a_.ctx, bytes, stream);
    if (p == nullptr) throw linac::UserError(fmt::format("the caller's allocator returned null for {} bytes", bytes));
    return p;
  }
  void deallocate(void* p, std::size_t bytes, ops::Stream stream) override { a_.deallocate(a_.ctx, p, bytes, stream); }

 private:
  linac_allocator a_;
};

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", c);
      continue;
    }
    out += c;
  }
  return out;
}

std::string describe_op(const linac::OpDef& op) {
  auto args = [](const std::vector<linac::OpArgSpec>& specs) {
    std::string s;
    for (const auto& a : specs)
      s += fmt::format("{}{{\"name\": \"{}\", \"required\": {}, \"shape\": \"{}\", \"help\": \"{}\"}}", s.empty() ? "" : ", ",
                       a.name, a.required, a.shape, json_escape(a.help));
    return s;
  };
  std::string flags, keys;
  for (const auto& f : op.flags) flags += fmt::format("{}\"{}\"", flags.empty() ? "" : ", ", f);
  for (const auto& [k, help] : op.config_keys)
    keys += fmt::format("{}{{\"name\": \"{}\", \"help\": \"{}\"}}", keys.empty() ? "" : ", ", k, json_escape(help));
  return fmt::format("{{\"name\": \"{}\", \"summary\": \"{}\", \"inputs\": [{}], \"outputs\": [{}], \"flags\": [{}], "
                     "\"config\": [{}], \"gradient_op\": \"{}\"}}",
                     op.name, json_escape(op.summary), args(op.inputs), args(op.outputs), flags, keys,
                     json_escape(op.gradient_op));
}

}  // namespace

/// ops::Call with the caller's argument order (linac_call_run's addresses) mapped to the call's.
struct linac_call {
  ops::Call call;
  std::vector<int> input_from, output_from;  // the call's argument i is the caller's address [i]
};

extern "C" {

int linac_abi_version(void) { return LINAC_ABI_VERSION; }

const char* linac_version(void) { return "0.1.0"; }

const char* linac_last_error(void) { return g_last_error.c_str(); }

int linac_gpu_available(void) {
  std::string why;
  const bool ok = linac::cuda::driver_available(&why);
  g_last_error = ok ? std::string() : why;
  return ok ? 1 : 0;
}

linac_status linac_op_run(const char* op, const char* options, const linac_named_tensor* inputs, int n_inputs,
                          const linac_named_tensor* outputs, int n_outputs, void* stream,
                          const linac_allocator* allocator) {
  return guarded([&] {
    if (op == nullptr) throw linac::UserError("op name is null");
    if (allocator && (allocator->allocate == nullptr || allocator->deallocate == nullptr))
      throw linac::UserError("the allocator lacks its allocate or deallocate function");
    const ops::Options o = ops::Options::parse(options ? options : "");
    const ops::Tensors in = to_tensors(inputs, n_inputs, "inputs");
    const ops::Tensors out = to_tensors(outputs, n_outputs, "outputs");
    if (allocator) {
      CAllocator a(*allocator);
      ops::run(op, in, out, o, stream, &a);
    } else {
      ops::run(op, in, out, o, stream, nullptr);
    }
  });
}

linac_status linac_call_prepare(const char* op, const char* options, const linac_named_tensor* inputs, int n_inputs,
                                const linac_named_tensor* outputs, int n_outputs, linac_call** call) {
  return guarded([&] {
    if (op == nullptr) throw linac::UserError("op name is null");
    if (call == nullptr) throw linac::UserError("null result pointer");
    *call = nullptr;
    auto c = std::make_unique<linac_call>();
    c->call = ops::Call::prepare(op, to_tensors(inputs, n_inputs, "inputs"), to_tensors(outputs, n_outputs, "outputs"),
                                 ops::Options::parse(options ? options : ""));
    auto position = [](const linac_named_tensor* ts, int n, const std::string& name) {
      for (int i = 0; i < n; ++i)
        if (name == ts[i].name) return i;
      throw linac::InternalError(fmt::format("prepared argument '{}' is not among the caller's", name));
    };
    for (const auto& name : c->call.input_names()) c->input_from.push_back(position(inputs, n_inputs, name));
    for (const auto& name : c->call.output_names())
      c->output_from.push_back(n_inputs + position(outputs, n_outputs, name));
    *call = c.release();
  });
}

linac_status linac_call_run(const linac_call* call, void* const* data, void* stream, void* workspace,
                            const linac_allocator* allocator) {
  return guarded([&] {
    if (call == nullptr || data == nullptr) throw linac::UserError("null call or address array");
    if (allocator && (allocator->allocate == nullptr || allocator->deallocate == nullptr))
      throw linac::UserError("the allocator lacks its allocate or deallocate function");
    constexpr size_t kMax = 64;  // Call::prepare refuses more arguments
    std::array<void*, kMax> in, out;
    const size_t n_in = call->input_from.size(), n_out = call->output_from.size();
    for (size_t i = 0; i < n_in; ++i) in[i] = data[call->input_from[i]];
    for (size_t i = 0; i < n_out; ++i) out[i] = data[call->output_from[i]];
    const std::span<void* const> ins(in.data(), n_in), outs(out.data(), n_out);
    if (allocator) {
      CAllocator a(*allocator);
      call->call.run(ins, outs, stream, &a, workspace);
    } else {
      call->call.run(ins, outs, stream, nullptr, workspace);
    }
  });
}

size_t linac_call_workspace_bytes(const linac_call* call) { return call ? call->call.workspace_bytes() : 0; }

void linac_call_destroy(linac_call* call) { delete call; }

linac_status linac_op_output_shape(const char* op, const char* options, const linac_named_tensor* inputs, int n_inputs,
                                   const char* output, int32_t* ndim, int64_t shape[8], int32_t* dtype) {
  return guarded([&] {
    if (op == nullptr || output == nullptr) throw linac::UserError("op or output name is null");
    if (ndim == nullptr || shape == nullptr || dtype == nullptr) throw linac::UserError("null result pointer");
    const ops::OutputSpec spec = ops::output_spec(op, to_tensors(inputs, n_inputs, "inputs"), output,
                                                  ops::Options::parse(options ? options : ""));
    if (spec.shape.size() > 8) throw linac::InternalError("an output of more than 8 dimensions");
    *ndim = static_cast<int32_t>(spec.shape.size());
    for (size_t i = 0; i < spec.shape.size(); ++i) shape[i] = spec.shape[i];
    *dtype = from_dtype(spec.dtype);
  });
}

linac_status linac_load_ops(const char* path) {
  return guarded([&] {
    if (path == nullptr) throw linac::UserError("library path is null");
    static std::mutex one_load_at_a_time;  // the report collects what one library's initializers did
    std::lock_guard lock(one_load_at_a_time);
    linac::take_user_op_load_report();
    // RTLD_LOCAL: the ops register themselves from the library's static initializers; nothing of it
    // needs to be visible to libraries loaded later. Never closed: its ops live until the process exits.
    if (dlopen(path, RTLD_NOW | RTLD_LOCAL) == nullptr) {
      const char* why = dlerror();
      throw linac::UserError(fmt::format("cannot load {}: {}", path, why ? why : "unknown error"));
    }
    const linac::UserOpLoadReport report = linac::take_user_op_load_report();
    if (!report.errors.empty()) throw linac::UserError(fmt::format("{}: {}", path, report.errors));
    g_loaded_ops = fmt::format("{}", fmt::join(report.ops, ","));
  });
}

const char* linac_loaded_ops(void) { return g_loaded_ops.c_str(); }

const char* linac_op_describe(const char* op) {
  const linac_status s = guarded([&] {
    if (op != nullptr) {
      g_describe = describe_op(linac::find_op(op));
      return;
    }
    std::string all;
    for (const linac::OpDef* d : linac::all_ops()) all += (all.empty() ? "" : ", ") + describe_op(*d);
    g_describe = "[" + all + "]";
  });
  if (s != LINAC_OK) g_describe.clear();
  return g_describe.c_str();
}

}  // extern "C"
