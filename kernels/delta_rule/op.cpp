// The ops "delta_rule" and "gated_delta_rule" (docs/ops/delta_rule.md, docs/ops/gated_delta_rule.md):
// their registry entries and the forward's plans and defaults: delta_rule_wy then the walk delta_rule_fwd,
// or the segment-parallel walk (delta_rule_segment_states, the segments' combine, delta_rule_fwd per
// segment), or the split schedule (a state pass, then delta_rule_out), or the token-by-token kernel
// (fwd.h); the backward's plans are in op_bwd.cpp.
#include "kernels/delta_rule/op.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fmt/format.h>

#include "kernels/common/chunk_gate_sums.h"
#include "kernels/common/config_schema.h"
#include "kernels/common/device_limits.h"
#include "kernels/common/fitting.h"
#include "kernels/common/op_support.h"
#include "kernels/common/overlap.h"
#include "kernels/common/segments.h"
#include "kernels/delta_rule/bwd.h"
#include "kernels/delta_rule/fwd.h"
#include "kernels/delta_rule/norm_tables.h"
#include "linac/error.h"

namespace linac {

namespace {

/// The forward's rows per chunk (plan_delta_rule asks whether it was given: saving for the backward
/// takes the backward's chunk unless one is asked for).
TuningKey fwd_chunk_key() { return chunk_key(); }

/// The UT kernel's rows per transform where it composes a chunk from two (fwd.h, ut_chunk).
TuningKey ut_key() {
  return {"ut", {0, 16, 32},
          "rows per UT transform where half the chunk: the UT kernel composes the chunk's W and U from two (not "
          "with saved_* outputs); 0: the chunk's own. Default 32 at chunks of 64 in 16 bits up to head dim 128 "
          "on sm_90a, else 0"};
}

/// The UT kernel's warps (fwd.h, wy_warps).
TuningKey ut_warps_key() {
  return {"ut_warps", {2, 4, 8},
          "warps of the UT kernel (delta_rule_wy): with tform its products are of [16, 16] blocks, which span two "
          "warps (more hold copies), so two leave room for more of its programs per SM. Default 2 where the UT "
          "kernel composes T from halves (tform, ut), else 4 (W and U's products span more)"};
}

/// Whether the chunks' scores are formed once by a kernel of their own (fwd.h, scores).
TuningKey scores_key() {
  return {"scores", {0, 1},
          "1: each chunk's scores (Q K^T .* decays) formed once by a kernel over all chunks and read by the walk's "
          "value blocks (the fused or segmented walk); 0: each value block forms them. Default 1 where the gated "
          "walk takes value blocks narrower than V and the UT kernel composes chunks of 64, else 0"};
}

/// Whether the walk forms V_new from the chunk's T and v (fwd.h, tform).
TuningKey tform_key() {
  return {"tform", {0, 1},
          "1: the UT kernel stores each chunk's T alone and the walk forms V_new = T (beta .* (V - decays .* K S)) "
          "from it and v (no W, U written and read); 0: the UT kernel forms W and U. Not with split, segment "
          "or saved_* outputs. Default 1 where the UT kernel composes chunks of 64 (ut), else 0"};
}

/// Whether the walk runs beside the UT and scores kernels (fwd.h, overlap).
TuningKey overlap_key() {
  return {"overlap", {0, 1},
          "1: the walk runs beside the UT (and scores) kernels, waiting for each group of chunks' flag instead of "
          "for their end; sm_90 on, fewer walk programs than SMs, dense inputs, the fused chunked walk. Default 0 "
          "(measured no faster: docs/ops/delta_rule.md); the tuner tries it at few heads"};
}

/// The forward's configuration (fwd.h): chunk, bv, warps, stages, split, segment, ut, scores, tform and
/// overlap are tuned.
const ConfigSchema<DeltaRuleConfig>& delta_rule_schema() {
  using C = DeltaRuleConfig;
  static const ConfigSchema<C> schema(
      field<&C::dtype>(), tuned<&C::chunk>(fwd_chunk_key()), field<&C::block_k>(), tuned<&C::block_v>(bv_key()),
      field<&C::gated>(), field<&C::l2norm_qk>(), field<&C::initial_state>(), field<&C::final_state>(),
      field<&C::varlen>(), tuned<&C::num_warps>(warps_key()), tuned<&C::wy_warps>(ut_warps_key()),
      tuned<&C::num_stages>(stages_key()), field<&C::store_t>(), field<&C::save_states>(),
      tuned<&C::split>({"split",
                        {0, 1},
                        "1: a state pass storing the state before every chunk, then every chunk's outputs in "
                        "parallel (not with --l2norm-qk); 0: the fused walk"}),
      field<&C::wy_block_v>(), field<&C::v_blocks>(), tuned<&C::segment>(segment_key()),
      tuned<&C::ut_chunk>(ut_key()), tuned<&C::scores>(scores_key()), tuned<&C::tform>(tform_key()),
      tuned<&C::overlap>(overlap_key()), field<&C::early_products>(), tuned<&C::producer_warps>(producer_key()));
  return schema;
}

enum class DeltaKernel { wy, fwd, segment_states, out, recurrent, scores };

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_delta_kernel(DeltaKernel which, const DeltaRuleConfig& cfg) {
  static KernelMemo memo;
  return memo.get(delta_rule_schema().key(cfg, which), [&]() -> std::shared_ptr<ir::Kernel> {
    switch (which) {
      case DeltaKernel::wy: return build_delta_rule_wy(cfg);
      case DeltaKernel::fwd: return build_delta_rule_fwd(cfg);
      case DeltaKernel::segment_states: return build_delta_rule_segment_states(cfg);
      case DeltaKernel::out: return build_delta_rule_out(cfg);
      case DeltaKernel::recurrent: return build_delta_rule_recurrent(cfg);
      case DeltaKernel::scores: return build_delta_rule_scores(cfg);
    }
    throw InternalError("bad delta-rule kernel");
  });
}

/// What a forward call asks of the walk beyond its shapes (its kernel, so its fit, depends on them).
struct DeltaForwardCall {
  bool save = false;  // the saved_* outputs: T, the state before each chunk and V_new
  bool initial_state = false, final_state = false, varlen = false;
};

/// The configuration for head dims K, V: defaults, then opts.config on top, then the walk's pipeline
/// stages fitted to the call's GPU. `heads`: sequences x heads of the call (0: unknown), for the
/// few-heads value blocks.
DeltaRuleConfig delta_rule_config(const char* op, bool gated, int64_t K, int64_t V, const OpOptions& opts,
                                  int64_t heads = 0, const DeltaForwardCall& call = {}) {
  check_config_keys(op, opts, delta_rule_schema().tuning());
  DeltaRuleConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.gated = gated;
  cfg.l2norm_qk = opts.l2norm_qk;
  cfg.block_k = padded_head_dim(K);
  // Defaults, each for a reason:
  const bool small = K <= 64 && V <= 64, fp32 = dtype_bytes(cfg.dtype) == 4;
  //  - value blocks of 128 for the 16-bit walk above head dim 64 (one program holds the whole state; no
  //    program redoes another's W S); where those walks are few, halved down to 32 while they stay few
  //    (columns_for_walks: more programs), on 4 warps below 128 columns. Each faster where it applies
  //    (docs/ops/delta_rule.md, "Measured").
  const int64_t widest = std::min<int64_t>(128, padded_head_dim(V));
  const int64_t wide_v = !small && !fp32 ? columns_for_walks(widest, padded_head_dim(V), heads, 32, opts) : 64;
  //  - chunks of 64 in 16 bits up to head dim 128, the UT kernel composing each chunk's W and U from two
  //    transforms of 32 rows (ut_chunk; its own 64-row transform costs more): the walk's chain has half
  //    the steps. Not where the walk takes 64-column blocks on 4 warps above head dim 64 (255 registers
  //    at either chunk: no shorter per row at 64, and the UT kernel's part grows), nor in fp32, nor
  //    when saving for the backward (its chunk, T kept), nor on sm_80 (the 64-row walk spills there on
  //    mma.sync: 255 registers). Else chunks of 32 (fp32: 4 warps and 32 value columns), spill-free
  //    under ptxas (sm_80, sm_90a). Each measured faster where it applies (docs/ops/delta_rule.md,
  //    "Measured"; with --l2norm-qk since session 30).
  const bool composes = !fp32 && K <= 128 && V <= 128 && !call.save && device_limits(opts).sm >= 90;
  cfg.chunk = checked_chunk_size(opts.chunk_size, small || (composes && wide_v != 64) ? 64 : 32);
  cfg.block_v = std::min(padded_head_dim(V), opts.recurrent || (fp32 && !small) ? 32 : static_cast<int>(wide_v));
  cfg.num_warps = small || (fp32 && !opts.recurrent) ? 4
                  : opts.recurrent                   ? 8
                                                     : delta_walk_warps(wide_v, padded_head_dim(V), 8);
  cfg.split = false;
  cfg.store_t = cfg.save_states = call.save;
  cfg.initial_state = call.initial_state;
  cfg.final_state = call.final_state;
  cfg.varlen = call.varlen;
  delta_rule_schema().apply(opts, cfg);
  if (!ut_key().asked(opts)) cfg.ut_chunk = composes && cfg.chunk == 64 ? 32 : 0;
  if (cfg.ut_chunk == cfg.chunk) cfg.ut_chunk = 0;  // a transform of the whole chunk: its own
  // The schedules the rules below name, each stated once: the fused chunked walk (one program per value
  // block walks every chunk of its sequence: not split, segmented, token by token or saving for the
  // backward), and the few-heads walk (value blocks narrower than V on composed chunks of 64).
  const bool fused_walk = !cfg.split && cfg.segment == 0 && !opts.recurrent && !cfg.store_t;
  const bool few_heads_walk = cfg.ut_chunk > 0 && cfg.block_v < padded_head_dim(V);
  //  - each chunk's scores formed once, by a kernel over all chunks, for the gated few-heads walk: its
  //    value blocks each formed them, decays included. Not ungated (its walk saves less than the scores
  //    kernel costs) nor where one block holds V (docs/ops/delta_rule.md, "Measured", session 30).
  if (!scores_key().asked(opts)) cfg.scores = gated && few_heads_walk && !cfg.split && !opts.recurrent;
  //  - the walk forming V_new from each chunk's T and v (tform) where the UT kernel composes chunks of 64:
  //    the UT kernel then writes T alone, no W and U, and the walk's longer chain costs less than that
  //    saves, both ops at the bar shape and at few heads, with and without --l2norm-qk
  //    (docs/ops/delta_rule.md, "Measured", session 31). Not with the schedules that read W and U.
  if (!tform_key().asked(opts)) cfg.tform = cfg.ut_chunk > 0 && fused_walk;
  //  - the UT kernel on 2 warps where it forms T alone from halves: its [16, 16] blocks' products span
  //    two warps, and fewer warps and less shared memory per program fit more programs per SM; with W
  //    and U (products across V) 4 (docs/ops/delta_rule.md, "Measured", session 32).
  if (!ut_warps_key().asked(opts)) cfg.wy_warps = cfg.tform && cfg.ut_chunk > 0 ? 2 : 4;
  //  - the few-heads walk's products off the chain (Q S, Q K^T, P V_new) issued beside the chain's, each
  //    waited for at its first use: faster there for both ops; the wide walk then holds their
  //    accumulators through the chain, spills and runs slower (docs/ops/delta_rule.md, "Measured",
  //    session 32).
  cfg.early_products = few_heads_walk;
  //  - the walk after the UT (and scores) kernels, not beside them (overlap): at few heads, where its
  //    programs leave SMs to theirs, beside measured no faster (docs/ops/delta_rule.md, "Measured",
  //    session 31). Asked for, only where it cannot wait for ever (overlap.h): the call's heads known.
  const int64_t walk_programs = heads * ((padded_head_dim(V) + cfg.block_v - 1) / cfg.block_v);
  const bool walk_beside_fits = heads > 0 && !call.varlen && fused_walk && walk_may_overlap(walk_programs, opts);
  // With --l2norm-qk the scores kernel reads the norms' tables that the UT kernel writes: in stream order
  // it runs after it, but beside the walk both start early and run at once (a GPU test read zero norms,
  // session 32): refused rather than racing.
  if (cfg.overlap && cfg.scores && opts.l2norm_qk)
    throw UserError(fmt::format("{}: --config overlap=1 does not take scores=1 with --l2norm-qk (the scores kernel "
                                "reads the norms the UT kernel writes, and beside the walk the two run at once); "
                                "add scores=0",
                                op));
  if (cfg.overlap && !walk_beside_fits)
    throw UserError(fmt::format("{}: --config overlap=1 runs the walk beside the UT kernel: only for dense inputs, "
                                "the fused chunked walk (not split, segment, --recurrent or saved_* outputs), on sm_90 "
                                "or later with fewer walk programs ({}) than the GPU's SMs ({})",
                                op, walk_programs, device_limits(opts).sms));
  cfg.wy_block_v = delta_wy_block_v(cfg.dtype, cfg.block_v, padded_head_dim(V), cfg.ut_chunk > 0);
  cfg.v_blocks = static_cast<int>((padded_head_dim(V) + cfg.wy_block_v - 1) / cfg.wy_block_v);
  if (cfg.split && opts.l2norm_qk) throw UserError(fmt::format("{}: --config split=1 does not take --l2norm-qk", op));
  if (cfg.split && opts.recurrent) throw UserError(fmt::format("{}: --config split=1 is for the chunked form, not --recurrent", op));
  if (cfg.scores && (cfg.split || opts.recurrent))
    throw UserError(fmt::format("{}: --config scores=1 is for the chunked walk, not {}", op,
                                cfg.split ? "split=1" : "--recurrent"));
  if (cfg.ut_chunk > 0 && (2 * cfg.ut_chunk != cfg.chunk || cfg.store_t))
    throw UserError(fmt::format("{}: --config ut={} needs chunks of {} rows and no saved_* outputs (those keep the "
                                "chunk's T)", op, cfg.ut_chunk, 2 * cfg.ut_chunk));
  if (cfg.tform && !fused_walk)
    throw UserError(fmt::format("{}: --config tform=1 is for the fused chunked walk: not with split, segment, "
                                "--recurrent or saved_* outputs", op));
  if (cfg.segment > 0 && (cfg.split || opts.recurrent))
    throw UserError(fmt::format("{}: --config segment is a schedule of the chunked walk: not with {}", op,
                                cfg.split ? "split=1" : "--recurrent"));
  //  - the walk's Q, K and W blocks pipelined (cp.async one chunk ahead) where two stages fit the call's
  //    GPU (K = 256 included), but fp32 at BK >= 128 proposes one: there its two-stage walk measured
  //    slower (a block per SM instead of three; docs/ops/delta_rule.md, "Measured", session 18). Three
  //    (one slack) first for the few-heads walk on composed chunks of 64, where it measured faster for
  //    both ops (session 31); at the bar shape gated's does not fit and delta_rule's measured the same.
  std::vector<int> proposals = fp32 && cfg.block_k >= 128 ? std::vector<int>{1}
                               : few_heads_walk         ? std::vector<int>{3, 2, 1}
                                                        : std::vector<int>{2, 1};
  if (stages_key().asked(opts)) proposals = {cfg.num_stages};
  const bool walks = !cfg.split && !opts.recurrent;  // delta_rule_fwd is the only kernel with stages
  auto walk_of = [&](int stages, DeltaRuleConfig c) {
    c.num_stages = stages;
    return std::vector<std::shared_ptr<ir::Kernel>>{cached_delta_kernel(DeltaKernel::fwd, c)};
  };
  cfg.num_stages =
      walks ? first_fitting<int>(proposals, [&](const int& stages) { return walk_of(stages, cfg); }, opts)
            : proposals.front();
  //  - a warpgroup of its own filling the walk's TMA ring (producer warps) in 16 bits, where the walk's
  //    ring takes them: faster for both ops at the bar shape and at few heads (H200: walks 6-21%,
  //    docs/hopper.md, "Session 33"), and for the walk saving the backward's tensors. Not beside the
  //    walk's producers (overlap: it waits for flags).
  if (walks && !cfg.overlap) {
    auto walk = [&](const DeltaRuleConfig& c) { return walk_of(c.num_stages, c); };
    default_producer_warps(cfg, &DeltaRuleConfig::producer_warps, walk, opts);
  }
  return cfg;
}

OpPlan plan_delta_rule(bool gated, const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  const char* name = gated ? "gated_delta_rule" : "delta_rule";
  if (opts.backward) return plan_delta_rule_bwd(gated, inputs, opts, wanted);
  for (const char* grad : {"do", "dfinal_state"})
    if (inputs.count(grad)) throw UserError(fmt::format("{}: input '{}' is a gradient; it needs --backward", name, grad));
  SequenceLayout seq = check_qkv_inputs(name, inputs);
  if (!inputs.count("beta")) throw UserError(fmt::format("{}: missing input 'beta'", name));
  check_shape("beta", inputs.at("beta"), {seq.B, seq.T, seq.H});
  if (gated) {
    if (!inputs.count("g")) throw UserError(fmt::format("{}: missing input 'g'", name));
    check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H});
  }
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});

  // Saving for the backward (any saved_* output wanted): delta_rule_wy also stores T and the walk the
  // state before each chunk and V_new; with W these are what the backward would recompute
  // (bwd.h). At the backward's chunk unless one is asked for.
  bool save = false;
  for (const auto& t : delta_saved_tensors()) save = save || wants(wanted, t.name);
  if (save && opts.recurrent) throw UserError(fmt::format("{}: saved_* outputs come from the chunked form, not --recurrent", name));
  if (save && opts.l2norm_qk)
    throw UserError(fmt::format("{}: saved_* outputs are not made with --l2norm-qk (its backward recomputes them)", name));
  OpOptions fwd_opts = opts;
  const bool chunk_asked = opts.chunk_size || fwd_chunk_key().asked(opts);
  if (save && !chunk_asked)
    fwd_opts.chunk_size = delta_bwd_default_chunk(opts, gated, seq.K, seq.V, seq.N * seq.H);
  DeltaRuleConfig cfg = delta_rule_config(name, gated, seq.K, seq.V, fwd_opts, seq.N * seq.H,
                                          {save, has_h0, wants(wanted, "final_state"), seq.varlen});
  if (save && cfg.chunk > 64)
    throw UserError(fmt::format("{}: saved_* outputs need chunks of 16, 32 or 64 (the backward's), not {}", name, cfg.chunk));

  OpPlan plan;
  add_forward_tensors(plan, inputs, seq, cfg.dtype, cfg.final_state);
  plan.tensors["beta"] = inputs.at("beta").cast(DType::f32);

  // The launch that walks each (sequence, head, V block): the recurrent kernel or the chunk kernel.
  const int64_t num_v_blocks = (seq.V + cfg.block_v - 1) / cfg.block_v;
  const std::array<int64_t, 3> walk_grid = {num_v_blocks, seq.N * seq.H, 1};
  const double scale = attention_scale(opts, seq.K);
  // The chunked walk in segments when asked (--config segment=L, kernels/common/segments.h): not by
  // default, since at few walks it measured at most 5% faster (gated) or slower (docs/ops/delta_rule.md,
  // "Few heads: sequence parallelism"); the tuner tries it there.
  const int64_t segments = opts.recurrent || cfg.split ? 1 : segments_per_sequence(name, seq, cfg.segment, cfg.chunk);
  if (segments <= 1) cfg.segment = 0;

  if (opts.recurrent) {
    plan.launches.push_back(
        plan_launch(plan, cached_delta_kernel(DeltaKernel::recurrent, cfg), walk_grid, {{"scale", scale}}));
  } else {
    // w and u are scratch: every row of every sequence is written by delta_rule_wy before
    // delta_rule_fwd reads it. u's columns are V padded to whole blocks of delta_rule_wy's (zero past V),
    // which the walk's blocks divide: every block either kernel stores or loads lies inside it.
    // With tform, T alone ([B, T, H, BT], rows, as saving keeps it) in their place.
    if (cfg.tform) {
      plan.tensors["t_mat"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, cfg.chunk});
    } else {
      plan.tensors["w"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
      plan.tensors["u"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, int64_t{cfg.v_blocks} * cfg.wy_block_v});
    }
    // The chunk tables: (sequence, chunk of it) per program with varlen, and the first global chunk of
    // every sequence (the rows of the per-chunk state table).
    HostTensor offsets, indices;
    const int64_t total_chunks = chunk_tables(seq, cfg.chunk, &offsets, &indices);
    const int64_t chunks = seq.varlen ? total_chunks : (seq.T + cfg.chunk - 1) / cfg.chunk;
    if (seq.varlen) plan.tensors["chunk_indices"] = indices;
    plan.tensors["chunk_offsets"] = offsets;
    if (gated) add_chunk_gate_sums(plan, seq, cfg.chunk);
    if (opts.l2norm_qk) add_inverse_norm_tables(plan, total_chunks, seq.H, cfg.chunk);
    if (save || cfg.split) {
      // The state before each chunk ([chunks, H, K, V], indexed by global chunk) and V_new.
      plan.tensors["h"] = HostTensor::zeros(cfg.dtype, {std::max<int64_t>(total_chunks, 1), seq.H, seq.K, seq.V});
      plan.tensors["v_new"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
    }
    if (save) {
      plan.tensors["t_mat"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, cfg.chunk});
      for (const auto& t : delta_saved_tensors()) plan.outputs[t.name] = t.tensor;
    }
    DeltaRuleConfig wy = cfg;
    wy.segment = 0;  // the UT kernel is the same for every schedule
    wy.scores = false;
    // With overlap the heads are the grid's first axis (programs placed in the chunks' order) and each
    // chunk's flag counts the producers done with it.
    const int64_t heads_axis = seq.varlen ? seq.H : seq.B * seq.H;
    const std::array<int64_t, 3> per_chunk =
        cfg.overlap ? std::array<int64_t, 3>{heads_axis, chunks, 1} : std::array<int64_t, 3>{chunks, heads_axis, 1};
    if (cfg.overlap) add_chunk_ready_flags(plan, seq.N, chunks, seq.H);
    if (chunks > 0) plan.launches.push_back(plan_launch(plan, cached_delta_kernel(DeltaKernel::wy, wy), per_chunk, {}));
    if (cfg.scores) {
      plan.tensors["scores"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, cfg.chunk});
      if (chunks > 0)
        plan.launches.push_back(
            plan_launch(plan, cached_delta_kernel(DeltaKernel::scores, wy), per_chunk, {{"scale", scale}}));
    }
    if (cfg.split) {
      DeltaChunkedBwdConfig pass;
      pass.dtype = cfg.dtype;
      pass.chunk = cfg.chunk;
      pass.block_k = cfg.block_k;
      pass.block_v = cfg.block_v;
      pass.full_v = padded_head_dim(seq.V);
      pass.gated = gated;
      pass.initial_state = has_h0;
      pass.final_state = cfg.final_state;
      pass.varlen = seq.varlen;
      pass.num_warps = cfg.num_warps;
      plan.launches.push_back(plan_launch(plan, delta_state_pass_kernel(pass), walk_grid, {}));
      if (chunks > 0)
        plan.launches.push_back(plan_launch(plan, cached_delta_kernel(DeltaKernel::out, cfg),
                                            {chunks, seq.varlen ? seq.H : seq.B * seq.H, num_v_blocks},
                                            {{"scale", scale}}));
    } else if (segments > 1) {
      // Each segment's P and Q (fwd_segments.cpp), the states entering the segments (S_{s+1} = P_s S_s +
      // Q_s, from the initial state; the final state after the last), then the walk of every segment.
      const SegmentCombineConfig combine{cfg.block_k, cfg.block_v, SegmentDecay::transition, has_h0, cfg.final_state,
                                         cfg.num_warps};
      add_segment_states(plan, seq, segments, num_v_blocks, seq.V, combine,
                         cached_delta_kernel(DeltaKernel::segment_states, cfg), {});
      plan.launches.push_back(plan_launch(plan, cached_delta_kernel(DeltaKernel::fwd, cfg),
                                          {num_v_blocks, seq.N * seq.H, segments}, {{"scale", scale}}));
    } else {
      plan.launches.push_back(
          plan_launch(plan, cached_delta_kernel(DeltaKernel::fwd, cfg), walk_grid, {{"scale", scale}}));
      if (cfg.overlap && chunks > 0) plan.launches.back().overlaps = cfg.scores ? 2 : 1;
    }
  }
  if (wants(wanted, "o")) plan.outputs["o"] = "o";
  if (cfg.final_state) plan.outputs["final_state"] = "final_state";
  return plan;
}

/// A representative set of kernels at the default configuration of K = V = 128 (fla's DeltaNet
/// head size): each kernel plain, and with every option on.
std::vector<std::shared_ptr<ir::Kernel>> delta_rule_kernels(bool gated, const OpOptions& opts) {
  const char* name = gated ? "gated_delta_rule" : "delta_rule";
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (bool recurrent : {false, true}) {
    OpOptions o = opts;
    o.recurrent = recurrent;
    OpOptions normalized = o;
    o.l2norm_qk = false;
    normalized.l2norm_qk = true;
    DeltaRuleConfig plain = delta_rule_config(name, gated, 128, 128, o);
    // With every option: --l2norm-qk's own defaults (kernels with it are made so).
    DeltaRuleConfig full = delta_rule_config(name, gated, 128, 128, normalized);
    full.initial_state = full.final_state = full.varlen = true;
    if (recurrent) {
      out.push_back(cached_delta_kernel(DeltaKernel::recurrent, plain));
      out.push_back(cached_delta_kernel(DeltaKernel::recurrent, full));
    } else {
      for (const auto* c : {&plain, &full}) {
        out.push_back(cached_delta_kernel(DeltaKernel::wy, *c));
        out.push_back(cached_delta_kernel(DeltaKernel::fwd, *c));
      }
      // The segment-parallel walk's kernels (the combine is linac's shared one).
      DeltaRuleConfig segmented = plain;
      segmented.segment = 1024;
      out.push_back(cached_delta_kernel(DeltaKernel::segment_states, segmented));
      out.push_back(cached_delta_kernel(DeltaKernel::fwd, segmented));
      // The split schedule's output kernel (its state pass is the backward's, listed with it).
      DeltaRuleConfig split = plain;
      split.split = true;
      out.push_back(cached_delta_kernel(DeltaKernel::out, split));
      split.varlen = true;
      out.push_back(cached_delta_kernel(DeltaKernel::out, split));
      // The walk reading the chunks' scores, and their kernel; the UT kernel storing T alone and the walk
      // forming V_new from it (tform); plain and with every option.
      for (const auto* c : {&plain, &full}) {
        DeltaRuleConfig with_scores = *c, with_t = *c;
        with_scores.scores = true;
        out.push_back(cached_delta_kernel(DeltaKernel::scores, with_scores));
        out.push_back(cached_delta_kernel(DeltaKernel::fwd, with_scores));
        with_t.tform = true;
        out.push_back(cached_delta_kernel(DeltaKernel::wy, with_t));
        out.push_back(cached_delta_kernel(DeltaKernel::fwd, with_t));
      }
      // The walk beside its producers, flags signalled and waited for (overlap; dense inputs only).
      DeltaRuleConfig beside = plain;
      beside.scores = beside.overlap = true;
      beside.producer_warps = 0;  // a producer running ahead would not wait for the flags
      for (DeltaKernel which : {DeltaKernel::wy, DeltaKernel::scores, DeltaKernel::fwd})
        out.push_back(cached_delta_kernel(which, beside));
    }
  }
  for (auto& k : delta_rule_bwd_kernels(gated, opts)) out.push_back(k);
  return out;
}

OpDef delta_rule_op_def(bool gated) {
  OpDef op;
  op.name = gated ? "gated_delta_rule" : "delta_rule";
  op.summary = gated ? "chunked Gated DeltaNet forward (UT transform + WY recurrence, docs/ops/gated_delta_rule.md)"
                     : "chunked DeltaNet forward (UT transform + WY recurrence, docs/ops/delta_rule.md)";
  op.inputs = {
      {"q", true, "[B,T,H,K]", "queries"},
      {"k", true, "[B,T,H,K]", "keys (L2-normalized, not checked, or pass --l2norm-qk)"},
      {"v", true, "[B,T,H,V]", "values (a non-finite v, k or beta makes all of its chunk's outputs non-finite)"},
  };
  if (gated) op.inputs.push_back({"g", true, "[B,T,H]", "log-decay per token and head (<= 0; -inf drops the state)"});
  op.inputs.push_back({"beta", true, "[B,T,H]", "delta-rule step size per token and head, in (0, 1)"});
  op.inputs.push_back({"initial_state", false, "[N,H,K,V]", "state before the first token of each sequence (fp32)"});
  op.inputs.push_back({"cu_seqlens", false, "[N+1]", "int32/int64 offsets of packed sequences (B must be 1)"});
  op.inputs.push_back({"do", false, "[B,T,H,V]", "--backward: gradient of the loss w.r.t. o"});
  op.inputs.push_back({"dfinal_state", false, "[N,H,K,V]", "--backward: gradient w.r.t. final_state (fp32)"});
  for (const auto& t : delta_saved_tensors())
    op.inputs.push_back({t.name, false, t.shape, "--backward: the forward's output of that name (all four or none)"});
  op.outputs = {
      {"o", true, "[B,T,H,V]", "outputs"},
      {"final_state", false, "[N,H,K,V]", "state after the last token of each sequence (fp32)"},
      {"dq", false, "[B,T,H,K]", "--backward: gradient w.r.t. q"},
      {"dk", false, "[B,T,H,K]", "--backward: gradient w.r.t. k"},
      {"dv", false, "[B,T,H,V]", "--backward: gradient w.r.t. v"},
      {"dbeta", false, "[B,T,H]", "--backward: gradient w.r.t. beta (fp32)"},
  };
  if (gated) op.outputs.push_back({"dg", false, "[B,T,H]", "--backward: gradient w.r.t. g (fp32)"});
  op.outputs.push_back({"dinitial_state", false, "[N,H,K,V]", "--backward: gradient w.r.t. initial_state (fp32)"});
  // The forward's intermediates for a later --backward (the training pair: see docs/ops/delta_rule.md).
  for (const auto& t : delta_saved_tensors())
    op.outputs.push_back({t.name, false, t.shape, fmt::format("{}, for --backward (inputs saved_*)", t.what)});
  op.flags = {"recurrent", "l2norm_qk", "backward"};
  op.bwd_tuning_space = [](const ProblemShape&, const OpOptions&) {
    // The chunked backward's chunk and walk width. The default (chunk 32, bv 128, 8 warps) was the
    // fastest measured (docs/ops/delta_rule.md, "Measured"); 4 warps were slower and chunk 64 spilled
    // 3.2 KB (gated: more shared memory than a block has), so neither is offered.
    return std::vector<Config>{{}, {{"chunk", 16}}, {{"bv", 64}}};
  };
  // Every key some form takes (the forward's, then the backward's others).
  op.config_keys = config_key_lines(merge_tuning_keys({delta_rule_schema().tuning(), delta_rule_bwd_tuning_keys()}));
  op.prepare = [gated](const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
    return plan_delta_rule(gated, inputs, opts, wanted);
  };
  op.kernels = [gated](const OpOptions& opts) { return delta_rule_kernels(gated, opts); };
  op.random_inputs = [gated](const ProblemShape& s, uint64_t seed) {
    TensorMap in;
    in["q"] = random_uniform({s.B, s.T, s.H, s.K}, seed);
    // Unit keys and beta in (0.27, 0.73) keep the recurrence contractive, as in real models.
    HostTensor k = random_uniform({s.B, s.T, s.H, s.K}, seed + 1);
    float* p = reinterpret_cast<float*>(k.materialize());
    for (int64_t r = 0; r < s.B * s.T * s.H; ++r) {
      double norm = 0;
      for (int64_t d = 0; d < s.K; ++d) norm += double(p[r * s.K + d]) * p[r * s.K + d];
      for (int64_t d = 0; d < s.K; ++d) p[r * s.K + d] = static_cast<float>(p[r * s.K + d] / std::sqrt(norm + 1e-6));
    }
    in["k"] = std::move(k);
    in["v"] = random_uniform({s.B, s.T, s.H, s.V}, seed + 2);
    HostTensor beta = random_uniform({s.B, s.T, s.H}, seed + 3);
    float* bp = reinterpret_cast<float*>(beta.materialize());
    for (int64_t i = 0; i < beta.numel(); ++i) bp[i] = static_cast<float>(1.0 / (1.0 + std::exp(-bp[i])));
    in["beta"] = std::move(beta);
    if (gated) in["g"] = random_log_decay({s.B, s.T, s.H}, seed + 4);
    return in;
  };
  op.shape_of = [gated](const TensorMap& in) {
    const HostTensor& q = in.at("q");
    return ProblemShape{q.shape[0], q.shape[1], q.shape[2], q.shape[3], in.at("v").shape[3], gated};
  };
  op.tuning_space = [](const ProblemShape& s, const OpOptions& opts) {
    // The defaults first. Every candidate must match the interpreter before it is timed, which also
    // guards against the chunk-64/8-warp GPU results seen during development (see the issue notes).
    std::vector<Config> space{{},
                              {{"chunk", 32}, {"warps", 8}, {"bv", 64}},
                              {{"chunk", 32}, {"warps", 8}, {"bv", 128}},
                              {{"chunk", 16}, {"warps", 8}, {"bv", 64}},
                              {{"chunk", 32}, {"warps", 4}, {"bv", 32}}};
    // Chunks of 64 only for head dims up to 64: at 128 they were the slowest candidate (docs/ops/
    // delta_rule.md, "Measured") and the slowest to compile (the fp32 inverse at 64 rows: 1.4 s of a
    // 3.3 s cold tuning's critical path).
    if (std::max(s.K, s.V) <= 64) space.insert(space.begin() + 2, {{"chunk", 64}, {"warps", 4}, {"bv", 64}});
    // Few walks (sequences x heads): the split schedule, whose walk carries only the state from chunk to
    // chunk and leaves the outputs to a kernel over every chunk in parallel; and the segment-parallel
    // walk in segments of 2048 and 4096 rows on 4 warps (the fastest measured; docs/ops/delta_rule.md,
    // "Few heads: sequence parallelism"), where the sequences are longer than that.
    if (few_walks(s.B * s.H, opts)) {
      // Chunks of 64 there in 16 bits: half the walk's chain of chunk steps (the UT kernel costs more).
      if (opts.dtype != DType::f32) space.push_back({{"chunk", 64}, {"warps", 4}, {"bv", 32}});
      space.push_back({{"split", 1}, {"chunk", 32}, {"warps", 4}, {"bv", 32}});
      space.push_back({{"split", 1}, {"chunk", 32}, {"warps", 8}, {"bv", 64}});
      for (int segment : {2048, 4096})
        if (s.T > segment) space.push_back({{"segment", segment}, {"warps", 4}});
    }
    // Three pipeline stages (one slack; products waited for an iteration late on sm_90a): faster for
    // delta_rule's forward at the bar shape, slower for gated_delta_rule's (docs/hopper.md, "Measured").
    if (opts.dtype != DType::f32) space.push_back({{"stages", 3}});
    // The UT kernel forming W and U where the walk takes T by default (tform; the two tied at few heads,
    // gated).
    if (opts.dtype != DType::f32) space.push_back({{"tform", 0}});
    // The walk beside the UT kernel (overlap.h) where its programs leave SMs idle (with --l2norm-qk
    // without the scores kernel: delta_rule_config).
    if (few_walks(s.B * s.H, opts) && opts.dtype != DType::f32)
      space.push_back(opts.l2norm_qk ? Config{{"overlap", 1}, {"scores", 0}} : Config{{"overlap", 1}});
    return space;
  };
  return op;
}

}  // namespace

OpDef delta_rule_op() { return delta_rule_op_def(false); }
OpDef gated_delta_rule_op() { return delta_rule_op_def(true); }

}  // namespace linac
