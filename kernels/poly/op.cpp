// The op "poly" (docs/ops/poly.md): its registry entry, the coefficients' check and the forward's plans
// and defaults (the chunked kernels poly_fwd_deg2 and poly_fwd, or the token-by-token poly_recurrent:
// fwd.h); --backward runs op_bwd.cpp's plan.
#include "kernels/poly/op.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fmt/format.h>

#include "kernels/common/noise_dropout.h"
#include "kernels/common/op_support.h"
#include "kernels/poly/fwd.h"
#include "linac/error.h"

namespace linac {

void check_poly_coefficients(double a, double b, double c, bool normalize) {
  if (!std::isfinite(a) || !std::isfinite(b) || !std::isfinite(c))
    throw UserError(fmt::format("poly: coefficients must be finite, got a={} b={} c={}", a, b, c));
  if (!normalize) return;
  // f > 0 everywhere: a parabola opening upwards without a real root, or a positive constant. A
  // linear f (c = 0, b != 0) changes sign, and c < 0 goes negative for large |x|.
  bool positive = c > 0 ? b * b < 4 * a * c : c == 0 && b == 0 && a > 0;
  if (!positive)
    throw UserError(fmt::format(
        "poly: f(x) = a + b x + c x^2 with a={} b={} c={} is not positive for every x, so the normalized "
        "output can divide by zero or flip sign (need c > 0 and b^2 < 4ac, or b = c = 0 < a); choose other "
        "coefficients or pass --no-normalize",
        a, b, c));
}

namespace {

const std::vector<std::pair<std::string, std::string>>& poly_config_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"chunk", "rows per chunk (16, 32, 64, 128)"},
      {"bv", "value columns per program (16..128)"},
      {"warps", "warps per program (2, 4, 8)"},
      {"stages", "pipeline stages of the loads (1 or 2)"},
  };
  return keys;
}

enum class PolyKernel { chunked, deg2, recurrent };

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_poly_kernel(const PolyConfig& cfg, PolyKernel which) {
  static KernelMemo memo;
  std::string key =
      fmt::format("{}/{}/{}/{}/{}/{}{}{}/{}/{}", static_cast<int>(which), dtype_name(cfg.dtype), cfg.chunk, cfg.block_k,
                  cfg.block_v, cfg.normalize, cfg.quadratic, cfg.varlen, cfg.num_warps, cfg.num_stages);
  return memo.get(key, [&] {
    return which == PolyKernel::chunked ? build_poly_fwd(cfg)
           : which == PolyKernel::deg2  ? build_poly_fwd_deg2(cfg)
                                        : build_poly_recurrent(cfg);
  });
}

/// The configuration of kernel `which` for the given head dims (opts.config and --chunk-size override
/// the defaults, for every kernel alike).
PolyConfig poly_config(const OpOptions& opts, int64_t K, int64_t V, PolyKernel which, bool quadratic = true) {
  check_config_keys("poly", opts, poly_config_keys());
  PolyConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(K);
  cfg.quadratic = quadratic;
  cfg.normalize = !opts.no_normalize;
  // The defaults (what runs untuned, and the tuner's first candidate) are configurations that ptxas
  // assembles without spills for sm_80 and sm_90a in every dtype (tests/python/test_ptxas.py). The two
  // chunked kernels must split intra- and inter-chunk alike, so they share the chunk size; warps may differ.
  int chunk = cfg.block_k <= 64 ? 64 : 32;
  int warps = 4;
  if (which == PolyKernel::chunked && cfg.block_k <= 64) warps = 8;
  if (which == PolyKernel::deg2) warps = 8;  // 4 warps spill since global-memory state stores are fenced
  if (which == PolyKernel::recurrent && cfg.block_k > 64) warps = 8;
  cfg.chunk = static_cast<int>(
      config_value(opts, "chunk", checked_chunk_size(opts.chunk_size, chunk), {16, 32, 64, 128}));
  cfg.block_v = static_cast<int>(config_value(opts, "bv", std::min(64, padded_head_dim(V)), {16, 32, 64, 128}));
  cfg.num_warps = static_cast<int>(config_value(opts, "warps", warps, {2, 4, 8}));
  // fp32 at BK <= 64: two stages of the chunk's q, k, v tiles take poly_fwd to 171 KB, more than sm_80
  // gives a block (163 KB; sm_90a 227 KB): the default that fits both is one stage.
  const int stages = opts.dtype == DType::f32 && cfg.block_k <= 64 ? 1 : 2;
  cfg.num_stages = static_cast<int>(config_value(opts, "stages", stages, {1, 2}));
  return cfg;
}

/// The defaults first, then configurations that ptxas assembles without spills for sm_90a in bf16 (but
/// chunk 64 at BK = 128, which spills 16-52 bytes: the timing decides). A config applies to both chunked
/// kernels alike: they must share the chunk size. The key width splits the space: with BK = 128 every
/// tile of Q and K is twice as wide, so chunks of 128 spill kilobytes there and are left out, while with
/// BK <= 64 a chunk of 128 fits with 32 value columns and one stage. The tuner skips what does not fit.
std::vector<Config> poly_tuning_space(const ProblemShape& s, DType) {
  std::vector<Config> space = {{}};  // the defaults: chunk 64 (BK <= 64) or 32, warps per kernel
  if (padded_head_dim(s.K) <= 64) {
    space.push_back({{"chunk", 16}});
    space.push_back({{"chunk", 32}});
    space.push_back({{"stages", 1}});
    space.push_back({{"chunk", 32}, {"stages", 1}});
    if (s.V > 32) space.push_back({{"bv", 32}});  // twice the programs, for few sequences x heads
    space.push_back({{"chunk", 128}, {"bv", 32}, {"stages", 1}});
  } else {
    // Only chunk 64 beside the default: the one faster than it among warps, stages and chunk (docs/ops/
    // poly.md, "Measured"; it spills 216 bytes, so it is not the default). Each candidate costs ~0.8 s of
    // timing at these run times; with all five the cold start was over the 5 s target.
    space.push_back({{"chunk", 64}});
  }
  return space;
}

OpPlan plan_poly_form(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  SequenceLayout seq = check_qkv_inputs("poly", inputs);
  if (seq.K > 128)
    throw UserError(fmt::format("poly: K up to 128 is supported (the degree-2 state has K(K+1)/2 x V entries "
                                "per head), got K={}",
                                seq.K));
  const double a = opts.a.value_or(1.0), b = opts.b.value_or(1.0), c = opts.c.value_or(0.5);
  check_poly_coefficients(a, b, c, !opts.no_normalize);
  if (opts.backward) return plan_poly_bwd(inputs, opts, wanted, a, b, c);
  if (inputs.count("do")) throw UserError("poly: input 'do' is a gradient; it needs --backward");
  auto config_of = [&](PolyKernel which) {
    PolyConfig cfg = poly_config(opts, seq.K, seq.V, which, c != 0);
    cfg.varlen = seq.varlen;
    return cfg;
  };
  // The launches share the grid and the chunk size: only the warps may differ between them.
  const PolyConfig cfg = config_of(PolyKernel::chunked);

  OpPlan plan;
  for (const char* name : {"q", "k", "v"}) plan.tensors[name] = inputs.at(name).cast(cfg.dtype);
  plan.tensors["o"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  if (seq.varlen) plan.tensors["cu_seqlens"] = seq.cu_seqlens;
  const std::array<int64_t, 3> grid = {(seq.V + cfg.block_v - 1) / cfg.block_v, seq.N * seq.H, 1};
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));
  auto launch_of = [&](PolyKernel which, std::initializer_list<const char*> tensors) {
    KernelLaunch l;
    l.kernel = cached_poly_kernel(config_of(which), which);
    l.grid = grid;
    for (const char* name : tensors) l.tensors[name] = name;
    if (seq.varlen) l.tensors["cu_seqlens"] = "cu_seqlens";
    l.scalars["scale"] = scale;
    return l;
  };
  if (cfg.quadratic)
    plan.tensors["state2"] = HostTensor::zeros(DType::f32, {seq.N * seq.H, seq.K * (seq.K + 1) / 2, seq.V});
  // Z2's symmetric part, per program: every V block computes the denominator itself.
  if (cfg.quadratic && cfg.normalize)
    plan.tensors["norm2"] = HostTensor::zeros(DType::f32, {grid[0] * seq.N * seq.H, seq.K * (seq.K + 1) / 2, 1});
  if (opts.recurrent) {
    KernelLaunch l = launch_of(PolyKernel::recurrent, {"q", "k", "v", "o"});
    if (cfg.quadratic) l.tensors["state2"] = "state2";
    if (cfg.quadratic && cfg.normalize) l.tensors["norm2"] = "norm2";
    plan.launches.push_back(std::move(l));
  } else {
    if (cfg.quadratic) {
      plan.tensors["o2"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.V});
      KernelLaunch l = launch_of(PolyKernel::deg2, {"q", "k", "v", "state2", "o2"});
      l.scalars["c"] = c;
      if (cfg.normalize) {
        plan.tensors["den2"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, 1});
        l.tensors["norm2"] = "norm2";
        l.tensors["den2"] = "den2";
      }
      plan.launches.push_back(std::move(l));
    }
    KernelLaunch l = launch_of(PolyKernel::chunked, {"q", "k", "v", "o"});
    if (cfg.quadratic) l.tensors["o2"] = "o2";
    if (cfg.quadratic && cfg.normalize) l.tensors["den2"] = "den2";
    plan.launches.push_back(std::move(l));
  }
  // The last launch computes o and takes the coefficients.
  KernelLaunch& last = plan.launches.back();
  last.scalars["a"] = a;
  last.scalars["b"] = b;
  if (cfg.quadratic) last.scalars["c"] = c;
  if (wants(wanted, "o")) plan.outputs["o"] = "o";
  return plan;
}

}  // namespace

OpDef poly_op() {
  OpDef op;
  op.name = "poly";
  op.summary = "normalized polynomial-kernel attention, f(x) = a + b x + c x^2 (default 1, 1, 1/2), chunked with "
               "a factorized degree-2 state (docs/ops/poly.md)";
  op.inputs = {
      {"q", true, "[B,T,H,K]", "queries (K <= 128)"},
      {"k", true, "[B,T,H,K]", "keys"},
      {"v", true, "[B,T,H,V]", "values (a non-finite one makes all of its chunk's outputs non-finite)"},
      {"cu_seqlens", false, "[N+1]", "int32/int64 offsets of packed sequences (B must be 1)"},
      {"do", false, "[B,T,H,V]", "--backward: gradient of the loss w.r.t. o"},
  };
  op.outputs = {
      {"o", true, "[B,T,H,V]", "outputs"},
      {"dq", false, "[B,T,H,K]", "--backward (pairwise, O(T^2): slow): gradient w.r.t. q"},
      {"dk", false, "[B,T,H,K]", "--backward: gradient w.r.t. k"},
      {"dv", false, "[B,T,H,V]", "--backward: gradient w.r.t. v"},
  };
  op.flags = {"recurrent", "no_normalize", "coefficients", "noise_dropout", "backward"};
  op.prepare = [](const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
    OpPlan plan = plan_poly_form(inputs, opts, wanted);
    apply_noise_dropout(plan, opts, inputs);
    return plan;
  };
  op.random_inputs = [](const ProblemShape& s, uint64_t seed) {
    TensorMap in;
    in["q"] = random_uniform({s.B, s.T, s.H, s.K}, seed);
    in["k"] = random_uniform({s.B, s.T, s.H, s.K}, seed + 1);
    in["v"] = random_uniform({s.B, s.T, s.H, s.V}, seed + 2);
    return in;
  };
  op.shape_of = [](const TensorMap& in) {
    const HostTensor& q = in.at("q");
    return ProblemShape{q.shape[0], q.shape[1], q.shape[2], q.shape[3], in.at("v").shape[3], false};
  };
  op.tuning_space = poly_tuning_space;
  op.config_keys = poly_config_keys();
  op.kernels = [](const OpOptions& opts) {
    // Both chunked kernels and the recurrent one for K = V = 64 and K = V = 128, all with the
    // degree-2 state and normalization.
    std::vector<std::shared_ptr<ir::Kernel>> out;
    for (int64_t d : {64, 128})
      for (PolyKernel which : {PolyKernel::deg2, PolyKernel::chunked, PolyKernel::recurrent})
        out.push_back(cached_poly_kernel(poly_config(opts, d, d, which), which));
    // The pairwise backward: its 16-bit variants spill 4-16 bytes on sm_80 / sm_90a (ptxas keeps them at
    // 32-64 registers, at 2 or 4 warps alike): left out of the zero-spill list, like linear_attn's fp32
    // backward, until they do not.
    if (opts.dtype == DType::f32)
      for (auto& k : poly_bwd_kernels(opts)) out.push_back(k);
    return out;
  };
  return op;
}

}  // namespace linac
