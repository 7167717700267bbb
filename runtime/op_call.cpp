#include "runtime/op_call.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <fmt/format.h>
#include <mutex>
#include <set>
#include <unordered_map>

#include "compiler/ir/ir.h"
#include "kernels/common/elementwise.h"
#include "runtime/autotune.h"
#include "runtime/executor.h"
#include "runtime/gpu_kernel.h"

namespace linac {

enum class SlotKind { input, converted, output, constant, scratch };

struct Slot {
  SlotKind kind = SlotKind::scratch;
  int arg = -1;        // input / output: the caller's argument (index into PreparedCall::inputs / outputs)
  int64_t offset = 0;  // converted / scratch: offset in the workspace
  const HostTensor* constant = nullptr;  // constant: the plan's host data
};

/// A call prepared for one key. Its arguments are the caller's tensors in name order (cu_seqlens_cpu
/// aside: a host copy of values the plan already holds); a call binds their addresses by position.
struct PreparedCall {
  const OpDef* op = nullptr;
  ops::Memory memory = ops::Memory::host;
  std::vector<std::string> inputs, outputs;
  std::vector<int64_t> input_numel, output_numel;
  OpPlan plan;
  ResolvedPlan resolved;
  std::vector<Slot> slots;
  std::vector<cuda::DeviceBuffer> constants;  // per slot; allocated for constant slots on the GPU
  int64_t workspace_bytes = 0;
};

namespace {

// An op has a few dozen arguments at most; a call's addresses live on the stack.
constexpr size_t kMaxArgs = 64;

constexpr int64_t kAlign = 256;  // workspace slots start at this alignment (kernels need 16 bytes)
constexpr const char* kHostSeqlens = "cu_seqlens_cpu";

int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// ---------------------------------------------------------------------------------------------
// Checking the caller's tensors

void check_tensor(const std::string& role, const std::string& name, const ops::Tensor& t) {
  for (int64_t d : t.shape)
    if (d < 0) throw UserError(fmt::format("{} '{}' has a negative dimension: {}", role, name, shape_text(t.shape)));
  if (t.data == nullptr && t.numel() > 0) throw UserError(fmt::format("{} '{}' has no data (null pointer)", role, name));
  if (!t.strides.empty()) {
    if (t.strides.size() != t.shape.size())
      throw UserError(fmt::format("{} '{}' has {} strides for {} dimensions", role, name, t.strides.size(), t.shape.size()));
    int64_t expect = 1;
    for (int i = static_cast<int>(t.shape.size()) - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expect)
        throw UserError(fmt::format("{} '{}' is not contiguous (shape {}, strides {}); linac needs contiguous, "
                                    "row-major tensors (e.g. call .contiguous() first)",
                                    role, name, shape_text(t.shape), shape_text(t.strides)));
      expect *= t.shape[i];
    }
  }
  if (t.memory == ops::Memory::cuda && reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    throw UserError(fmt::format("{} '{}' is not 16-byte aligned (address {}); linac's kernels load 16 bytes at a "
                                "time: pass a tensor that starts at an aligned address (e.g. a fresh allocation)",
                                role, name, t.data));
}

/// The memory space of the call: every tensor's (cu_seqlens_cpu aside, which is host memory by definition).
ops::Memory call_memory(const ops::Tensors& inputs, const ops::Tensors& outputs) {
  std::optional<ops::Memory> m;
  std::string first;
  int device = 0;
  auto visit = [&](const std::string& role, const std::string& name, const ops::Tensor& t) {
    if (name == kHostSeqlens) {
      if (t.memory != ops::Memory::host) throw UserError("cu_seqlens_cpu must be in host memory");
      return;
    }
    if (!m) {
      m = t.memory, first = name, device = t.device;
      return;
    }
    if (t.memory != *m)
      throw UserError(fmt::format("{} '{}' is in {} memory but '{}' is in {} memory; pass every tensor on one device",
                                  role, name, t.memory == ops::Memory::cuda ? "CUDA" : "host", first,
                                  *m == ops::Memory::cuda ? "CUDA" : "host"));
    if (t.memory == ops::Memory::cuda && t.device != device)
      throw UserError(fmt::format("{} '{}' is on CUDA device {} but '{}' on device {}", role, name, t.device, first, device));
  };
  for (const auto& [name, t] : inputs) visit("input", name, t);
  for (const auto& [name, t] : outputs) visit("output", name, t);
  if (!m) throw UserError("an op call needs at least one input");
  return *m;
}

// Keys are raw bytes, not text: an op call builds one per call, and formatting numbers would cost more
// than the rest of the call's host work.
void append_raw(std::string& key, const void* p, size_t n) { key.append(static_cast<const char*>(p), n); }
template <class T>
void append_value(std::string& key, const T& x) {
  append_raw(key, &x, sizeof x);
}
void append_name(std::string& key, const std::string& name) { key.append(name.c_str(), name.size() + 1); }

void append_options(std::string& key, const ops::Options& o) {
  const uint8_t flags = static_cast<uint8_t>(o.backward | o.recurrent << 1 | o.normalize << 2 | o.no_normalize << 3 |
                                             o.l2norm_qk << 4);
  append_value(key, flags);
  for (const auto* x : {&o.scale, &o.a, &o.b, &o.c, &o.noise_dropout}) {
    append_value(key, static_cast<uint8_t>(x->has_value()));
    if (x->has_value()) append_value(key, **x);
  }
  append_value(key, o.seed);
  append_value(key, o.chunk_size.value_or(0));
  for (const auto& [k, v] : o.config) append_name(key, k), append_value(key, v);
  key.push_back('|');
}

void append_tensor(std::string& key, const std::string& name, const ops::Tensor& t) {
  append_name(key, name);
  append_value(key, static_cast<uint8_t>(t.dtype));
  append_value(key, static_cast<uint8_t>(t.shape.size()));
  append_raw(key, t.shape.data(), t.shape.size() * sizeof(int64_t));
}

/// The host values of cu_seqlens (int32 or int64): from cu_seqlens_cpu when given, else read from
/// the caller's tensor (in device memory: after the work queued on `stream`, which may be writing it).
HostTensor seqlens_values(const ops::Tensors& inputs, ops::Stream stream = nullptr) {
  auto it = inputs.find(kHostSeqlens);
  const bool from_host_copy = it != inputs.end();
  if (!from_host_copy) it = inputs.find("cu_seqlens");
  const ops::Tensor& t = it->second;
  if (t.dtype != DType::i32 && t.dtype != DType::i64)
    throw UserError(fmt::format("{} has dtype {}, expected int32 or int64", it->first, dtype_name(t.dtype)));
  HostTensor h = HostTensor::zeros(t.dtype, t.shape);
  if (h.nbytes() == 0) return h;
  if (t.memory == ops::Memory::host) {
    std::memcpy(h.materialize(), t.data, static_cast<size_t>(h.nbytes()));
  } else {
    cuda::synchronize(reinterpret_cast<cuda::Stream>(stream));
    cuda::copy_to_host(h.materialize(), reinterpret_cast<cuda::DevicePtr>(t.data), static_cast<size_t>(h.nbytes()));
  }
  if (from_host_copy) {
    auto dev = inputs.find("cu_seqlens");
    if (dev == inputs.end()) throw UserError("cu_seqlens_cpu given without cu_seqlens");
    if (dev->second.shape != t.shape)
      throw UserError(fmt::format("cu_seqlens_cpu has shape {} but cu_seqlens {}", shape_text(t.shape),
                                  shape_text(dev->second.shape)));
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// Prepared calls

/// Plan tensors some launch stores to: an input among them is copied before the call, so that the
/// caller's tensor stays as given (noise-dropout's backward scales do in place).
std::set<std::string> written_tensors(const OpPlan& plan) {
  std::set<std::string> written;
  for (const auto& l : plan.launches)
    for (const auto& param : ir::stored_params(*l.kernel))
      if (auto it = l.tensors.find(param); it != l.tensors.end()) written.insert(it->second);
  return written;
}

/// The kernels' dtype: q's (every library op has q: its prepare names it when missing), else, for a user's
/// op without q, its first floating input's.
DType kernel_dtype(const ops::Tensors& inputs) {
  auto q = inputs.find("q");
  if (q == inputs.end()) {
    for (const auto& [name, t] : inputs)
      if (t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16) return t.dtype;
    return DType::f32;
  }
  const DType t = q->second.dtype;
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16)
    throw UserError(fmt::format("q has dtype {}; linac's kernels run in float32, bfloat16 or float16", dtype_name(t)));
  return t;
}

void check_argument_names(const OpDef& op, const ops::Tensors& inputs, const ops::Tensors& outputs) {
  auto known = [](const std::vector<OpArgSpec>& specs, const std::string& name) {
    return std::any_of(specs.begin(), specs.end(), [&](const OpArgSpec& s) { return s.name == name; });
  };
  auto names = [](const std::vector<OpArgSpec>& specs) {
    std::vector<std::string> n;
    for (const auto& s : specs) n.push_back(s.name);
    return fmt::format("{}", fmt::join(n, ", "));
  };
  for (const auto& [name, t] : inputs)
    if (name != kHostSeqlens && !known(op.inputs, name))
      throw UserError(fmt::format("{} has no input '{}' (inputs: {})", op.name, name, names(op.inputs)));
  for (const auto& [name, t] : outputs)
    if (!known(op.outputs, name))
      throw UserError(fmt::format("{} has no output '{}' (outputs: {})", op.name, name, names(op.outputs)));
}

/// The call's inputs as a plan sees them: shapes alone (each tensor remembering the input it stands for),
/// cu_seqlens with its values.
TensorMap shape_only(const ops::Tensors& inputs) {
  TensorMap meta;
  for (const auto& [name, t] : inputs) {
    if (name == kHostSeqlens) continue;
    meta[name] = name == "cu_seqlens" ? seqlens_values(inputs) : HostTensor::zeros(t.dtype, t.shape);
    if (name != "cu_seqlens") meta[name].input = name;
  }
  return meta;
}

std::shared_ptr<PreparedCall> prepare_call(const OpDef& op, const ops::Tensors& inputs, const ops::Tensors& outputs,
                                           const ops::Options& options, ops::Memory memory) {
  auto call = std::make_shared<PreparedCall>();
  call->op = &op;
  call->memory = memory;
  for (const auto& [name, t] : inputs) {
    if (name == kHostSeqlens) continue;
    call->inputs.push_back(name);
    call->input_numel.push_back(t.numel());
  }
  for (const auto& [name, t] : outputs) {
    call->outputs.push_back(name);
    call->output_numel.push_back(t.numel());
  }
  if (call->inputs.size() > kMaxArgs || call->outputs.size() > kMaxArgs)
    throw UserError(fmt::format("{}: more than {} inputs or outputs", op.name, kMaxArgs));
  auto index = [](const std::vector<std::string>& names, const std::string& name) {
    return static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  OpOptions opts = to_op_options(options);
  opts.dtype = kernel_dtype(inputs);
  opts.device = memory == ops::Memory::cuda ? Device::cuda : Device::cpu;
  set_device_limits(opts);
  check_op_options(op, opts);
  std::vector<std::string> wanted;
  for (const auto& [name, t] : outputs) wanted.push_back(name);
  const TensorMap meta = shape_only(inputs);
  if (opts.device == Device::cuda) opts.config = autotuned_config(op, meta, opts, wanted);
  call->plan = op.prepare(meta, opts, wanted);
  OpPlan& plan = call->plan;

  // Plan tensor -> the caller's output. An output the plan offers but the caller did not ask for is
  // scratch like the rest (it has no caller buffer).
  std::map<std::string, std::string> output_of;
  for (const auto& [output, tensor] : plan.outputs)
    if (std::any_of(outputs.begin(), outputs.end(), [&](const auto& o) { return o.first == output; }))
      output_of[tensor] = output;
  for (const auto& [name, t] : outputs) {
    auto it = plan.outputs.find(name);
    if (it == plan.outputs.end())
      throw UserError(fmt::format("{} does not produce '{}' with these options{}", op.name, name,
                                  opts.backward ? "" : " (gradients need backward=1)"));
    const HostTensor& p = plan.tensors.at(it->second);
    if (p.dtype != t.dtype || p.shape != t.shape)
      throw UserError(fmt::format("output '{}' is {} {}, but {} writes {} {} there", name, dtype_name(t.dtype),
                                  shape_text(t.shape), op.name, dtype_name(p.dtype), shape_text(p.shape)));
  }

  // Homes of the plan's tensors: scratch first in the workspace, then conversions.
  std::map<std::string, int> slot_of;
  std::vector<std::string> converted;
  const std::set<std::string> written = written_tensors(plan);
  for (const auto& [name, t] : plan.tensors) {
    Slot s;
    if (auto o = output_of.find(name); o != output_of.end()) {
      s.kind = SlotKind::output, s.arg = index(call->outputs, o->second);
    } else if (!t.input.empty() && !t.materialized()) {
      const ops::Tensor& in = inputs.at(t.input);
      if (in.shape != t.shape)
        throw InternalError(fmt::format("{} plans its input {} as {} ({}), given {}", op.name, t.input, t.shape_str(), name,
                                        shape_text(in.shape)));
      const bool in_place = in.dtype == t.dtype && !written.count(name);
      s.kind = in_place ? SlotKind::input : SlotKind::converted, s.arg = index(call->inputs, t.input);
      if (s.kind == SlotKind::converted) converted.push_back(name);
    } else if (t.materialized() && t.nbytes() > 0) {
      // Constants are shared by every call at the key (and every thread): no launch may write them.
      if (written.count(name))
        throw InternalError(fmt::format("{}: a launch writes {}, a table the plan made on the host", op.name, name));
      s.kind = SlotKind::constant, s.constant = &t;
    } else {
      s.kind = SlotKind::scratch, s.offset = call->workspace_bytes;
      call->workspace_bytes += align_up(std::max<int64_t>(t.nbytes(), 16));
    }
    slot_of[name] = static_cast<int>(call->slots.size());
    call->slots.push_back(s);
  }
  for (const auto& name : converted) {
    call->slots[slot_of[name]].offset = call->workspace_bytes;
    call->workspace_bytes += align_up(std::max<int64_t>(plan.tensors.at(name).nbytes(), 16));
  }

  call->resolved = resolve_plan(plan, slot_of);
  // Conversions run first: each reads the caller's tensor (a slot of its own) into the converted slot.
  std::vector<ResolvedPlan::Launch> conversions;
  for (const auto& name : converted) {
    const HostTensor& t = plan.tensors.at(name);
    const DType from = inputs.at(t.input).dtype;
    const int source = static_cast<int>(call->slots.size());
    call->slots.push_back(Slot{SlotKind::input, index(call->inputs, t.input), 0, nullptr});
    const std::vector<int64_t> flat = {t.numel()};
    ResolvedPlan::Launch l;
    l.kernel = convert_kernel(from, t.dtype);
    l.grid = convert_grid(t.numel());
    l.params = {ResolvedPlan::TensorParam{source, from, flat}, ResolvedPlan::TensorParam{slot_of[name], t.dtype, flat}};
    conversions.push_back(std::move(l));
  }
  call->resolved.launches.insert(call->resolved.launches.begin(), conversions.begin(), conversions.end());

  if (memory == ops::Memory::cuda) {
    call->resolved.prepare_gpu();
    call->constants.resize(call->slots.size());
    for (size_t i = 0; i < call->slots.size(); ++i) {
      const Slot& s = call->slots[i];
      if (s.kind != SlotKind::constant) continue;
      call->constants[i] = cuda::DeviceBuffer(static_cast<size_t>(s.constant->nbytes()));
      call->constants[i].copy_from_host(s.constant->data.data(), s.constant->data.size());
    }
  }
  return call;
}

std::atomic<int64_t> g_prepared{0};

/// Prepared calls by key. Bounded: a process that keeps making new keys (varlen batches of ever new
/// lengths) starts over rather than growing without end.
class CallCache {
 public:
  std::shared_ptr<PreparedCall> find(const std::string& key) {
    std::lock_guard lock(mu_);
    auto it = calls_.find(key);
    return it == calls_.end() ? nullptr : it->second;
  }
  void insert(const std::string& key, std::shared_ptr<PreparedCall> call) {
    std::lock_guard lock(mu_);
    if (calls_.size() >= kMaxCalls) calls_.clear();
    calls_.emplace(key, std::move(call));
  }

 private:
  static constexpr size_t kMaxCalls = 4096;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<PreparedCall>> calls_;
};

CallCache& call_cache() {
  static CallCache* cache = new CallCache;  // never destroyed: calls may come from other static destructors
  return *cache;
}

std::string call_key(const OpDef& op, const ops::Tensors& inputs, const ops::Tensors& outputs,
                     const ops::Options& options, ops::Memory memory, ops::Stream stream) {
  std::string key;
  key.reserve(512);
  append_name(key, op.name);
  append_value(key, &op);  // an op added again under its name (a reloaded user op) is another op
  key.push_back(memory == ops::Memory::cuda ? 'g' : 'c');
  append_options(key, options);
  for (const auto& [name, t] : inputs)
    if (name != kHostSeqlens) append_tensor(key, name, t);
  key.push_back('>');
  for (const auto& [name, t] : outputs) append_tensor(key, name, t);
  if (inputs.count("cu_seqlens")) {
    HostTensor cu = seqlens_values(inputs, stream);
    key.push_back('#');
    append_raw(key, cu.data.data(), cu.data.size());
    append_value(key, static_cast<uint8_t>(cu.dtype));
  }
  return key;
}

/// The address of every slot of `call`: the caller's inputs and outputs, the constants (the plan's host
/// data, or their device copies on the GPU), converted inputs and scratch at their offsets from `base`.
void bind_slots(const PreparedCall& call, std::span<void* const> in, std::span<void* const> out, uintptr_t base,
                uintptr_t* slots) {
  for (size_t i = 0; i < call.slots.size(); ++i) {
    const Slot& s = call.slots[i];
    switch (s.kind) {
      case SlotKind::input: slots[i] = reinterpret_cast<uintptr_t>(in[s.arg]); break;
      case SlotKind::output: slots[i] = reinterpret_cast<uintptr_t>(out[s.arg]); break;
      case SlotKind::constant:
        slots[i] = call.memory == ops::Memory::cuda ? call.constants[i].ptr()
                                                    : reinterpret_cast<uintptr_t>(s.constant->data.data());
        break;
      case SlotKind::converted:
      case SlotKind::scratch: slots[i] = base + static_cast<uintptr_t>(s.offset); break;
    }
  }
}

/// Runs a prepared call on the caller's addresses (`in`, `out`: in the call's argument order). GPU scratch
/// is `workspace` when given (at least call.workspace_bytes), else from `allocator`.
void run_prepared(const PreparedCall& call, std::span<void* const> in, std::span<void* const> out, ops::Stream stream,
                  ops::Allocator* allocator, void* workspace = nullptr) {
  const size_t n = call.slots.size();
  if (call.memory == ops::Memory::host) {
    // Scratch holds whatever the allocator gives on the GPU; here it starts as NaN (all bytes 0xFF), so
    // that a kernel reading scratch it did not write fails the CPU tests rather than passing on zeros.
    std::vector<uint8_t> host_workspace(static_cast<size_t>(call.workspace_bytes), 0xFF);
    std::vector<uintptr_t> addresses(n);
    bind_slots(call, in, out, reinterpret_cast<uintptr_t>(host_workspace.data()), addresses.data());
    std::vector<void*> slots(n);
    for (size_t i = 0; i < n; ++i) slots[i] = reinterpret_cast<void*>(addresses[i]);
    run_on_cpu(call.resolved, slots);
    return;
  }
  ops::Allocator& alloc = allocator ? *allocator : ops::default_allocator();
  const bool allocate = workspace == nullptr && call.workspace_bytes > 0;
  if (allocate) {
    workspace = alloc.allocate(static_cast<size_t>(call.workspace_bytes), stream);
    if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
      throw UserError(fmt::format("the allocator returned {} for {} bytes of scratch; linac needs 16-byte aligned memory",
                                  workspace, call.workspace_bytes));
  }
  struct Release {
    ops::Allocator& alloc;
    void* p;
    size_t bytes;
    ops::Stream stream;
    ~Release() {
      try {
        if (p) alloc.deallocate(p, bytes, stream);
      } catch (...) {
        // A destructor may not throw; the allocator keeps (or leaks) the block.
      }
    }
  } release{alloc, allocate ? workspace : nullptr, static_cast<size_t>(call.workspace_bytes), stream};
  std::array<cuda::DevicePtr, 256> stack_slots;
  std::vector<cuda::DevicePtr> heap_slots;
  cuda::DevicePtr* slots = stack_slots.data();
  if (n > stack_slots.size()) heap_slots.resize(n), slots = heap_slots.data();
  bind_slots(call, in, out, reinterpret_cast<uintptr_t>(workspace), slots);
  launch_on_gpu(call.resolved, std::span<const cuda::DevicePtr>(slots, n), reinterpret_cast<cuda::Stream>(stream));
}

/// The prepared call for these tensors: from the cache, or prepared now (every check of the call's
/// arguments runs here; a cached call has passed them at its key).
std::shared_ptr<PreparedCall> find_or_prepare(const OpDef& op, const ops::Tensors& inputs, const ops::Tensors& outputs,
                                              const ops::Options& options, ops::Stream stream) {
  for (const auto& [name, t] : inputs) check_tensor("input", name, t);
  for (const auto& [name, t] : outputs) check_tensor("output", name, t);
  const ops::Memory memory = call_memory(inputs, outputs);
  if (memory == ops::Memory::cuda) {
    std::string why;
    if (!cuda::driver_available(&why)) {
      const std::string cli_hint = "; run with --device cpu";  // the CLI's flag, not this API's
      if (why.ends_with(cli_hint)) why.erase(why.size() - cli_hint.size());
      throw UserError(fmt::format("CUDA tensors given, but {}", why));
    }
    const int ordinal = cuda::device_info().ordinal;
    for (const auto& [name, t] : inputs)
      if (name != kHostSeqlens && t.device != ordinal)
        throw UserError(fmt::format("input '{}' is on CUDA device {}, but linac runs on device {} (LINAC_CUDA_DEVICE)",
                                    name, t.device, ordinal));
  }
  if (options.scale && !(std::isfinite(*options.scale) && *options.scale > 0))
    throw UserError(fmt::format("scale must be a finite positive number, got {}", *options.scale));
  const std::string key = call_key(op, inputs, outputs, options, memory, stream);
  std::shared_ptr<PreparedCall> call = call_cache().find(key);
  if (call) return call;
  check_argument_names(op, inputs, outputs);
  if (memory == ops::Memory::cuda) {
    for (const auto& [name, t] : inputs) {
      int dev = -1;
      if (name != kHostSeqlens && t.numel() > 0 && !cuda::is_device_pointer(t.data, &dev))
        throw UserError(fmt::format("input '{}' is described as CUDA memory but {} is not a device address in "
                                    "linac's CUDA context", name, t.data));
    }
    for (const auto& [name, t] : outputs) {
      int dev = -1;
      if (t.numel() > 0 && !cuda::is_device_pointer(t.data, &dev))
        throw UserError(fmt::format("output '{}' is described as CUDA memory but {} is not a device address in "
                                    "linac's CUDA context", name, t.data));
    }
  }
  call = prepare_call(op, inputs, outputs, options, memory);
  ++g_prepared;
  call_cache().insert(key, call);
  return call;
}

/// The dtype and shape of each of `wanted`, from one plan on shape-only inputs (ops::output_spec, run_op).
std::map<std::string, ops::OutputSpec> output_specs(const OpDef& op, const ops::Tensors& inputs,
                                                    const std::vector<std::string>& wanted, const ops::Options& options) {
  check_argument_names(op, inputs, {});
  for (const auto& name : wanted) check_argument_names(op, {}, {{name, ops::Tensor{}}});
  OpOptions opts = to_op_options(options);
  opts.dtype = kernel_dtype(inputs);
  check_op_options(op, opts);
  // Shapes do not depend on cu_seqlens' values, only on its length: without host values, stand in a
  // valid layout of that length (every sequence but the first empty).
  ops::Tensors shaped = inputs;
  std::vector<int64_t> stand_in;
  if (auto cu = inputs.find("cu_seqlens"); cu != inputs.end() && !inputs.count(kHostSeqlens) &&
                                           (cu->second.memory != ops::Memory::host || cu->second.data == nullptr)) {
    const auto q = inputs.find("q");
    const int64_t T = q != inputs.end() && q->second.shape.size() >= 2 ? q->second.shape[1] : 0;
    stand_in.assign(static_cast<size_t>(std::max<int64_t>(cu->second.numel(), 0)), T);
    if (!stand_in.empty()) stand_in[0] = 0;
    shaped["cu_seqlens"] = ops::Tensor::host(stand_in.data(), DType::i64, cu->second.shape);
  }
  const OpPlan plan = op.prepare(shape_only(shaped), opts, wanted);
  std::map<std::string, ops::OutputSpec> specs;
  for (const auto& name : wanted) {
    auto it = plan.outputs.find(name);
    if (it == plan.outputs.end())
      throw UserError(fmt::format("{} does not produce '{}' with these options", op.name, name));
    const HostTensor& t = plan.tensors.at(it->second);
    specs[name] = {t.dtype, t.shape};
  }
  return specs;
}

}  // namespace

namespace ops {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void run(std::string_view op_name, const Tensors& inputs, const Tensors& outputs, const Options& options,
         Stream stream, Allocator* allocator) {
  const std::shared_ptr<PreparedCall> call = find_or_prepare(find_op(std::string(op_name)), inputs, outputs, options, stream);
  // The key holds the argument names: the maps' order is the call's argument order.
  std::array<void*, kMaxArgs> in, out;
  size_t n_in = 0, n_out = 0;
  for (const auto& [name, t] : inputs)
    if (name != kHostSeqlens) in[n_in++] = t.data;
  for (const auto& [name, t] : outputs) out[n_out++] = t.data;
  run_prepared(*call, std::span<void* const>(in.data(), n_in), std::span<void* const>(out.data(), n_out), stream,
               allocator);
}

Call Call::prepare(std::string_view op_name, const Tensors& inputs, const Tensors& outputs, const Options& options) {
  if (inputs.count("cu_seqlens"))
    throw UserError(fmt::format("{}: a prepared call cannot take cu_seqlens (its values shape the plan, and a "
                                "prepared call runs on new data); call ops::run for packed sequences",
                                op_name));
  Call c;
  c.impl_ = find_or_prepare(find_op(std::string(op_name)), inputs, outputs, options, nullptr);
  return c;
}

const std::vector<std::string>& Call::input_names() const { return impl().inputs; }
const std::vector<std::string>& Call::output_names() const { return impl().outputs; }
std::size_t Call::workspace_bytes() const {
  return impl().memory == Memory::cuda ? static_cast<std::size_t>(impl().workspace_bytes) : 0;
}
Memory Call::memory() const { return impl().memory; }
std::size_t Call::kernel_launches() const { return impl().resolved.launches.size(); }

const PreparedCall& Call::impl() const {
  if (!impl_) throw UserError("ops::Call used before Call::prepare()");
  return *impl_;
}

void Call::run(std::span<void* const> inputs, std::span<void* const> outputs, Stream stream, Allocator* allocator,
               void* workspace) const {
  const PreparedCall& call = impl();
  if (inputs.size() != call.inputs.size() || outputs.size() != call.outputs.size())
    throw UserError(fmt::format("{}: the prepared call takes {} inputs and {} outputs, given {} and {}", call.op->name,
                                call.inputs.size(), call.outputs.size(), inputs.size(), outputs.size()));
  auto check = [&](const char* role, const std::string& name, const void* p, int64_t numel) {
    if (p == nullptr && numel > 0) throw UserError(fmt::format("{} '{}' has no data (null pointer)", role, name));
    if (call.memory == Memory::cuda && reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw UserError(fmt::format("{} '{}' is not 16-byte aligned (address {})", role, name, p));
  };
  for (size_t i = 0; i < inputs.size(); ++i) check("input", call.inputs[i], inputs[i], call.input_numel[i]);
  for (size_t i = 0; i < outputs.size(); ++i) check("output", call.outputs[i], outputs[i], call.output_numel[i]);
  if (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    throw UserError(fmt::format("the workspace at {} is not 16-byte aligned", workspace));
  run_prepared(call, inputs, outputs, stream, allocator, workspace);
}

OutputSpec output_spec(std::string_view op_name, const Tensors& inputs, std::string_view output, const Options& options) {
  const std::string name(output);
  return output_specs(find_op(std::string(op_name)), inputs, {name}, options).at(name);
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpDef* op : all_ops()) names.push_back(op->name);
  return names;
}

int64_t prepared_calls() { return g_prepared.load(); }

}  // namespace ops

void set_device_limits(OpOptions& opts) {
  if (opts.device == Device::cuda) {
    opts.max_smem_per_block = cuda::device_info().max_shared_per_block_optin;
    opts.num_sms = cuda::device_info().sm_count;
    opts.sm = cuda::device_info().sm();
  }
}

TensorMap run_op(const OpDef& op, const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  check_op_options(op, opts);
  // The kernels read q, k, v and do in opts.dtype; converting here keeps the call's other inputs as given.
  TensorMap in = inputs;
  for (const char* name : {"q", "k", "v", "do"})
    if (auto it = in.find(name); it != in.end()) it->second = it->second.cast(opts.dtype);
  for (auto& [name, t] : in)
    if (t.dtype == DType::f64) t = t.cast(DType::f32);
  const ops::Options options = to_ops_options(opts);
  ops::Tensors in_refs;
  for (auto& [name, t] : in) in_refs[name] = ops::Tensor::host(t.materialize(), t.dtype, t.shape);
  TensorMap out;
  for (const auto& [name, spec] : output_specs(op, in_refs, wanted, options)) {
    out[name] = HostTensor::zeros(spec.dtype, spec.shape);
    out[name].fill_bytes(0xFF);  // poisoned: an element the kernels fail to write cannot pass for a result
  }
  if (opts.device == Device::cpu) {
    ops::Tensors out_refs;
    for (auto& [name, t] : out) out_refs[name] = ops::Tensor::host(t.materialize(), t.dtype, t.shape);
    ops::run(op.name, in_refs, out_refs, options);
    return out;
  }
  std::vector<cuda::DeviceBuffer> buffers;
  auto upload = [&](HostTensor& t) {
    buffers.emplace_back(std::max<size_t>(static_cast<size_t>(t.nbytes()), 16));
    buffers.back().copy_from_host(t.materialize(), t.data.size());
    return ops::Tensor::cuda(reinterpret_cast<void*>(buffers.back().ptr()), t.dtype, t.shape, cuda::device_info().ordinal);
  };
  buffers.reserve(in.size() + out.size());
  ops::Tensors din, dout;
  for (auto& [name, t] : in) din[name] = upload(t);
  if (auto cu = in.find("cu_seqlens"); cu != in.end()) din["cu_seqlens_cpu"] = in_refs.at("cu_seqlens");
  for (auto& [name, t] : out) dout[name] = upload(t);
  ops::run(op.name, din, dout, options);
  cuda::synchronize();
  for (auto& [name, t] : out)
    cuda::copy_to_host(t.materialize(), reinterpret_cast<cuda::DevicePtr>(dout.at(name).data), t.data.size());
  return out;
}

}  // namespace linac
