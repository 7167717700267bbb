// The op "poly" (docs/ops/poly.md): its registry entry, the coefficients' check and the forward's plans
// and defaults (the segmented kernels poly_fwd_sums, poly_fwd_scan and poly_fwd_out, or the token-by-token
// poly_recurrent: fwd.h); --backward runs op_bwd.cpp's plan.
#include "kernels/poly/op.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fmt/format.h>

#include "kernels/common/config_schema.h"
#include "kernels/common/fitting.h"
#include "kernels/common/noise_dropout.h"
#include "kernels/common/op_support.h"
#include "kernels/poly/bwd.h"
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

/// Rows per segment: not a field (the kernels take chunks per segment), so read with its default.
TuningKey segment_key() {
  return {"segment",
          {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192},
          "rows per segment (a multiple of chunk): the earlier tokens each output chunk sums directly"};
}
/// Pipeline stages (read after the others: the default depends on the chunk).
TuningKey poly_stages_key() {
  return {"stages",
          {1, 2, 3, 4},
          "pipeline stages of the loads (3 and 4: one stage slack, products waited for an iteration late)"};
}

TuningKey poly_order_key() {
  return {"order",
          {0, 1},
          "outputs: 1 = the chunks late in their segment first (the longest direct part), 0 = grid order"};
}

TuningKey poly_ctas_key() {
  return {"ctas",
          {1, 2, 3, 4},
          "blocks per SM the kernels' registers are sized for (ptxas spills what does not fit)"};
}

/// The configuration of every poly kernel (fwd.h): chunk, bv, warps and stages are tuned.
const ConfigSchema<PolyConfig>& poly_schema() {
  using C = PolyConfig;
  static const ConfigSchema<C> schema(field<&C::dtype>(), tuned<&C::chunk>(chunk_key()), field<&C::segment_chunks>(),
                                      field<&C::block_k>(), tuned<&C::block_v>(bv_key({16, 32, 64, 128})),
                                      field<&C::normalize>(), field<&C::quadratic>(), field<&C::varlen>(),
                                      field<&C::coefficient_grads>(), field<&C::store_den>(), field<&C::exact_k>(),
                                      tuned<&C::longest_first>(poly_order_key()), tuned<&C::num_warps>(warps_key()),
                                      tuned<&C::num_stages>(poly_stages_key()),
                                      tuned<&C::min_ctas>(poly_ctas_key()));
  return schema;
}

/// Every key poly's segmented kernels take (the schema's and segment).
TuningKeys poly_tuning_keys() { return merge_tuning_keys({poly_schema().tuning(), {segment_key()}}); }

/// The defaults first, then shorter and longer segments (the direct part against the states' reads),
/// smaller chunks and value blocks (more programs for few sequences x heads), other pipelines.
std::vector<Config> poly_tuning_space(const ProblemShape& s, const OpOptions&) {
  std::vector<Config> space = {{}};
  space.push_back({{"segment", 512}});
  space.push_back({{"segment", 2048}});
  space.push_back({{"chunk", 32}, {"segment", 1024}});
  if (s.V > 32) space.push_back({{"bv", 32}});
  space.push_back({{"stages", 1}});
  space.push_back({{"stages", 2}});  // every kernel at two (the outputs and the scans take three by default)
  if (s.K <= 64) space.push_back({{"stages", 4}});
  return space;
}

}  // namespace

const std::vector<PolySavedTensor>& poly_saved_tensors() {
  static const std::vector<PolySavedTensor> saved = {
      {"saved_states", "states", "[segments,H,blocks,BK,V]", false},
      {"saved_zstates", "zstates", "[segments,H,z_rows,BK]", true},
      {"saved_den", "den", "[B,T,H]", true},
  };
  return saved;
}

std::shared_ptr<ir::Kernel> poly_kernel(const PolyConfig& cfg, PolyKernel which) {
  static KernelMemo memo;
  return memo.get(poly_schema().key(cfg, which), [&] {
    switch (which) {
      case PolyKernel::sums: return build_poly_sums(cfg, false);
      case PolyKernel::scan: return build_poly_scan(cfg, false);
      case PolyKernel::out: return build_poly_fwd_out(cfg);
      case PolyKernel::recurrent: return build_poly_recurrent(cfg);
      case PolyKernel::bwd_sums: return build_poly_sums(cfg, true);
      case PolyKernel::bwd_scan: return build_poly_scan(cfg, true);
      case PolyKernel::bwd_prepare: return build_poly_fwd_out(cfg, true);
      case PolyKernel::bwd_from_saved: return build_poly_bwd_from_saved(cfg);
      case PolyKernel::bwd_dq: return build_poly_bwd_dq(cfg);
      case PolyKernel::bwd_dkv: return build_poly_bwd_dkv(cfg);
      case PolyKernel::bwd_coefficients: return build_poly_bwd_coefficients(cfg);
    }
    return std::shared_ptr<ir::Kernel>();
  });
}

namespace {

/// The default rows per segment and per step and warps of kernel `which` (docs/ops/poly.md, "Options";
/// the measurements that chose them: "Measured"; the stages: poly_config). They assemble within the
/// spill bounds of tests/python/test_ptxas.py for sm_80 and sm_90a in every dtype. The kernels of one
/// plan cut the same segments; their chunks, warps and stages may differ.
struct PolyDefaults {
  int64_t segment = 1024, chunk = 64;
  int warps = 4;
  bool longest_first = false;
};

PolyDefaults poly_defaults(const OpOptions& opts, int64_t K, int64_t V, PolyKernel which, bool backward,
                           bool coefficient_grads) {
  const bool wide = padded_head_dim(K) > 64, wide_v = padded_head_dim(V) > 64, fp32 = opts.dtype == DType::f32;
  const bool sums = which == PolyKernel::sums || which == PolyKernel::bwd_sums;
  const bool scan = which == PolyKernel::scan || which == PolyKernel::bwd_scan;
  const bool per_chunk_bwd = which == PolyKernel::bwd_prepare || which == PolyKernel::bwd_from_saved ||
                             which == PolyKernel::bwd_dq || which == PolyKernel::bwd_dkv;
  PolyDefaults d;
  // Segments: the per-segment tables about twice the bytes of q, k and v, the direct part short.
  d.segment = wide ? 4096 : 1024;
  // Rows per step: at BK = 128 what fits (32; 16 in the backward); else the sums 32, the backward's
  // per-chunk kernels 128 in 16 bits (64 with the coefficients' gradients, whose row sums of [128, 128]
  // score tiles take dq past sm_80's shared memory), the rest 64.
  const bool wide_bwd_chunks = per_chunk_bwd && !fp32 && !coefficient_grads;
  d.chunk = wide ? (backward ? 16 : 32) : wide_bwd_chunks ? 128 : sums ? 32 : 64;
  // Warps: more where a program carries more (the backward's dq and dk/dv, 128-wide sums and scans,
  // the outputs at BK = 128). (The 16-bit sums at 64 took 2 until their features were evaluated at the
  // product's A fragments: docs/ops/poly.md, "Measured", session 16.)
  if (per_chunk_bwd && which != PolyKernel::bwd_from_saved) d.warps = 8;
  if ((scan || which == PolyKernel::bwd_sums) && (wide || wide_v)) d.warps = 8;
  if ((which == PolyKernel::out || which == PolyKernel::recurrent) && wide) d.warps = 8;
  // The outputs' chunks longest first; the backward's first step (the same kernel with one program per
  // 128 rows, one per SM) ran slower so at 64K and keeps grid order ("Measured", session 18).
  d.longest_first = which == PolyKernel::out;
  return d;
}

}  // namespace

PolyConfig poly_config(const OpOptions& opts, int64_t K, int64_t V, PolyKernel which, bool quadratic, bool backward,
                       bool coefficient_grads) {
  check_config_keys("poly", opts, poly_tuning_keys());
  const PolyDefaults d = poly_defaults(opts, K, V, which, backward, coefficient_grads);
  PolyConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(K);
  cfg.quadratic = quadratic;
  cfg.normalize = !opts.no_normalize;
  cfg.exact_k = K == cfg.block_k;
  // Defaults, then --config on top (stages after: its default depends on the chunk).
  const int64_t segment = segment_key().value(opts, d.segment);
  cfg.chunk = checked_chunk_size(opts.chunk_size, static_cast<int>(std::min(d.chunk, segment)));
  cfg.block_v = std::min(64, padded_head_dim(V));
  cfg.num_warps = d.warps;
  cfg.longest_first = d.longest_first;
  poly_schema().apply(opts, cfg);
  // Blocks per SM (after --config: it depends on the warps): three of 4 warps for the outputs in 16 bits
  // (168 registers, some spilled): the degree-2 loop waits on latency, which a third block hides better
  // than the spills cost (docs/ops/poly.md, "Measured", session 17); at 8 warps ptxas would keep 128
  // registers for two blocks and spill more. One elsewhere: the sums at three would spill, the scan in
  // f32 spilled the normalizer's walk at two.
  if (!poly_ctas_key().asked(opts))
    cfg.min_ctas = which == PolyKernel::out && cfg.num_warps == 4 && cfg.dtype != DType::f32 ? 3 : 1;
  if (segment % cfg.chunk != 0)
    throw UserError(fmt::format("poly: --config segment={} must be a multiple of the chunk ({} rows)", segment, cfg.chunk));
  cfg.segment_chunks = static_cast<int>(segment / cfg.chunk);
  // The backward's kernels take whole rows of V; dq alone sums the coefficients' gradients.
  if (backward) cfg.block_v = padded_head_dim(V);
  cfg.coefficient_grads = coefficient_grads && which == PolyKernel::bwd_dq;
  // Pipeline stages: the first proposal whose plan fits the call's GPU (kernels/common/fitting.h). Two,
  // and three (one slack: products waited for an iteration late, compiler/passes/wgmma_waits.h, one
  // barrier per loop iteration) for the outputs and the scans at BK <= 64, where that measured faster
  // (the sums and the backward's per-chunk kernels ran slower so: docs/ops/poly.md, session 17). fp32
  // and the backward at BK = 128 keep one stage, as measured before more fitted: not timed with more.
  std::vector<int> proposals = {2, 1};
  if ((which == PolyKernel::out || which == PolyKernel::scan || which == PolyKernel::bwd_scan) && cfg.block_k <= 64)
    proposals = {3, 2, 1};
  if (opts.dtype == DType::f32 || (backward && cfg.block_k > 64)) proposals = {1};
  if (poly_stages_key().asked(opts)) proposals = {cfg.num_stages};  // as given (poly_schema().apply)
  cfg.num_stages = first_fitting<int>(
      proposals,
      [&](const int& stages) {
        PolyConfig c = cfg;
        c.num_stages = stages;
        return std::vector<std::shared_ptr<ir::Kernel>>{poly_kernel(c, which)};
      },
      opts);
  return cfg;
}


SegmentedPlan add_segment_tables(OpPlan& plan, const SequenceLayout& seq, const PolyConfig& cfg) {
  SegmentedPlan sp;
  const int64_t L = int64_t{cfg.chunk} * cfg.segment_chunks;
  HostTensor segment_offsets, segment_indices, chunk_offsets, chunk_indices;
  sp.segments = chunk_tables(seq, L, &segment_offsets, &segment_indices);
  sp.chunks = chunk_tables(seq, cfg.chunk, &chunk_offsets, &chunk_indices);
  sp.blocks = poly_feature_blocks(cfg);
  sp.z_rows = poly_z_rows(cfg);
  sp.v_blocks = (seq.V + cfg.block_v - 1) / cfg.block_v;
  if (sp.segments == 0) return sp;
  if (seq.varlen) {
    plan.tensors["segment_offsets"] = segment_offsets;
    plan.tensors["segment_indices"] = segment_indices;
    plan.tensors["chunk_indices"] = chunk_indices;
  }
  plan.tensors["sums"] = HostTensor::zeros(DType::f32, {sp.segments, seq.H, sp.blocks, cfg.block_k, seq.V});
  if (cfg.normalize)
    plan.tensors["zsums"] = HostTensor::zeros(DType::f32, {sp.segments, seq.H, sp.z_rows, cfg.block_k});
  // The per-segment and per-chunk kernels run over the segments (chunks) of a sequence and B*H, or
  // with varlen over all of them and H.
  const int64_t sequences_per_axis = seq.varlen ? 1 : seq.B;
  sp.heads_axis = seq.varlen ? seq.H : seq.B * seq.H;
  // One more sums and scan program per segment (sequence) and head for the normalizer's tables.
  const int64_t z_programs = cfg.normalize ? 1 : 0;
  sp.sums_grid = {(sp.blocks - 1) * sp.v_blocks + z_programs, sp.segments / sequences_per_axis, sp.heads_axis};
  sp.scan_grid = {sp.blocks * sp.v_blocks + z_programs, seq.N * seq.H, 1};
  sp.chunks_per_axis = sp.chunks / sequences_per_axis;
  return sp;
}

void add_states(OpPlan& plan, const SequenceLayout& seq, const PolyConfig& cfg, const SegmentedPlan& sp, bool reverse) {
  const int64_t blocks = sp.blocks;
  plan.tensors[reverse ? "rstates" : "states"] = HostTensor::zeros(cfg.dtype, {sp.segments, seq.H, blocks, cfg.block_k, seq.V});
  if (cfg.normalize)
    plan.tensors[reverse ? "rzstates" : "zstates"] = HostTensor::zeros(DType::f32, {sp.segments, seq.H, sp.z_rows, cfg.block_k});
}

namespace {

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
  // Saving for the backward (any saved_* output wanted): the out kernel also stores den.
  bool save = false;
  for (const auto& t : poly_saved_tensors()) save = save || wants(wanted, t.name);
  if (save && opts.recurrent) throw UserError("poly: saved_* outputs come from the segmented form, not --recurrent");
  PolyConfig cfg = config_of(opts.recurrent ? PolyKernel::recurrent : PolyKernel::out);
  cfg.store_den = save && cfg.normalize;

  OpPlan plan;
  add_forward_tensors(plan, inputs, seq, cfg.dtype);
  const int64_t v_blocks = (seq.V + cfg.block_v - 1) / cfg.block_v;
  const double scale = attention_scale(opts, seq.K);
  std::map<std::string, double> scalars = {{"scale", scale}, {"a", a}, {"b", b}};
  if (cfg.quadratic) scalars["c"] = c;

  if (opts.recurrent) {
    if (cfg.quadratic)
      plan.tensors["state2"] = HostTensor::zeros(DType::f32, {seq.N * seq.H, seq.K * (seq.K + 1) / 2, seq.V});
    // Z2's symmetric part, per program: every V block computes the denominator itself.
    if (cfg.quadratic && cfg.normalize)
      plan.tensors["norm2"] = HostTensor::zeros(DType::f32, {v_blocks * seq.N * seq.H, seq.K * (seq.K + 1) / 2, 1});
    plan.launches.push_back(plan_launch(plan, poly_kernel(cfg, PolyKernel::recurrent),
                                        {v_blocks, seq.N * seq.H, 1}, scalars));
  } else {
    // Each segment's sums, then the state before every segment, then the outputs.
    const SegmentedPlan sp = add_segment_tables(plan, seq, cfg);
    add_states(plan, seq, cfg, sp, /*reverse=*/false);
    if (save) {
      if (cfg.normalize) plan.tensors["den"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
      for (const auto& t : poly_saved_tensors())
        if (wants(wanted, t.name)) {
          if (!plan.tensors.count(t.tensor))
            throw UserError(fmt::format("poly: {} is saved by the normalized form only (--no-normalize saves saved_states)", t.name));
          plan.outputs[t.name] = t.tensor;
        }
    }
    if (sp.segments == 0) {  // every sequence is empty
      if (wants(wanted, "o")) plan.outputs["o"] = "o";
      return plan;
    }
    plan.launches.push_back(plan_launch(plan, poly_kernel(config_of(PolyKernel::sums), PolyKernel::sums), sp.sums_grid, {}));
    plan.launches.push_back(plan_launch(plan, poly_kernel(config_of(PolyKernel::scan), PolyKernel::scan), sp.scan_grid, {}));
    const std::array<int64_t, 3> out_grid = {sp.chunks_per_axis, sp.v_blocks, sp.heads_axis};
    plan.launches.push_back(plan_launch(plan, poly_kernel(cfg, PolyKernel::out), out_grid, scalars));
  }
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
      {"v", true, "[B,T,H,V]", "values (a non-finite one makes the outputs of its chunk and of every later chunk non-finite)"},
      {"cu_seqlens", false, "[N+1]", "int32/int64 offsets of packed sequences (B must be 1)"},
      {"do", false, "[B,T,H,V]", "--backward: gradient of the loss w.r.t. o"},
      {"o", false, "[B,T,H,V]", "--backward with saved_*: the forward's output"},
  };
  for (const auto& t : poly_saved_tensors())
    op.inputs.push_back({t.name, false, t.shape, "--backward: the forward's output of that name (with o; all or none)"});
  op.outputs = {
      {"o", true, "[B,T,H,V]", "outputs"},
      {"dq", false, "[B,T,H,K]", "--backward: gradient w.r.t. q"},
      {"dk", false, "[B,T,H,K]", "--backward: gradient w.r.t. k"},
      {"dv", false, "[B,T,H,V]", "--backward: gradient w.r.t. v"},
      {"da", false, "[1]", "--backward: gradient w.r.t. the coefficient a (fp32; likewise db, dc)"},
      {"db", false, "[1]", "--backward: gradient w.r.t. b"},
      {"dc", false, "[1]", "--backward: gradient w.r.t. c"},
  };
  for (const auto& t : poly_saved_tensors())
    op.outputs.push_back({t.name, false, t.shape,
                          t.normalized_only ? "for --backward (inputs saved_*): normalized only" : "for --backward (inputs saved_*)"});
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
  // Every key some form takes (the backward's segmented form takes the forward's).
  op.config_keys = config_key_lines(merge_tuning_keys({poly_tuning_keys(), {poly_tokenwise_key()}}));
  op.saved_layout_keys = {segment_key().key};
  op.kernels = [](const OpOptions& opts) {
    // The segmented kernels and the recurrent one for K = V = 64 and K = V = 128, all with the
    // degree-2 state and normalization.
    std::vector<std::shared_ptr<ir::Kernel>> out;
    for (int64_t d : {64, 128})
      for (PolyKernel which : {PolyKernel::sums, PolyKernel::scan, PolyKernel::out, PolyKernel::recurrent})
        out.push_back(poly_kernel(poly_config(opts, d, d, which), which));
    for (auto& k : poly_bwd_kernels(opts)) out.push_back(k);
    return out;
  };
  return op;
}

}  // namespace linac
