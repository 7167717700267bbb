// The op "gla" (docs/ops/gla.md): its registry entry and the forward's plans and defaults: gla_chunk
// and the walk gla_fwd, or the split schedule (a state pass, then gla_out) (fwd.h, split_bwd.h);
// --recurrent runs kernels/common/recurrent.h's token-by-token form, --backward op_bwd.cpp's plans.
#include "kernels/gla/op.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "kernels/common/config_schema.h"
#include "kernels/common/device_limits.h"
#include "kernels/common/fitting.h"
#include "kernels/common/op_support.h"
#include "kernels/common/segments.h"
#include "kernels/common/recurrent_op.h"
#include "kernels/gla/fwd.h"
#include "kernels/gla/split_bwd.h"
#include "linac/error.h"

namespace linac {

namespace {

/// The forward's configuration (fwd.h): chunk, bv, warps, stages, split and sbk are tuned.
const ConfigSchema<GlaConfig>& gla_schema() {
  using C = GlaConfig;
  static const ConfigSchema<C> schema(
      field<&C::dtype>(), tuned<&C::chunk>({"chunk", {16, 32, 64, 128}, "rows per chunk (sub-chunks of 16)"}),
      field<&C::block_k>(), tuned<&C::block_v>(bv_key({16, 32, 64, 128})), field<&C::initial_state>(),
      field<&C::final_state>(), field<&C::varlen>(), tuned<&C::num_warps>(warps_key()),
      tuned<&C::num_stages>(stages_key()),
      tuned<&C::split>({"split",
                        {0, 1},
                        "1: state pass + parallel outputs (dense inputs; varlen runs fused), 0: fused chunk loop; "
                        "--backward: state passes (states and their gradients per chunk), then per-chunk gradients"}),
      tuned<&C::state_block_k>({"sbk",
                                {16, 32, 64, 128},
                                "split=1: key columns per program of the state pass (default all; --backward 32)"}),
      field<&C::walk>(), tuned<&C::segment>(segment_key()), tuned<&C::producer_warps>(producer_key()));
  return schema;
}

enum class GlaKernel { chunk, walk, gates, state, out };

/// The split schedule's state pass (and its decayed keys) as the backward's kernels take it.
GlaSplitBwdConfig split_state_config(const GlaConfig& cfg) {
  GlaSplitBwdConfig s;
  s.dtype = cfg.dtype;
  s.chunk = cfg.chunk;
  s.block_k = cfg.block_k;
  s.block_v = cfg.block_v;
  s.state_block_k = cfg.state_block_k > 0 ? cfg.state_block_k : cfg.block_k;
  s.state_block_v = cfg.block_v;
  s.state_warps = cfg.num_warps;
  s.state_stages = cfg.num_stages;
  s.initial_state = cfg.initial_state;
  s.final_state = cfg.final_state;
  s.decay_queries = false;
  return s;
}

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_gla_kernel(const GlaConfig& cfg, GlaKernel which) {
  static KernelMemo memo;
  // gla_chunk reads only the dtype, the chunk, the key tile and varlen: one kernel for every
  // configuration that shares them (so the tuner's candidates share it too).
  GlaConfig prep;
  prep.dtype = cfg.dtype;
  prep.chunk = cfg.chunk;
  prep.block_k = cfg.block_k;
  prep.varlen = cfg.varlen;
  return memo.get(gla_schema().key(which == GlaKernel::chunk ? prep : cfg, which), [&] {
    switch (which) {
      case GlaKernel::chunk: return build_gla_chunk(prep);
      case GlaKernel::walk: return build_gla_fwd(cfg);
      case GlaKernel::gates: return build_gla_bwd_gates(split_state_config(cfg));
      case GlaKernel::state: return build_gla_bwd_states(split_state_config(cfg));
      case GlaKernel::out: return build_gla_out(cfg);
    }
    throw InternalError("bad gla kernel");
  });
}

/// The segments' combine for the forward's configuration (a decay per key channel).
SegmentCombineConfig combine_config(const GlaConfig& cfg) {
  // 8 warps whatever the walks take: on 4 its [128, 128] states spilled.
  return {cfg.block_k, cfg.block_v, SegmentDecay::per_channel, cfg.initial_state, cfg.final_state, 8};
}

/// The kernels the forward launches at `cfg` for `segments` per sequence after gla_chunk (which takes
/// no stages), in launch order: the split schedule's three (gates, state pass, outputs), the segment
/// walks (states, outputs) or the walk.
std::vector<std::shared_ptr<ir::Kernel>> forward_walk_kernels(const GlaConfig& cfg, int64_t segments) {
  if (cfg.split && !cfg.varlen)
    return {cached_gla_kernel(cfg, GlaKernel::gates), cached_gla_kernel(cfg, GlaKernel::state),
            cached_gla_kernel(cfg, GlaKernel::out)};
  if (segments > 1) {
    GlaConfig states = cfg, outputs = cfg;
    states.walk = GlaWalk::segment_states;
    outputs.walk = GlaWalk::segment_outputs;
    states.initial_state = states.final_state = outputs.initial_state = outputs.final_state = false;
    return {cached_gla_kernel(states, GlaKernel::walk), cached_gla_kernel(outputs, GlaKernel::walk)};
  }
  GlaConfig walk = cfg;
  walk.segment = 0;
  return {cached_gla_kernel(walk, GlaKernel::walk)};
}

/// The configuration for head dims K and V (opts.config and --chunk-size override the defaults); with
/// `seq`, the forward's: segments where few walks leave the GPU idle (kernels/common/segments.h), the
/// states it reads and writes and its pipeline stages fitted to the kernels it launches.
GlaConfig gla_config(const OpOptions& opts, int64_t K, int64_t V, const SequenceLayout* seq = nullptr,
                     bool initial_state = false, bool final_state = false) {
  check_config_keys("gla", opts, gla_schema().tuning());
  GlaConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(K);
  // Defaults chosen by measurement (docs/ops/gla.md, "Measured"): one program per 128 value columns for
  // K = 128, 32 columns otherwise. In 16 bits chunks of 32 at K = 128 (gla_chunk's programs at 64 rows
  // hold twice the shared memory), else of 64, and the walk on 4 warps up to K = 128, else 8; in fp32
  // chunks of 16 on 8 warps (fp32 products: the walk at 32 rows took longer than it saved gla_chunk, and
  // spilled on 4 warps). Chunks halve where gla_chunk does not fit (below).
  const bool half = dtype_bytes(cfg.dtype) == 2;
  const int64_t bv = std::min<int64_t>(padded_head_dim(V), cfg.block_k == 128 ? 128 : 32);
  cfg.chunk = checked_chunk_size(opts.chunk_size, !half ? 16 : cfg.block_k == 128 ? 32 : 64);
  cfg.block_v = static_cast<int>(bv);
  cfg.num_warps = half && cfg.block_k <= 128 ? 4 : 8;
  cfg.split = false;
  cfg.state_block_k = cfg.block_k;
  cfg.initial_state = initial_state;
  cfg.final_state = final_state;
  cfg.varlen = seq && seq->varlen;
  if (seq) cfg.segment = default_segment(*seq, seq->N * seq->H * ((V + cfg.block_v - 1) / cfg.block_v), cfg.chunk, opts);
  gla_schema().apply(opts, cfg);
  cfg.state_block_k = std::min(cfg.state_block_k, cfg.block_k);
  // gla_chunk holds the chunk's q, k and g tiles: halve the chunk until it fits the call's GPU (16 bits
  // at K = 256 and chunks of 64 do not fit an A100's block), unless asked for.
  if (!opts.chunk_size && !opts.config.count("chunk")) {
    std::vector<int> chunks;
    for (int c = cfg.chunk; c >= kGlaSubChunk; c /= 2) chunks.push_back(c);
    cfg.chunk = first_fitting<int>(
        chunks,
        [&](const int& chunk) {
          GlaConfig c = cfg;
          c.chunk = chunk;
          return std::vector<std::shared_ptr<ir::Kernel>>{cached_gla_kernel(c, GlaKernel::chunk)};
        },
        opts);
  }
  if (cfg.split && opts.config.count("segment"))
    throw UserError("gla: --config split=1 and segment are two schedules; choose one");
  if (cfg.split) cfg.segment = 0;  // the split schedule is its own answer to few walks
  // The chunk loads pipelined (cp.async one chunk ahead) where both stages fit the call's GPU, in every
  // dtype: faster for 16-bit tiles (the tuner had been picking it) and, since measured, for fp32 too
  // (docs/ops/gla.md, "Measured", session 18); one stage where two do not fit.
  const int64_t segments = seq ? segments_per_sequence("gla", *seq, cfg.segment, cfg.chunk) : 1;
  const std::vector<int> proposals =
      stages_key().asked(opts) ? std::vector<int>{cfg.num_stages} : std::vector<int>{2, 1};
  cfg.num_stages = first_fitting<int>(
      proposals,
      [&](const int& stages) {
        GlaConfig c = cfg;
        c.num_stages = stages;
        return forward_walk_kernels(c, segments);
      },
      opts);
  // A warpgroup of its own filling the walks' TMA ring (producer warps) in 16 bits, where their rings
  // take them: faster at the bar shape and in segments (H200, walk 0.235 -> 0.200 ms at B8 T4096 H16
  // D128; docs/ops/gla.md, "Measured", session 34).
  default_producer_warps(
      cfg, &GlaConfig::producer_warps, [&](const GlaConfig& c) { return forward_walk_kernels(c, segments); }, opts);
  return cfg;
}

OpPlan plan_gla(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  if (opts.backward) return plan_gla_bwd(inputs, opts, wanted);
  for (const char* name : {"do", "dfinal_state"})
    if (inputs.count(name)) throw UserError(fmt::format("gla: input '{}' is a gradient; it needs --backward", name));
  if (opts.recurrent)
    return plan_recurrent("gla", RecurrentGate::channel, true, gla_schema().tuning(), inputs, opts, wanted);
  SequenceLayout seq = check_qkv_inputs("gla", inputs);
  if (!inputs.count("g")) throw UserError("gla: missing input 'g'");
  check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H, seq.K});
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});

  GlaConfig cfg = gla_config(opts, seq.K, seq.V, &seq, has_h0, wants(wanted, "final_state"));
  const int64_t segments = segments_per_sequence("gla", seq, cfg.segment, cfg.chunk);

  OpPlan plan;
  add_forward_tensors(plan, inputs, seq, cfg.dtype, cfg.final_state);
  const double scale = attention_scale(opts, seq.K);

  // Every chunk prepared in parallel: one program per chunk of each sequence and head.
  HostTensor offsets, indices;
  const int64_t chunks = chunk_tables(seq, cfg.chunk, &offsets, &indices);
  plan.tensors["chunk_offsets"] = offsets;
  if (seq.varlen) plan.tensors["chunk_indices"] = indices;
  plan.tensors["qg"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["kg"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["a"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, cfg.chunk});
  plan.tensors["chunk_decay"] = HostTensor::zeros(DType::f32, {std::max<int64_t>(chunks, 1), seq.H, seq.K});
  if (chunks > 0) {
    const int64_t per_sequence = (seq.T + cfg.chunk - 1) / cfg.chunk;
    plan.launches.push_back(plan_launch(plan, cached_gla_kernel(cfg, GlaKernel::chunk),
                                        {seq.varlen ? chunks : per_sequence, seq.varlen ? seq.H : seq.B * seq.H, 1},
                                        {{"scale", scale}}));
  }

  const int64_t num_v_blocks = (seq.V + cfg.block_v - 1) / cfg.block_v;
  const auto walks = forward_walk_kernels(cfg, segments);  // the kernels gla_config fitted
  if (cfg.split && !seq.varlen) {
    const int64_t num_chunks = (seq.T + cfg.chunk - 1) / cfg.chunk;
    plan.tensors["h"] = HostTensor::zeros(cfg.dtype, {seq.B, num_chunks, seq.H, seq.K, seq.V});
    plan.tensors["kd"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
    plan.tensors["etot"] = HostTensor::zeros(DType::f32, {seq.B, std::max<int64_t>(num_chunks, 1), seq.H, seq.K});
    if (num_chunks > 0) plan.launches.push_back(plan_launch(plan, walks[0], {num_chunks, seq.N * seq.H, 1}, {}));
    plan.launches.push_back(plan_launch(
        plan, walks[1], {num_v_blocks, seq.N * seq.H, (cfg.block_k + cfg.state_block_k - 1) / cfg.state_block_k}, {}));
    plan.launches.push_back(plan_launch(plan, walks[2], {std::max<int64_t>(num_chunks, 1), seq.N * seq.H, num_v_blocks},
                                        {{"scale", scale}}));
  } else if (segments > 1) {
    // The segment-parallel forward (kernels/common/segments.h), decays per key channel.
    add_segment_schedule(plan, seq, segments, num_v_blocks, combine_config(cfg), walks[0], walks[1],
                         {{"scale", scale}});
  } else {
    plan.launches.push_back(plan_launch(plan, walks[0], {num_v_blocks, seq.N * seq.H, 1}, {{"scale", scale}}));
  }
  if (wants(wanted, "o")) plan.outputs["o"] = "o";
  if (cfg.final_state) plan.outputs["final_state"] = "final_state";
  return plan;
}

}  // namespace

OpDef gla_op() {
  OpDef op;
  op.name = "gla";
  op.summary = "gated linear attention forward, per-channel log-decay gate, decay-aware sub-chunks (docs/ops/gla.md)";
  op.inputs = {
      {"q", true, "[B,T,H,K]", "queries"},
      {"k", true, "[B,T,H,K]", "keys"},
      {"v", true, "[B,T,H,V]", "values (a non-finite one makes all of its chunk's outputs non-finite)"},
      {"g", true, "[B,T,H,K]", "log-decay per token, head and key channel (<= 0, -inf drops the state; fp32)"},
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
      {"dg", false, "[B,T,H,K]", "--backward: gradient w.r.t. g (fp32)"},
      {"dinitial_state", false, "[N,H,K,V]", "--backward: gradient w.r.t. initial_state (fp32)"},
  };
  op.flags = {"recurrent", "backward"};
  op.prepare = plan_gla;
  op.bwd_tuning_space = [](const ProblemShape& s, const OpOptions& opts) {
    // The chunked backward's chunk, column blocks and warps: the default (16-bit: chunk 16, whole
    // 128-column blocks, 8 warps) and the runners-up measured (docs/ops/gla.md, "Measured"); intra with
    // 8 warps was slower there, and take=0 (masked row sums in gla_bwd_intra) too, so neither is offered.
    std::vector<Config> space{{},
                              {{"chunk", 16}, {"bk", 64}, {"bv", 64}, {"warps", 4}},
                              {{"chunk", 32}, {"bk", 64}, {"bv", 64}, {"warps", 8}}};
    // Both schedules where few walks leave SMs idle (head dims up to 128; the default picks by shape,
    // see split_by_default in op_bwd.cpp). gla_bwd_inter at 4 warps was slower (docs/ops/gla.md).
    if (few_walks(s.B * s.H, opts) && std::max(s.K, s.V) <= 128) {
      space.push_back({{"split", 1}});
      space.push_back({{"split", 0}});
    }
    return space;
  };
  // Every key some form takes (the forward's, then the backward's others).
  op.config_keys = config_key_lines(merge_tuning_keys({gla_schema().tuning(), gla_bwd_tuning_keys()}));
  op.random_inputs = [](const ProblemShape& s, uint64_t seed) {
    TensorMap in;
    in["q"] = random_uniform({s.B, s.T, s.H, s.K}, seed);
    in["k"] = random_uniform({s.B, s.T, s.H, s.K}, seed + 1);
    in["v"] = random_uniform({s.B, s.T, s.H, s.V}, seed + 2);
    in["g"] = random_log_decay({s.B, s.T, s.H, s.K}, seed + 3);
    return in;
  };
  op.shape_of = [](const TensorMap& in) {
    const HostTensor& q = in.at("q");
    return ProblemShape{q.shape[0], q.shape[1], q.shape[2], q.shape[3], in.at("v").shape[3], true};
  };
  op.tuning_space = [](const ProblemShape& s, const OpOptions& opts) {
    // The defaults first; then what won in measurements at other sizes (docs/ops/gla.md, "Measured").
    std::vector<Config> space{{},
                              {{"chunk", 64}, {"warps", 8}},
                              {{"chunk", 64}, {"warps", 4}},
                              {{"chunk", 32}, {"warps", 4}},
                              {{"chunk", 32}, {"bv", 64}, {"warps", 4}}};
    // The split schedule (a state pass, then every chunk's outputs in parallel) pays for its state
    // round trip through memory with parallelism over chunks: only when the fused walks leave SMs idle.
    // With 128 heads (B8 H16) it never won (docs/ops/gla.md, "Measured") and cost 4 of 9 candidates'
    // compile and timing in every cold start.
    if (few_walks(s.B * s.H, opts)) {
      // Key blocks in the state pass (sbk) for more programs (docs/ops/gla.md, "Measured").
      space.push_back({{"split", 1}, {"chunk", 64}, {"bv", 128}, {"warps", 8}});
      space.push_back({{"split", 1}, {"chunk", 32}, {"bv", 64}, {"warps", 4}});
      space.push_back({{"split", 1}, {"chunk", 64}, {"bv", 64}, {"sbk", 64}, {"warps", 4}, {"stages", 2}});
      space.push_back({{"split", 1}, {"chunk", 64}, {"bv", 64}, {"sbk", 32}, {"warps", 4}, {"stages", 2}});
      space.push_back({{"split", 1}, {"chunk", 32}, {"bv", 64}, {"sbk", 32}, {"warps", 4}, {"stages", 2}});
    }
    return space;
  };
  op.kernels = [](const OpOptions& opts) {
    // The chunked form (diagonal blocks, then the chunk loop) for K = V = 64 and K = V = 128 with
    // both states, and the recurrent form.
    std::vector<std::shared_ptr<ir::Kernel>> out;
    for (int64_t d : {64, 128}) {
      GlaConfig cfg = gla_config(opts, d, d, nullptr, /*initial_state=*/true, /*final_state=*/true);
      out.push_back(cached_gla_kernel(cfg, GlaKernel::chunk));
      out.push_back(cached_gla_kernel(cfg, GlaKernel::walk));
      // The split schedule at its first tuning-space configuration.
      GlaConfig split = cfg;
      split.chunk = 64;
      // (fp32 takes the FMA path for its dots, and K = 128 holds a [128, BV] state: narrower V blocks
      // keep them within registers.)
      split.block_v = opts.dtype == DType::f32 || d == 128 ? 32 : 64;
      split.num_warps = d == 128 ? 8 : 4;
      out.push_back(cached_gla_kernel(split, GlaKernel::chunk));
      out.push_back(cached_gla_kernel(split, GlaKernel::gates));
      out.push_back(cached_gla_kernel(split, GlaKernel::state));
      out.push_back(cached_gla_kernel(split, GlaKernel::out));
      // The segment-parallel forward's kernels.
      GlaConfig states = cfg, outputs = cfg;
      states.segment = outputs.segment = 1024;
      states.walk = GlaWalk::segment_states;
      outputs.walk = GlaWalk::segment_outputs;
      states.initial_state = states.final_state = outputs.initial_state = outputs.final_state = false;
      out.push_back(cached_gla_kernel(states, GlaKernel::walk));
      out.push_back(cached_segment_combine(combine_config(cfg)));
      out.push_back(cached_gla_kernel(outputs, GlaKernel::walk));
    }
    for (auto& k : recurrent_kernels(opts, RecurrentGate::channel)) out.push_back(k);
    for (auto& k : gla_bwd_kernels(opts)) out.push_back(k);
    return out;
  };
  return op;
}

}  // namespace linac
