// The op "linear_attn" (docs/ops/linear_attn.md): its registry entry and the forward's plans and
// defaults, the plain or gated chunked kernel (fwd.h) and the normalized one (normalized.h), and the
// dispatch to the recurrent (kernels/common/recurrent.h) and backward (op_bwd.cpp) forms.
#include "kernels/linear_attn/op.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "kernels/common/chunk_gate_sums.h"
#include "kernels/common/config_schema.h"
#include "kernels/common/device_limits.h"
#include "kernels/common/elementwise.h"
#include "kernels/common/fitting.h"
#include "kernels/common/noise_dropout.h"
#include "kernels/common/op_support.h"
#include "kernels/common/recurrent_op.h"
#include "kernels/common/segments.h"
#include "kernels/linear_attn/fwd.h"
#include "kernels/linear_attn/normalized.h"
#include "linac/error.h"

namespace linac {

namespace {

std::shared_ptr<ir::Kernel> cached_linear_attn_fwd(const LinearAttnConfig& cfg);

/// Whether the walks take 128 value columns per program rather than 64, given `wide_walks`, their count
/// at 128 columns: unless the 64-column programs (twice as many) all run at once on the GPU (few_walks)
/// and no segments give the programs, 128. Between half the SMs and all of them the 64-column programs
/// take two waves where the 128-column ones take one (B1 T8192 H96 D128, 96 walks on an H200: 0.406 ->
/// 0.299 ms, gated 0.912 -> 0.533; docs/ops/linear_attn.md, "Measured").
bool wide_value_blocks(int64_t wide_walks, bool segmented, const OpOptions& opts) {
  return !few_walks(wide_walks, opts) || segmented;
}

/// Whether a walk's fp32 state of [K, 128] fits its registers beside the rest: up to K = 256, gated or
/// not (the gated walk updates its state in place: linear_attn_fwd; at K = 256 ptxas spills 4 bytes of
/// it on sm_90a, bounded in test_ptxas.py). B8 T2048 H32 D256 on an H200 against 64 columns: 0.846 ->
/// 0.614 ms ungated, 0.979 -> 0.678 gated (docs/ops/linear_attn.md).
bool wide_state_fits(int64_t K) { return K <= 256; }

/// The normalized kernel's configuration (it takes the same tuning keys as the plain one).
const ConfigSchema<LinearAttnNormalizedConfig>& normalized_schema() {
  using C = LinearAttnNormalizedConfig;
  static const ConfigSchema<C> schema(field<&C::dtype>(), tuned<&C::chunk>(chunk_key()), field<&C::block_k>(),
                                      tuned<&C::block_v>(bv_key()), field<&C::gated>(), field<&C::varlen>(),
                                      tuned<&C::num_warps>(warps_key()), tuned<&C::num_stages>(stages_key()),
                                      tuned<&C::segment>(segment_key()));
  return schema;
}

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_normalized_fwd(const LinearAttnNormalizedConfig& cfg) {
  static KernelMemo memo;
  return memo.get(normalized_schema().key(cfg), [&] { return build_linear_attn_normalized_fwd(cfg); });
}

/// The segment-parallel normalized forward's first steps (kernels/common/segments.h) for `cfg`: the
/// state walks of plain linear attention over the segments, on v for S and on a column of ones for z
/// (z is S with one value column of ones), each followed by the combine.
struct NormalizedSegmentSteps {
  LinearAttnConfig values, normalizer;  // segment_states walks
  SegmentCombineConfig values_combine, normalizer_combine;
};

NormalizedSegmentSteps normalized_segment_steps(const LinearAttnNormalizedConfig& cfg) {
  NormalizedSegmentSteps steps;
  LinearAttnConfig& w = steps.values;
  w.dtype = cfg.dtype;
  w.chunk = cfg.chunk;
  w.block_k = cfg.block_k;
  w.block_v = cfg.block_v;
  w.gated = cfg.gated;
  w.num_warps = cfg.num_warps;
  w.num_stages = cfg.num_stages;
  w.walk = LinearAttnWalk::segment_states;
  w.segment = cfg.segment;
  steps.normalizer = w;
  steps.normalizer.block_v = padded_head_dim(1);
  const SegmentDecay decay = cfg.gated ? SegmentDecay::per_head : SegmentDecay::none;
  steps.values_combine = {cfg.block_k, cfg.block_v, decay, false, false, cfg.num_warps};
  steps.normalizer_combine = {cfg.block_k, steps.normalizer.block_v, decay, false, false, cfg.num_warps};
  return steps;
}

/// The kernels the normalized forward launches with `cfg`: the walk, or the segment-parallel schedule's.
std::vector<std::shared_ptr<ir::Kernel>> normalized_kernels(const LinearAttnNormalizedConfig& cfg) {
  if (cfg.segment == 0) return {cached_normalized_fwd(cfg)};
  const NormalizedSegmentSteps steps = normalized_segment_steps(cfg);
  return {cached_linear_attn_fwd(steps.values), cached_segment_combine(steps.values_combine),
          cached_linear_attn_fwd(steps.normalizer), cached_segment_combine(steps.normalizer_combine),
          cached_normalized_fwd(cfg)};
}

/// The configuration for the given sequences (nullptr: unknown, no segments) and head dims; opts.config
/// and --chunk-size override the defaults.
LinearAttnNormalizedConfig normalized_config(const OpOptions& opts, const SequenceLayout* seq, int64_t K, int64_t V,
                                             bool gated) {
  check_config_keys("linear_attn", opts, normalized_schema().tuning());
  const int64_t heads = seq ? seq->N * seq->H : 0;
  const bool varlen = seq && seq->varlen;
  // Until the normalized form is tuned on its own, the defaults are what ptxas assembles without
  // spills for sm_80 and sm_90a in every dtype (tests/python/test_ptxas.py): z and the row sums cost
  // registers that linear_attn's 64-row chunks with 4 warps do not have, so chunks of 32, else 16
  // where 32 does not fit (kernels/common/fitting.h). In 16-bit with 128-column value blocks filling
  // the GPU (as linear_attn's forward chooses them), first chunk 64 with whole 128-column blocks and 8
  // warps: faster, although ptxas spills 64 bytes at 255 registers there (sm_90a). Where even the walks
  // in 64-column blocks are few, the sequences are cut in segments (default_segment) and the 128-column
  // blocks are first too: the segments give the programs (at 64 sequences x heads the 64-column walks
  // without segments ran as fast, gated faster). The rule is the forward's (wide_value_blocks).
  // Timings: docs/ops/linear_attn.md, "Measured".
  const int64_t wide_walks = heads * ((V + 127) / 128);
  const bool segmented = seq && default_segment(*seq, heads * ((V + 63) / 64), 64, opts) > 0;
  const bool wide =
      opts.dtype != DType::f32 && K <= 128 && V > 64 && heads > 0 && wide_value_blocks(wide_walks, segmented, opts);
  std::vector<std::pair<int, int>> chunk_and_bv;  // in order of preference
  if (wide) chunk_and_bv.push_back({64, 128});
  for (int chunk : {32, 16}) chunk_and_bv.push_back({chunk, std::min(64, padded_head_dim(V))});
  std::vector<LinearAttnNormalizedConfig> proposals;
  for (const auto& [chunk, bv] : chunk_and_bv) {
    LinearAttnNormalizedConfig cfg;
    cfg.dtype = opts.dtype;
    cfg.block_k = padded_head_dim(K);
    cfg.chunk = checked_chunk_size(opts.chunk_size, chunk);
    cfg.block_v = bv;
    cfg.num_warps = 8;
    cfg.num_stages = 2;
    cfg.gated = gated;
    cfg.varlen = varlen;
    cfg.segment = seq ? default_segment(*seq, heads * ((V + bv - 1) / bv), cfg.chunk, opts) : 0;
    normalized_schema().apply(opts, cfg);
    if (seq && segments_per_sequence("linear_attn --normalize", *seq, cfg.segment, cfg.chunk) <= 1) cfg.segment = 0;
    proposals.push_back(cfg);
  }
  return first_fitting<LinearAttnNormalizedConfig>(proposals, normalized_kernels, opts);
}

/// linear_attn's prepare() with opts.normalize: checks the inputs (UserError for an initial state, a
/// final state or --recurrent) and plans the normalized kernel's walk, or its segment-parallel schedule.
OpPlan plan_linear_attn_normalized(const TensorMap& inputs, const OpOptions& opts,
                                   const std::vector<std::string>& wanted) {
  SequenceLayout seq = check_qkv_inputs("linear_attn", inputs);
  if (opts.recurrent) throw UserError("linear_attn: --normalize has no --recurrent form");
  if (inputs.count("initial_state"))
    throw UserError("linear_attn --normalize takes no initial_state (the normalizer state would be needed too)");
  if (wants(wanted, "final_state"))
    throw UserError("linear_attn --normalize gives no final_state (the normalizer state would be needed too)");
  const bool gated = inputs.count("g") > 0;
  if (gated) check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H});

  const LinearAttnNormalizedConfig cfg = normalized_config(opts, &seq, seq.K, seq.V, gated);
  const double scale = attention_scale(opts, seq.K);
  const int64_t v_blocks = (seq.V + cfg.block_v - 1) / cfg.block_v;

  OpPlan plan;
  add_forward_tensors(plan, inputs, seq, cfg.dtype);
  if (cfg.segment == 0) {
    plan.launches.push_back(
        plan_launch(plan, cached_normalized_fwd(cfg), {v_blocks, seq.N * seq.H, 1}, {{"scale", scale}}));
  } else {
    const int64_t segments = segments_per_sequence("linear_attn --normalize", seq, cfg.segment, cfg.chunk);
    const NormalizedSegmentSteps steps = normalized_segment_steps(cfg);
    plan.tensors["ones"] = HostTensor::filled(cfg.dtype, {seq.B, seq.T, seq.H, 1}, 1.0);
    if (gated) add_chunk_gate_sums(plan, seq, cfg.chunk);  // linear_attn_segment_states reads them
    add_segment_states(plan, seq, segments, v_blocks, seq.V, steps.values_combine,
                       cached_linear_attn_fwd(steps.values), {{"scale", scale}});
    add_segment_states(plan, seq, segments, 1, 1, steps.normalizer_combine, cached_linear_attn_fwd(steps.normalizer),
                       {{"scale", scale}}, "normalizer_", {{"v", "ones"}});
    plan.launches.push_back(plan_launch(plan, cached_normalized_fwd(cfg), {v_blocks, seq.N * seq.H, segments},
                                        {{"scale", scale}}, {{"normalizer_inputs", "normalizer_segment_inputs"}}));
  }
  if (wants(wanted, "o")) plan.outputs["o"] = "o";
  return plan;
}

/// The normalized kernels at their default configuration for opts (for linear_attn's OpDef::kernels).
std::vector<std::shared_ptr<ir::Kernel>> linear_attn_normalized_kernels(const OpOptions& opts) {
  LinearAttnNormalizedConfig varlen = normalized_config(opts, nullptr, 64, 64, true);
  varlen.varlen = true;
  // The segment-parallel schedule's kernels too, gated.
  LinearAttnNormalizedConfig segmented = normalized_config(opts, nullptr, 64, 64, true);
  segmented.segment = 1024;
  std::vector<std::shared_ptr<ir::Kernel>> out = {
      cached_normalized_fwd(normalized_config(opts, nullptr, 64, 64, false)), cached_normalized_fwd(varlen)};
  for (auto& k : normalized_kernels(segmented)) out.push_back(k);
  return out;
}

/// The forward kernel's configuration: chunk, bv, warps, stages and segment are linear_attn's tuning keys.
const ConfigSchema<LinearAttnConfig>& linear_attn_schema() {
  using C = LinearAttnConfig;
  static const ConfigSchema<C> schema(
      field<&C::dtype>(), tuned<&C::chunk>(chunk_key()), field<&C::block_k>(), tuned<&C::block_v>(bv_key()),
      field<&C::gated>(), field<&C::initial_state>(), field<&C::final_state>(), field<&C::varlen>(),
      tuned<&C::num_warps>(warps_key()), tuned<&C::num_stages>(stages_key()), field<&C::walk>(),
      tuned<&C::segment>(segment_key()), tuned<&C::producer_warps>(producer_key()));
  return schema;
}

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_linear_attn_fwd(const LinearAttnConfig& cfg) {
  static KernelMemo memo;
  return memo.get(linear_attn_schema().key(cfg), [&] { return build_linear_attn_fwd(cfg); });
}


/// The segments' combine for the forward's configuration (a decay per head when gated).
SegmentCombineConfig combine_config(const LinearAttnConfig& cfg) {
  return {cfg.block_k, cfg.block_v, cfg.gated ? SegmentDecay::per_head : SegmentDecay::none, cfg.initial_state,
          cfg.final_state, cfg.num_warps};
}

/// The forward's configurations for these inputs in order of preference, each with the user's --config
/// on top; the first whose kernels fit the GPU runs (kernels/common/fitting.h). Chunks of 128 in 16 bits
/// on sm_90a (where they fit: the plain walk at head dims up to 128, not the gated one, which spills
/// there; 3-15% faster than 64 with the TMA ring, docs/ops/linear_attn.md), else 64, else 32, else 16
/// (fp32 tiles are twice as large); fp32 above head dim 64 from 32 on: chunk 64 fits there but measured slower than 32
/// (docs/ops/linear_attn.md, "Measured"). For each, the defaults the tuner starts from (and what runs
/// without it), chosen by measurement (docs/ops/linear_attn.md, "Measured" and "Segments"): one program
/// per head and 128 value columns (wide_value_blocks) unless the 64-column programs all run in one
/// wave (few walks) without segments, else 64 columns (more programs), 8 warps for wide heads.
std::vector<LinearAttnConfig> forward_proposals(const SequenceLayout& seq, const OpOptions& opts, bool gated,
                                                bool initial_state, bool final_state) {
  std::vector<LinearAttnConfig> proposals, narrower;
  const bool wide_fp32 = opts.dtype == DType::f32 && padded_head_dim(seq.K) > 64;
  // Chunks of 128 were measured with sm_90a's TMA ring only; the gated walk at 128 rows spills (ptxas
  // 13.0: 284 bytes at K = V = 64, 452 at 128), so it keeps 64.
  const bool chunk_128 = opts.dtype != DType::f32 && device_limits(opts).sm >= 90 && !gated;
  for (int chunk : {128, 64, 32, 16}) {
    if ((wide_fp32 && chunk == 64) || (chunk == 128 && !chunk_128)) continue;
    LinearAttnConfig cfg;
    cfg.dtype = opts.dtype;
    cfg.block_k = padded_head_dim(seq.K);
    cfg.chunk = checked_chunk_size(opts.chunk_size, chunk);
    cfg.block_v = 64, cfg.num_warps = 8;
    const int64_t wide_walks = seq.N * seq.H * ((seq.V + 127) / 128);
    if (seq.V <= 64) {
      cfg.block_v = padded_head_dim(seq.V), cfg.num_warps = 4;
    } else if (wide_state_fits(seq.K) &&
               wide_value_blocks(wide_walks, default_segment(seq, wide_walks, cfg.chunk, opts) > 0, opts)) {
      cfg.block_v = 128;
    }
    cfg.num_stages = 2;
    auto completed = [&](LinearAttnConfig c) {
      c.segment = default_segment(seq, seq.N * seq.H * ((seq.V + c.block_v - 1) / c.block_v), c.chunk, opts);
      linear_attn_schema().apply(opts, c);
      c.gated = gated;
      c.initial_state = initial_state;
      c.final_state = final_state;
      c.varlen = seq.varlen;
      return c;
    };
    proposals.push_back(completed(cfg));
    if (cfg.block_v == 128) {
      cfg.block_v = 64;
      narrower.push_back(completed(cfg));
    }
  }
  // 64 columns after every 128-column proposal: at head dim 256 the segment schedule's output walk stages
  // its [256, 128] fp32 input state in 128 KB of shared memory, more than an sm_80 block has beside its
  // chunks.
  proposals.insert(proposals.end(), narrower.begin(), narrower.end());
  return proposals;
}

/// The walks of the segment-parallel forward for `cfg` (kernels/common/segments.h): no states of their own.
std::pair<LinearAttnConfig, LinearAttnConfig> segment_walks(const LinearAttnConfig& cfg) {
  LinearAttnConfig states = cfg, outputs = cfg;
  states.walk = LinearAttnWalk::segment_states;
  outputs.walk = LinearAttnWalk::segment_outputs;
  states.initial_state = states.final_state = outputs.initial_state = outputs.final_state = false;
  return {states, outputs};
}

/// The kernels the forward launches with `cfg`: the walk, or the segment-parallel schedule's three.
std::vector<std::shared_ptr<ir::Kernel>> forward_kernels(const LinearAttnConfig& cfg, const SequenceLayout& seq) {
  if (segments_per_sequence("linear_attn", seq, cfg.segment, cfg.chunk) <= 1) {
    LinearAttnConfig walk = cfg;
    walk.segment = 0;
    return {cached_linear_attn_fwd(walk)};
  }
  const auto [states, outputs] = segment_walks(cfg);
  return {cached_linear_attn_fwd(states), cached_segment_combine(combine_config(cfg)), cached_linear_attn_fwd(outputs)};
}

OpPlan plan_linear_attn_form(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  if (opts.backward)
    return opts.normalize ? plan_linear_attn_normalized_bwd(inputs, opts, wanted) : plan_linear_attn_bwd(inputs, opts, wanted);
  for (const char* name : {"do", "dfinal_state"})
    if (inputs.count(name)) throw UserError(fmt::format("linear_attn: input '{}' is a gradient; it needs --backward", name));
  if (opts.normalize) return plan_linear_attn_normalized(inputs, opts, wanted);
  if (opts.recurrent)
    return plan_recurrent("linear_attn", RecurrentGate::scalar, false, linear_attn_schema().tuning(), inputs, opts,
                          wanted);
  SequenceLayout seq = check_qkv_inputs("linear_attn", inputs);
  const bool gated = inputs.count("g") > 0;
  if (gated) check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H});
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});

  check_config_keys("linear_attn", opts, linear_attn_schema().tuning());
  LinearAttnConfig cfg = first_fitting<LinearAttnConfig>(
      forward_proposals(seq, opts, gated, has_h0, wants(wanted, "final_state")),
      [&](const LinearAttnConfig& c) { return forward_kernels(c, seq); }, opts);
  // A warpgroup of its own filling the gated walks' TMA ring (producer warps) in 16 bits, where their
  // rings take them: faster at the bar shape and at few heads (H200, gated walk 0.334 -> 0.273 ms at B8
  // T4096 H16 D128); not ungated, whose walk needs all 255 registers there (docs/hopper.md, "Session 33").
  if (gated) {
    default_producer_warps(
        cfg, &LinearAttnConfig::producer_warps, [&](const LinearAttnConfig& c) { return forward_kernels(c, seq); },
        opts);
  }
  const int64_t segments = segments_per_sequence("linear_attn", seq, cfg.segment, cfg.chunk);

  OpPlan plan;
  add_forward_tensors(plan, inputs, seq, cfg.dtype, cfg.final_state);
  if (gated) add_chunk_gate_sums(plan, seq, cfg.chunk);  // the walks read the gates' sums
  const int64_t v_blocks = (seq.V + cfg.block_v - 1) / cfg.block_v;
  const double scale = attention_scale(opts, seq.K);
  if (segments <= 1) {
    cfg.segment = 0;
    plan.launches.push_back(plan_launch(plan, cached_linear_attn_fwd(cfg), {v_blocks, seq.N * seq.H, 1}, {{"scale", scale}}));
  } else {
    // The segment-parallel forward (kernels/common/segments.h), decays per head when gated.
    const auto [states, outputs] = segment_walks(cfg);
    add_segment_schedule(plan, seq, segments, v_blocks, combine_config(cfg), cached_linear_attn_fwd(states),
                         cached_linear_attn_fwd(outputs), {{"scale", scale}});
  }
  if (wants(wanted, "o")) plan.outputs["o"] = "o";
  if (cfg.final_state) plan.outputs["final_state"] = "final_state";
  return plan;
}

/// Every form, then the noise-dropout multipliers when asked for (on o, or on do for the backward).
OpPlan plan_linear_attn(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  OpPlan plan = plan_linear_attn_form(inputs, opts, wanted);
  apply_noise_dropout(plan, opts, inputs);
  return plan;
}

}  // namespace

OpDef linear_attn_op() {
  OpDef op;
  op.name = "linear_attn";
  op.summary = "chunked linear attention forward, optional per-head scalar log-decay gate (docs/ops/linear_attn.md)";
  op.inputs = {
      {"q", true, "[B,T,H,K]", "queries"},
      {"k", true, "[B,T,H,K]", "keys"},
      {"v", true, "[B,T,H,V]", "values (a non-finite one makes all of its chunk's outputs non-finite)"},
      {"g", false, "[B,T,H]", "log-decay per token and head (<= 0; -inf drops the state)"},
      {"initial_state", false, "[N,H,K,V]", "state before the first token of each sequence (fp32)"},
      {"cu_seqlens", false, "[N+1]", "int32/int64 offsets of packed sequences (B must be 1)"},
      {"do", false, "[B,T,H,V]", "--backward: gradient of the loss w.r.t. o"},
      {"dfinal_state", false, "[N,H,K,V]", "--backward: gradient w.r.t. final_state (fp32)"},
  };
  op.outputs = {
      {"o", true, "[B,T,H,V]", "outputs"},
      {"final_state", false, "[N,H,K,V]", "state after the last token of each sequence (fp32)"},
      {"dq", false, "[B,T,H,K]", "--backward: gradient w.r.t. q"},
      {"dk", false, "[B,T,H,K]", "--backward: gradient w.r.t. k"},
      {"dv", false, "[B,T,H,V]", "--backward: gradient w.r.t. v"},
      {"dg", false, "[B,T,H]", "--backward: gradient w.r.t. g (fp32)"},
      {"dinitial_state", false, "[N,H,K,V]", "--backward: gradient w.r.t. initial_state (fp32)"},
  };
  op.prepare = plan_linear_attn;
  op.flags.push_back("normalize");
  op.flags.push_back("recurrent");
  op.flags.push_back("backward");
  op.flags.push_back("noise_dropout");
  op.random_inputs = [](const ProblemShape& s, uint64_t seed) {
    TensorMap in;
    in["q"] = random_uniform({s.B, s.T, s.H, s.K}, seed);
    in["k"] = random_uniform({s.B, s.T, s.H, s.K}, seed + 1);
    in["v"] = random_uniform({s.B, s.T, s.H, s.V}, seed + 2);
    if (s.gated) in["g"] = random_log_decay({s.B, s.T, s.H}, seed + 3);
    return in;
  };
  op.shape_of = [](const TensorMap& in) {
    const HostTensor& q = in.at("q");
    return ProblemShape{q.shape[0], q.shape[1], q.shape[2], q.shape[3], in.at("v").shape[3], in.count("g") > 0};
  };
  op.tuning_space = [](const ProblemShape& s, const OpOptions&) {
    // Chunk 64 with 64 or 128 value columns and 4 or 8 warps covers what won in measurements
    // (docs/ops/linear_attn.md, "Measured"); chunks of 32 and 128 as outliers. Configs that do not fit
    // are skipped.
    std::vector<Config> space = {{},  // the shape-based defaults
                                 {{"bv", 64}, {"warps", 4}}, {{"bv", 64}, {"warps", 8}}, {{"bv", 128}, {"warps", 8}},
                                 {{"bv", 32}, {"warps", 4}}, {{"chunk", 32}, {"bv", 64}, {"warps", 4}},
                                 {{"chunk", 128}, {"bv", 64}, {"warps", 8}}};
    if (s.V <= 64) space.push_back({{"bv", 64}, {"warps", 2}});
    // Three pipeline stages (one slack; products waited for an iteration late on sm_90a): about even
    // ungated at the bar shape, slower gated (docs/hopper.md, "Measured"); the shape decides.
    space.push_back({{"stages", 3}});
    return space;
  };
  op.bwd_tuning_space = [](const ProblemShape& s, const OpOptions& opts) {
    const DType dt = opts.dtype;
    // The default first (from the sweep in docs/ops/linear_attn.md, "Measured"), then that sweep's other
    // contenders; fp32 tiles are twice as large, so only its smaller configurations fit. Column blocks
    // are capped at the padded head dims (candidates that become equal are listed once).
    std::vector<Config> wanted =
        dt == DType::f32
            ? std::vector<Config>{{{"chunk", 32}, {"bk", 64}, {"bv", 64}, {"warps", 4}},
                                  {{"chunk", 16}, {"bk", 128}, {"bv", 128}, {"warps", 8}}}
            : std::vector<Config>{{{"chunk", 64}, {"bk", 128}, {"bv", 128}, {"warps", 8}},
                                  {{"chunk", 32}, {"bk", 128}, {"bv", 128}, {"warps", 8}},
                                  {{"chunk", 32}, {"bk", 64}, {"bv", 64}, {"warps", 4}},
                                  {{"chunk", 64}, {"bk", 64}, {"bv", 64}, {"warps", 4}},
                                  {{"chunk", 64}, {"bk", 128}, {"bv", 64}, {"warps", 8}}};
    // Few heads leave most SMs idle (one program per column block and head, each walking every chunk):
    // there 32-column blocks put four programs on each head.
    if (few_walks(s.B * s.H, opts)) {
      wanted.push_back({{"chunk", dt == DType::f32 ? 32 : 64}, {"bk", 32}, {"bv", 32}, {"warps", 4}});
      wanted.push_back({{"chunk", 32}, {"bk", 32}, {"bv", 32}, {"warps", 4}});
    }
    std::vector<Config> space{{}};
    for (Config c : wanted) {
      c["bk"] = std::min<int64_t>(c["bk"], padded_head_dim(s.K));
      c["bv"] = std::min<int64_t>(c["bv"], padded_head_dim(s.V));
      if (std::find(space.begin(), space.end(), c) == space.end()) space.push_back(c);
    }
    // The split schedule (plain form, head dims up to 128): the state passes in blocks, every chunk's
    // gradients in parallel (split_bwd.h).
    if (!s.gated && few_walks(s.B * s.H, opts) && std::max(s.K, s.V) <= 128) space.push_back({{"split", 1}});
    return space;
  };
  // Every key some form takes (the forward's, then the backward's others).
  op.config_keys = config_key_lines(merge_tuning_keys({linear_attn_schema().tuning(), linear_attn_bwd_tuning_keys()}));
  op.kernels = [](const OpOptions& opts) {
    check_config_keys("linear_attn", opts, linear_attn_schema().tuning());
    LinearAttnConfig cfg;
    cfg.dtype = opts.dtype;
    cfg.chunk = checked_chunk_size(opts.chunk_size, 64);
    cfg.block_k = 64;
    cfg.block_v = 64;
    cfg.num_warps = 4;
    cfg.num_stages = 2;
    linear_attn_schema().apply(opts, cfg);
    LinearAttnConfig gated = cfg;
    gated.gated = gated.initial_state = gated.final_state = true;
    std::vector<std::shared_ptr<ir::Kernel>> out{cached_linear_attn_fwd(cfg), cached_linear_attn_fwd(gated)};
    // The segment-parallel forward's three kernels, gated, with an initial and a final state.
    LinearAttnConfig segmented = gated;
    segmented.segment = 1024;
    const auto [states, outputs] = segment_walks(segmented);
    for (auto& k : {cached_linear_attn_fwd(states), cached_segment_combine(combine_config(gated)), cached_linear_attn_fwd(outputs)})
      out.push_back(k);
    for (auto& k : linear_attn_normalized_kernels(opts)) out.push_back(k);
    for (auto& k : recurrent_kernels(opts, RecurrentGate::scalar)) out.push_back(k);
    for (auto& k : linear_attn_bwd_kernels(opts)) out.push_back(k);
    for (auto& k : linear_attn_normalized_bwd_kernels(opts)) out.push_back(k);
    out.push_back(elementwise_update_kernel(ElementwiseUpdate::mul, opts.dtype, DType::f32, 4, 64));  // noise-dropout
    return out;
  };
  return op;
}

}  // namespace linac
