// The backward of the op "gla" (docs/ops/gla.md): the plans and defaults of the chunked form (bwd.h:
// gla_bwd_intra and the walks; split_bwd.h: the split schedule) and of the token-by-token reference form
// (bwd_tokenwise.h, --config tokenwise=1).
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <optional>

#include "kernels/common/config_schema.h"
#include "kernels/common/device_limits.h"
#include "kernels/common/fitting.h"
#include "kernels/common/op_support.h"
#include "kernels/gla/bwd.h"
#include "kernels/gla/bwd_tokenwise.h"
#include "kernels/gla/op.h"
#include "kernels/gla/split_bwd.h"
#include "linac/error.h"

namespace linac {

namespace {

enum class GlaBwdKernel { intra, dq, dk, dv, dkdv, dg, gates, states, dstates, inter, dg_offsets, dg_add };

GlaSplitBwdConfig split_config(const GlaChunkedBwdConfig& cfg);

/// The chunked backward's rows per chunk (read before the other keys: its default depends on split).
TuningKey bwd_chunk_key() {
  return {"chunk", {16, 32, 64}, "--backward: rows per chunk of the walks (16-row diagonal blocks)"};
}

/// The switch between the walks and the split schedule (read before the other keys: the defaults depend on it).
TuningKey split_key() {
  return {"split",
          {0, 1},
          "--backward: 1 = the split schedule (dense inputs; varlen walks): state passes storing the state "
          "before and its gradient after every chunk, then every chunk's gradients in parallel"};
}

/// The chunked backward's configuration (bwd.h; the split schedule's kernels take it through split_config).
const ConfigSchema<GlaChunkedBwdConfig>& chunked_schema() {
  using C = GlaChunkedBwdConfig;
  static const ConfigSchema<C> schema(
      field<&C::dtype>(), tuned<&C::chunk>(bwd_chunk_key()), field<&C::block_k>(), field<&C::block_v>(),
      tuned<&C::split_k>({"bk", {16, 32, 64, 128, 256}, "--backward: key columns per program of the dq and dk walks"}),
      tuned<&C::split_v>({"bv", {16, 32, 64, 128, 256}, "--backward: value columns per program of the dv walk"}),
      field<&C::initial_state>(), field<&C::final_state_grad>(), field<&C::initial_state_grad>(), field<&C::varlen>(),
      tuned<&C::num_warps>({"warps", {2, 4, 8}, "warps per program of the walks"}),
      tuned<&C::walk_stages>(
          {"wstages", {1, 2}, "--backward: 2 = the walks prefetch the next chunk's loads (default 2 where they fit)"}),
      tuned<&C::intra_warps>({"iwarps", {2, 4, 8}, "--backward: warps per program of gla_bwd_intra"}),
      tuned<&C::take>({"take",
                       {0, 1},
                       "--backward: 1 (default) = gla_bwd_intra reads dA's entries with take, 0 = masked row sums"}),
      tuned<&C::fuse_dkdv>(
          {"fuse",
           {0, 1},
           "--backward: 1 (default) = dk and dv in one walk where bk and bv cover the head dims, 0 = two walks"}),
      tuned<&C::split>(split_key()),
      tuned<&C::state_block_k>({"sbk",
                                {16, 32, 64, 128, 256},
                                "--backward split=1: key columns per program of the state passes (default 32)"}),
      tuned<&C::state_block_v>({"sbv",
                                {16, 32, 64, 128, 256},
                                "--backward split=1: value columns per program of the state passes (default 32)"}),
      field<&C::state_stages>(), tuned<&C::walk_producer_warps>(producer_key()), field<&C::dg_in_walk>());
  return schema;
}

/// `cfg` with the fields kernel `which` does not read at their defaults: the memo's key covers every
/// field, and a call that tries both dg_in_walk proposals (or producer warps and none) would otherwise
/// record the kernels that ignore them twice.
GlaChunkedBwdConfig fields_read_by(GlaChunkedBwdConfig cfg, GlaBwdKernel which) {
  const GlaChunkedBwdConfig defaults;
  if (which != GlaBwdKernel::dkdv) cfg.dg_in_walk = defaults.dg_in_walk;
  const bool walk = which == GlaBwdKernel::dq || which == GlaBwdKernel::dk || which == GlaBwdKernel::dv ||
                    which == GlaBwdKernel::dkdv;
  if (!walk) cfg.walk_producer_warps = defaults.walk_producer_warps;
  return cfg;
}

std::shared_ptr<ir::Kernel> cached(const GlaChunkedBwdConfig& asked, GlaBwdKernel which) {
  static KernelMemo memo;
  const GlaChunkedBwdConfig cfg = fields_read_by(asked, which);
  return memo.get(chunked_schema().key(cfg, which), [&]() -> std::shared_ptr<ir::Kernel> {
    switch (which) {
      case GlaBwdKernel::intra: return build_gla_bwd_intra(cfg);
      case GlaBwdKernel::dq: return build_gla_bwd_walk(cfg, GlaBwdWalk::dq);
      case GlaBwdKernel::dk: return build_gla_bwd_walk(cfg, GlaBwdWalk::dk);
      case GlaBwdKernel::dv: return build_gla_bwd_walk(cfg, GlaBwdWalk::dv);
      case GlaBwdKernel::dkdv: return build_gla_bwd_walk(cfg, GlaBwdWalk::dkdv);
      case GlaBwdKernel::dg: return build_gla_bwd_dg(cfg);
      case GlaBwdKernel::gates: return build_gla_bwd_gates(split_config(cfg));
      case GlaBwdKernel::states: return build_gla_bwd_states(split_config(cfg));
      case GlaBwdKernel::dstates: return build_gla_bwd_dstates(split_config(cfg));
      case GlaBwdKernel::inter: return build_gla_bwd_inter(split_config(cfg));
      case GlaBwdKernel::dg_offsets: return build_gla_bwd_dg_offsets(split_config(cfg));
      case GlaBwdKernel::dg_add: return build_gla_bwd_dg_add(split_config(cfg));
    }
    throw InternalError("bad gla backward kernel");
  });
}

GlaSplitBwdConfig split_config(const GlaChunkedBwdConfig& cfg) {
  GlaSplitBwdConfig s;
  s.dtype = cfg.dtype;
  s.chunk = cfg.chunk;
  s.block_k = cfg.block_k;
  s.block_v = cfg.block_v;
  s.state_block_k = cfg.state_block_k;
  s.state_block_v = cfg.state_block_v;
  // The forward's best split configuration measured (docs/ops/gla.md, "Measured"): 4 warps.
  s.state_warps = 4;
  s.state_stages = cfg.state_stages;
  s.num_warps = cfg.num_warps;
  s.initial_state = cfg.initial_state;
  s.final_state = cfg.final_state_grad;  // S_T, for dg's final-state term
  s.final_state_grad = cfg.final_state_grad;
  s.initial_state_grad = cfg.initial_state_grad;
  return s;
}

/// The split schedule's rows per chunk in order of preference: 32, then 16 where that does not fit the
/// call's GPU (gla_bwd_inter holds a chunk's state and its gradient whole). Not 64, though its state
/// passes carry one product per chunk: a register bound the shared-memory plan cannot see, gla_bwd_intra
/// spills at 64 (1.5 KB in 16-bit above head dim 64; at head dim 64 252 bytes under ptxas 13.0) and
/// ran slower (B8 T1024 H8 D64 bf16 on an H200: backward 0.322 ms at 64, 0.255 at 32, session 36; fp32
/// at K = V = 64 too: docs/ops/gla.md, "Measured").
std::vector<int> split_chunk_proposals() { return {32, 16}; }

/// Key x value columns per program of the walks in order of preference: whole 128-column blocks (the
/// fastest measured, docs/ops/gla.md), then narrower where those do not fit the call's GPU. At head dim
/// 256 too, though there the dq, dk and dv walks spill 380-636 bytes (sm_90a): 64 columns, spill-free,
/// ran slower (B8 T2048 H32 D256 on an H200: backward 12.51 against 10.77 ms, session 36).
constexpr std::pair<int64_t, int64_t> kWalkColumnProposals[] = {{128, 128}, {64, 64}, {64, 32}, {32, 32}};
/// Where the walks are few, their column blocks halve down to 64 (columns_for_walks): faster than one
/// program per head there (docs/ops/gla.md, "Measured", session 19).
constexpr int64_t kNarrowestColumns = 64;

/// Whether dk and dv are one walk: asked for, and both column blocks whole (one program holds dS).
bool fused_dkdv(const GlaChunkedBwdConfig& cfg) {
  return cfg.fuse_dkdv && cfg.split_k == cfg.block_k && cfg.split_v == cfg.block_v;
}

/// Whether the fused dk/dv walk forms dg (dg_in_walk): then neither gla_bwd_dg nor k .* dk's tensor.
bool dg_in_dkdv_walk(const GlaChunkedBwdConfig& cfg) { return fused_dkdv(cfg) && cfg.dg_in_walk; }

/// The kernels the chunked backward's plan launches at `cfg`, in order: gla_bwd_intra, then the split
/// schedule's (the decayed operands, the two state passes, every chunk's gradients, dg's offsets and
/// sums) or the walks (dq; dk and dv, fused or not; dg).
std::vector<GlaBwdKernel> bwd_launch_order(const GlaChunkedBwdConfig& cfg) {
  using K = GlaBwdKernel;
  if (cfg.split) return {K::intra, K::gates, K::states, K::dstates, K::inter, K::dg_offsets, K::dg_add};
  if (dg_in_dkdv_walk(cfg)) return {K::intra, K::dq, K::dkdv};
  if (fused_dkdv(cfg)) return {K::intra, K::dq, K::dkdv, K::dg};
  return {K::intra, K::dq, K::dk, K::dv, K::dg};
}

std::vector<std::shared_ptr<ir::Kernel>> bwd_kernels(const GlaChunkedBwdConfig& cfg) {
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (GlaBwdKernel which : bwd_launch_order(cfg)) out.push_back(cached(cfg, which));
  return out;
}

/// Whether the split schedule is the default for these inputs: 16-bit, dense, head dims up to 128 and
/// few walks (one per sequence x head: few_walks) over at least 1024 tokens; with more heads the walks
/// win (docs/ops/gla.md, "Measured": split vs walks).
bool split_by_default(const GlaChunkedBwdConfig& cfg, const SequenceLayout* seq, const OpOptions& opts) {
  return seq && cfg.dtype != DType::f32 && !seq->varlen && std::max(cfg.block_k, cfg.block_v) <= 128 &&
         few_walks(seq->N * seq->H, opts) && seq->T >= 1024;
}

/// Defaults, then --config, for cfg's head dims and states (set before); seq: the call's inputs (nullptr:
/// the representative kernels). Measured (docs/ops/gla.md, "Measured"): the walks in chunks of 16 on 8
/// warps, 4 at head dims up to 32 (slower on 8 there; above, 4 warps spill at 128 columns and ran slower
/// everywhere), gla_bwd_intra on 4 warps reading dA's entries with take, dk and dv fused where one
/// program holds the state, the split schedule's state passes in 32 x 32 blocks. Then what shared memory
/// decides, the first proposal whose kernels fit the call's GPU: the walks' column blocks
/// (kWalkColumnProposals, narrowed where the walks are few), their loads two stages deep and then, where
/// none of those fits (fp32 at K = V = 256 on an A100), one; or the split schedule's chunk
/// (split_chunk_proposals) and state passes' stages (2, then 1).
void configure(GlaChunkedBwdConfig& cfg, const OpOptions& opts, const SequenceLayout* seq) {
  // Varlen inputs take the walks even when split=1 is asked (the state passes are dense only).
  cfg.split = split_key().value(opts, split_by_default(cfg, seq, opts) ? 1 : 0) == 1 && !(seq && seq->varlen);
  cfg.num_warps = std::max(cfg.block_k, cfg.block_v) > 32 ? 8 : 4;
  cfg.intra_warps = 4;
  cfg.take = true;
  cfg.fuse_dkdv = true;
  cfg.state_block_k = std::min<int64_t>(32, cfg.block_k);
  cfg.state_block_v = std::min<int64_t>(32, cfg.block_v);
  std::optional<int64_t> asked_chunk = bwd_chunk_key().given(opts);
  if (!asked_chunk && opts.chunk_size) asked_chunk = checked_chunk_size(opts.chunk_size, 16);
  if (asked_chunk && *asked_chunk > 64)
    throw UserError(fmt::format("--chunk-size {}: gla --backward takes chunks of 16, 32 or 64 rows", *asked_chunk));
  std::vector<int> chunks =
      cfg.split ? split_chunk_proposals() : std::vector<int>{16};
  if (asked_chunk) chunks = {static_cast<int>(*asked_chunk)};
  std::vector<GlaChunkedBwdConfig> proposals;
  for (int chunk : chunks) {
    GlaChunkedBwdConfig c = cfg;
    c.chunk = chunk;
    if (cfg.split) {
      for (int stages : {2, 1}) {
        c.state_stages = stages;
        proposals.push_back(c);
      }
    } else {
      // dg formed in the fused dk/dv walk where that walk still fits, else by gla_bwd_dg beside it (fp32
      // at K = V = 128: with dg the fused walk did not fit and split in two, 1.4x slower).
      for (int stages : {2, 1})
        for (auto [bk, bv] : kWalkColumnProposals)
          for (bool dg_in_walk : {true, false}) {
            c.walk_stages = stages;
            c.split_k = std::min(bk, cfg.block_k);
            c.split_v = std::min(bv, cfg.block_v);
            c.dg_in_walk = dg_in_walk;
            proposals.push_back(c);
          }
    }
  }
  cfg = first_fitting<GlaChunkedBwdConfig>(proposals, bwd_kernels, opts);
  const int64_t heads = seq ? seq->N * seq->H : 0;  // narrowing only shrinks the walks' tiles: they still fit
  cfg.split_k = columns_for_walks(cfg.split_k, cfg.block_k, heads, kNarrowestColumns, opts);
  cfg.split_v = columns_for_walks(cfg.split_v, cfg.block_v, heads, kNarrowestColumns, opts);
  chunked_schema().apply(opts, cfg);
  cfg.split = cfg.split && !(seq && seq->varlen);
  cfg.split_k = std::min(cfg.split_k, cfg.block_k);
  cfg.split_v = std::min(cfg.split_v, cfg.block_v);
  cfg.state_block_k = std::min(cfg.state_block_k, cfg.block_k);
  cfg.state_block_v = std::min(cfg.state_block_v, cfg.block_v);
  // A warpgroup of its own filling the walks' TMA ring (producer warps) in 16 bits, where their rings
  // take them (docs/ops/gla.md, "Measured", session 34).
  if (!cfg.split) default_producer_warps(cfg, &GlaChunkedBwdConfig::walk_producer_warps, bwd_kernels, opts);
}

}  // namespace

TuningKeys gla_bwd_tuning_keys() { return merge_tuning_keys({chunked_schema().tuning(), {tokenwise_key()}}); }

OpPlan plan_gla_chunked_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  SequenceLayout seq = check_qkv_inputs("gla", inputs);
  const bool has_h0 = inputs.count("initial_state") > 0;
  const bool has_dht = inputs.count("dfinal_state") > 0;
  GlaChunkedBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(seq.K);
  cfg.block_v = padded_head_dim(seq.V);
  cfg.initial_state = has_h0;
  cfg.final_state_grad = has_dht;
  cfg.initial_state_grad = wants(wanted, "dinitial_state");
  cfg.varlen = seq.varlen;
  configure(cfg, opts, &seq);
  if (cfg.split && std::max(cfg.block_k, cfg.block_v) > 128)
    throw UserError(fmt::format("gla --backward --config split=1 takes head dims up to 128 (K={}, V={}): its "
                                "per-chunk kernel holds a chunk's state whole; use the walks (split=0)", seq.K, seq.V));
  const double scale = attention_scale(opts, seq.K);

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {"g", "initial_state", "dfinal_state"});
  const int64_t state_v_blocks = (seq.V + cfg.state_block_v - 1) / cfg.state_block_v;
  if (has_dht && cfg.split) {
    plan.tensors["final_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});  // S_T, for dg
  } else if (has_dht) {
    plan.tensors["dg_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K});
  }
  // O(T*D) scratch: the intra-chunk parts of the gradients and (the walks) the fp32 products for dg.
  for (const char* name : {"dq_intra", "dk_intra"})
    plan.tensors[name] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.K});
  if (!cfg.split) plan.tensors["qdq"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.K});
  if (!cfg.split && !dg_in_dkdv_walk(cfg))
    plan.tensors["kdk"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv_intra"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.V});
  for (const char* name : {"dq", "dk"}) plan.tensors[name] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dg"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.K});
  if (cfg.initial_state_grad) plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});

  const int64_t heads = seq.N * seq.H, longest = seq.longest_sequence();
  const int64_t chunks = (seq.T + cfg.chunk - 1) / cfg.chunk;
  if (cfg.split) {
    // The decayed operands (O(T*D)), the state before and its gradient after every chunk ([B, NT, H, K,
    // V], input dtype), then the chunks' gradients in parallel and dg's per-chunk totals and offsets.
    const int64_t table_rows = std::max<int64_t>(chunks, 1);
    for (const char* name : {"qd", "kd"}) plan.tensors[name] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
    for (const char* name : {"h", "dh"})
      plan.tensors[name] = HostTensor::zeros(cfg.dtype, {seq.B, table_rows, seq.H, seq.K, seq.V});
    for (const char* name : {"etot", "dg_chunk", "dg_offset"})
      plan.tensors[name] = HostTensor::zeros(DType::f32, {seq.B, table_rows, seq.H, seq.K});
  }
  auto grid_of = [&](GlaBwdKernel which) -> std::array<int64_t, 3> {
    switch (which) {
      case GlaBwdKernel::intra: return {(longest + cfg.chunk - 1) / cfg.chunk, heads, 1};
      case GlaBwdKernel::gates:
      case GlaBwdKernel::inter:
      case GlaBwdKernel::dg_add: return {chunks, heads, 1};
      case GlaBwdKernel::states:
      case GlaBwdKernel::dstates:
        return {state_v_blocks, heads, (cfg.block_k + cfg.state_block_k - 1) / cfg.state_block_k};
      case GlaBwdKernel::dq:
      case GlaBwdKernel::dk: return {cfg.block_k / cfg.split_k, heads, 1};
      case GlaBwdKernel::dv: return {cfg.block_v / cfg.split_v, heads, 1};
      case GlaBwdKernel::dkdv: return {1, heads, 1};
      case GlaBwdKernel::dg: return {heads, cfg.block_k / gla_dg_columns(cfg.block_k), 1};
      case GlaBwdKernel::dg_offsets: return {heads, 1, 1};
    }
    throw InternalError("bad gla backward kernel");
  };
  // Programs along the chunks: none where the sequences are empty.
  for (GlaBwdKernel which : bwd_launch_order(cfg)) {
    const std::array<int64_t, 3> grid = grid_of(which);
    if (grid[0] > 0) plan.launches.push_back(plan_launch(plan, cached(cfg, which), grid, {{"scale", scale}}));
  }
  for (const char* name : {"dq", "dk", "dv", "dg", "dinitial_state"})
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> gla_chunked_bwd_kernels(const OpOptions& opts) {
  GlaChunkedBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = cfg.block_v = 64;
  configure(cfg, opts, nullptr);
  GlaChunkedBwdConfig full = cfg;
  full.initial_state = full.final_state_grad = full.initial_state_grad = full.varlen = true;
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (const auto* c : {&cfg, &full})
    for (auto which : {GlaBwdKernel::intra, GlaBwdKernel::dq, GlaBwdKernel::dk, GlaBwdKernel::dv, GlaBwdKernel::dg})
      out.push_back(cached(*c, which));
  GlaChunkedBwdConfig whole = cfg;
  whole.split_k = whole.block_k;
  whole.split_v = whole.block_v;
  out.push_back(cached(whole, GlaBwdKernel::dkdv));
  whole.dg_in_walk = false;  // as it runs where the walk forming dg does not fit (fp32 at head dim 128)
  out.push_back(cached(whole, GlaBwdKernel::dkdv));
  // The split schedule at its defaults, with both states.
  GlaChunkedBwdConfig split = full;
  split.varlen = false;
  OpOptions split_opts = opts;
  split_opts.config["split"] = 1;
  configure(split, split_opts, nullptr);
  for (auto which : {GlaBwdKernel::gates, GlaBwdKernel::states, GlaBwdKernel::dstates, GlaBwdKernel::inter,
                     GlaBwdKernel::dg_offsets, GlaBwdKernel::dg_add})
    out.push_back(cached(split, which));
  return out;
}


namespace {

/// The token-by-token form's configuration (bwd_tokenwise.h): warps is tuned.
const ConfigSchema<GlaBwdConfig>& tokenwise_schema() {
  using C = GlaBwdConfig;
  static const ConfigSchema<C> schema(field<&C::dtype>(), field<&C::block_k>(), field<&C::block_v>(),
                                      field<&C::initial_state>(), field<&C::final_state_grad>(),
                                      field<&C::initial_state_grad>(), field<&C::varlen>(),
                                      tuned<&C::num_warps>(warps_key()));
  return schema;
}

std::shared_ptr<ir::Kernel> cached_gla_bwd(const GlaBwdConfig& cfg, bool dq_kernel) {
  static KernelMemo memo;
  return memo.get(tokenwise_schema().key(cfg, dq_kernel),
                  [&] { return dq_kernel ? build_gla_bwd_tokenwise_dq(cfg) : build_gla_bwd_tokenwise_dkv(cfg); });
}

}  // namespace

OpPlan plan_gla_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  if (opts.recurrent) throw UserError("gla: --backward is not implemented with --recurrent (it is token by token already)");
  SequenceLayout seq = check_qkv_inputs("gla", inputs);
  if (!inputs.count("g")) throw UserError("gla: missing input 'g'");
  check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H, seq.K});
  if (!inputs.count("do")) throw UserError("gla --backward: missing input 'do' (dL/do, [B,T,H,V])");
  check_shape("do", inputs.at("do"), {seq.B, seq.T, seq.H, seq.V});
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});
  const bool has_dht = inputs.count("dfinal_state") > 0;
  if (has_dht) check_shape("dfinal_state", inputs.at("dfinal_state"), {seq.N, seq.H, seq.K, seq.V});
  for (const auto& w : wanted)
    if (w != "dq" && w != "dk" && w != "dv" && w != "dg" && w != "dinitial_state")
      throw UserError(fmt::format("gla --backward produces dq, dk, dv, dg and dinitial_state, not '{}'", w));
  check_config_keys("gla --backward", opts, gla_bwd_tuning_keys());
  // In chunks unless --config tokenwise=1 asks for the token-by-token reference form.
  OpOptions tw = opts;
  if (!take_tokenwise(tw)) return plan_gla_chunked_bwd(inputs, tw, wanted);
  check_config_keys("gla --backward --config tokenwise=1", tw, tokenwise_schema().tuning());
  if (opts.chunk_size) throw UserError("gla --backward --config tokenwise=1 runs token by token: --chunk-size does not apply");

  GlaBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(seq.K);
  cfg.block_v = padded_head_dim(seq.V);
  cfg.num_warps = 8;
  tokenwise_schema().apply(tw, cfg);
  cfg.initial_state = has_h0;
  cfg.final_state_grad = has_dht;
  cfg.initial_state_grad = wants(wanted, "dinitial_state");
  cfg.varlen = seq.varlen;
  const double scale = attention_scale(opts, seq.K);

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {"g", "initial_state", "dfinal_state"});
  for (const char* name : {"dq", "dk"}) plan.tensors[name] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dg"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.K});
  if (has_dht) plan.tensors["dg_final"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K});
  if (cfg.initial_state_grad) plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});

  const std::array<int64_t, 3> grid = {seq.N * seq.H, 1, 1};
  plan.launches.push_back(plan_launch(plan, cached_gla_bwd(cfg, true), grid,
                                      {"q", "k", "v", "g", "do", "initial_state", "dfinal_state", "cu_seqlens", "dq",
                                       "dg_final"},
                                      {{"scale", scale}}));
  plan.launches.push_back(plan_launch(plan, cached_gla_bwd(cfg, false), grid,
                                      {"q", "k", "v", "g", "do", "dq", "dfinal_state", "dg_final", "cu_seqlens", "dk",
                                       "dv", "dg", "dinitial_state"},
                                      {{"scale", scale}}));
  for (const char* name : {"dq", "dk", "dv", "dg", "dinitial_state"})
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> gla_bwd_kernels(const OpOptions& opts) {
  // The chunked form (the default), then the token-by-token one (--config tokenwise=1).
  std::vector<std::shared_ptr<ir::Kernel>> out = gla_chunked_bwd_kernels(opts);
  GlaBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.initial_state = cfg.final_state_grad = cfg.initial_state_grad = true;
  out.push_back(cached_gla_bwd(cfg, true));
  out.push_back(cached_gla_bwd(cfg, false));
  return out;
}

}  // namespace linac
