#include "kernels/common/op_support.h"

#include "compiler/ir/ir.h"
#include "kernels/common/config_schema.h"

#include <cmath>
#include <fmt/format.h>

#include "linac/error.h"

namespace linac {

void check_shape(const std::string& name, const HostTensor& t, const std::vector<int64_t>& shape) {
  if (t.shape != shape)
    throw UserError(fmt::format("{} has shape {}, expected [{}]", name, t.shape_str(), fmt::join(shape, ", ")));
  if (!is_float(t.dtype))
    throw UserError(fmt::format("{} has dtype {}, expected a float type", name, dtype_name(t.dtype)));
}

SequenceLayout check_qkv_inputs(const std::string& op, const TensorMap& inputs) {
  for (const char* name : {"q", "k", "v"})
    if (!inputs.count(name)) throw UserError(fmt::format("{}: missing input '{}'", op, name));
  const HostTensor& q = inputs.at("q");
  if (q.rank() != 4) throw UserError(fmt::format("q has shape {}, expected [B,T,H,K]", q.shape_str()));
  SequenceLayout s;
  s.B = q.shape[0], s.T = q.shape[1], s.H = q.shape[2], s.K = q.shape[3];
  const HostTensor& v = inputs.at("v");
  if (v.rank() != 4) throw UserError(fmt::format("v has shape {}, expected [B,T,H,V]", v.shape_str()));
  s.V = v.shape[3];
  check_shape("q", q, {s.B, s.T, s.H, s.K});
  check_shape("k", inputs.at("k"), {s.B, s.T, s.H, s.K});
  check_shape("v", v, {s.B, s.T, s.H, s.V});
  if (s.K < 1 || s.V < 1 || s.H < 1 || s.B < 1)
    throw UserError(fmt::format("q {} / v {}: B, H, K and V must be positive", q.shape_str(), v.shape_str()));
  if (s.K > 256 || s.V > 256)
    throw UserError(fmt::format("{}: head dims up to 256 are supported, got K={} V={}", op, s.K, s.V));
  int64_t total = 0;
  const bool overflow = __builtin_mul_overflow(s.B, s.T, &total) || __builtin_mul_overflow(total, s.H, &total) ||
                        __builtin_mul_overflow(total, std::max(s.K, s.V), &total);
  if (overflow || total >= (int64_t{1} << 31))
    throw UserError(fmt::format("{}: tensors of 2^31 or more elements are not supported yet", op));
  s.N = s.B;
  if (auto it = inputs.find("cu_seqlens"); it != inputs.end()) {
    const HostTensor& cu = it->second;
    if (cu.dtype != DType::i32 && cu.dtype != DType::i64)
      throw UserError(fmt::format("cu_seqlens has dtype {}, expected int32 or int64", dtype_name(cu.dtype)));
    if (cu.rank() != 1 || cu.shape[0] < 2)
      throw UserError(fmt::format("cu_seqlens has shape {}, expected [N+1] with N >= 1", cu.shape_str()));
    if (s.B != 1) throw UserError(fmt::format("cu_seqlens given but B = {}; packed sequences need B = 1", s.B));
    int64_t n = cu.shape[0];
    if (cu.get(0) != 0) throw UserError("cu_seqlens must start at 0");
    for (int64_t i = 1; i < n; ++i)
      if (cu.get(i) < cu.get(i - 1)) throw UserError(fmt::format("cu_seqlens decreases at index {}", i));
    if (cu.get(n - 1) != static_cast<double>(s.T))
      throw UserError(fmt::format("cu_seqlens ends at {} but T = {}", cu.get(n - 1), s.T));
    s.varlen = true;
    s.N = n - 1;
    s.cu_seqlens = cu.cast(DType::i32);
  }
  return s;
}

int checked_chunk_size(std::optional<int> requested, int dflt) {
  if (!requested) return dflt;
  int c = *requested;
  if (c != 16 && c != 32 && c != 64 && c != 128)
    throw UserError(fmt::format("--chunk-size {}: must be 16, 32, 64 or 128", c));
  return c;
}

std::shared_ptr<ir::Kernel> KernelMemo::get(const std::string& key,
                                            const std::function<std::shared_ptr<ir::Kernel>()>& build) {
  std::lock_guard lock(mu_);
  auto& slot = kernels_[key];
  if (!slot) slot = build();
  return slot;
}

HostTensor random_uniform(std::vector<int64_t> shape, uint64_t seed) {
  HostTensor t = HostTensor::zeros(DType::f32, std::move(shape));
  float* p = reinterpret_cast<float*>(t.materialize());
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
    p[i] = static_cast<float>(static_cast<double>(x >> 11) * (2.0 / 9007199254740992.0) - 1.0);
  }
  return t;
}

HostTensor random_log_decay(std::vector<int64_t> shape, uint64_t seed) {
  HostTensor g = random_uniform(std::move(shape), seed);
  float* p = reinterpret_cast<float*>(g.materialize());
  for (int64_t i = 0; i < g.numel(); ++i) p[i] = -std::log1p(std::exp(-3.0f * p[i]));
  return g;
}

void cast_qkv(TensorMap& inputs, DType dtype) {
  for (const char* name : {"q", "k", "v"})
    if (auto it = inputs.find(name); it != inputs.end()) it->second = it->second.cast(dtype);
}

int64_t SequenceLayout::longest_sequence() const {
  if (!varlen) return T;
  int64_t longest = 0;
  for (int64_t n = 0; n < N; ++n) longest = std::max<int64_t>(longest, cu_seqlens.get(n + 1) - cu_seqlens.get(n));
  return longest;
}

void add_forward_tensors(OpPlan& plan, const TensorMap& inputs, const SequenceLayout& seq, DType dtype,
                         bool final_state) {
  for (const char* name : {"q", "k", "v"}) plan.tensors[name] = inputs.at(name).cast(dtype);
  for (const char* name : {"g", "initial_state"})
    if (auto it = inputs.find(name); it != inputs.end()) plan.tensors[name] = it->second.cast(DType::f32);
  plan.tensors["o"] = HostTensor::zeros(dtype, {seq.B, seq.T, seq.H, seq.V});
  if (final_state) plan.tensors["final_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});
  if (seq.varlen) plan.tensors["cu_seqlens"] = seq.cu_seqlens;
}

double attention_scale(const OpOptions& opts, int64_t K) {
  return opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(K)));
}

void add_backward_inputs(OpPlan& plan, const TensorMap& inputs, const SequenceLayout& seq, DType dtype,
                         std::initializer_list<const char*> fp32) {
  for (const char* name : {"q", "k", "v", "do"}) plan.tensors[name] = inputs.at(name).cast(dtype);
  for (const char* name : fp32)
    if (auto it = inputs.find(name); it != inputs.end()) plan.tensors[name] = it->second.cast(DType::f32);
  if (seq.varlen) plan.tensors["cu_seqlens"] = seq.cu_seqlens;
}

KernelLaunch plan_launch(const OpPlan& plan, std::shared_ptr<ir::Kernel> kernel, std::array<int64_t, 3> grid,
                         std::initializer_list<const char*> names, std::map<std::string, double> scalars) {
  KernelLaunch l;
  l.kernel = std::move(kernel);
  l.grid = grid;
  for (const char* name : names)
    if (plan.tensors.count(name)) l.tensors[name] = name;
  l.scalars = std::move(scalars);
  return l;
}

KernelLaunch plan_launch(const OpPlan& plan, std::shared_ptr<ir::Kernel> kernel, std::array<int64_t, 3> grid,
                         const std::map<std::string, double>& scalars,
                         const std::map<std::string, std::string>& renames) {
  KernelLaunch l;
  l.kernel = std::move(kernel);
  l.grid = grid;
  for (const auto& p : l.kernel->params) {
    const auto renamed = renames.find(p.name);
    const std::string& tensor = renamed != renames.end() ? renamed->second : p.name;
    if (plan.tensors.count(tensor)) l.tensors[p.name] = tensor;
    if (auto it = scalars.find(p.name); it != scalars.end()) l.scalars[p.name] = it->second;
  }
  return l;
}

KernelLaunch bound_launch(std::shared_ptr<ir::Kernel> kernel, std::array<int64_t, 3> grid,
                          std::map<std::string, std::string> tensors, std::map<std::string, double> scalars) {
  KernelLaunch l;
  l.kernel = std::move(kernel);
  l.grid = grid;
  l.tensors = std::move(tensors);
  l.scalars = std::move(scalars);
  return l;
}

bool take_tokenwise(OpOptions& opts) {
  const bool tokenwise = tokenwise_key().value(opts, 0) == 1;
  opts.config.erase("tokenwise");
  return tokenwise;
}

int64_t chunk_tables(const SequenceLayout& seq, int64_t rows, HostTensor* offsets, HostTensor* indices) {
  *offsets = HostTensor::zeros(DType::i32, {seq.N + 1});
  std::vector<int32_t> pairs;
  int64_t total = 0;
  for (int64_t n = 0; n < seq.N; ++n) {
    offsets->set(n, static_cast<double>(total));
    const int64_t len = seq.varlen ? static_cast<int64_t>(seq.cu_seqlens.get(n + 1) - seq.cu_seqlens.get(n)) : seq.T;
    const int64_t chunks = (len + rows - 1) / rows;
    for (int64_t c = 0; c < chunks; ++c) pairs.push_back(static_cast<int32_t>(n)), pairs.push_back(static_cast<int32_t>(c));
    total += chunks;
  }
  offsets->set(seq.N, static_cast<double>(total));
  *indices = HostTensor::zeros(DType::i32, {total, 2});
  for (size_t i = 0; i < pairs.size(); ++i) indices->set(static_cast<int64_t>(i), pairs[i]);
  return total;
}

int padded_head_dim(int64_t d) {
  int p = 16;
  while (p < d) p *= 2;
  return p;
}

}  // namespace linac
