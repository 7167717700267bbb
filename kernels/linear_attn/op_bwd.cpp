// The backward of the op "linear_attn" (docs/ops/linear_attn.md): the plans and defaults of the three
// walks (bwd.h), of the split schedule (split_bwd.h) and of the normalized form, composed from the
// forward and the walks with its prep kernel (normalized_bwd.h).
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>

#include "kernels/common/config_schema.h"
#include "kernels/common/device_limits.h"
#include "kernels/common/fitting.h"
#include "kernels/common/op_support.h"
#include "kernels/linear_attn/bwd.h"
#include "kernels/linear_attn/normalized_bwd.h"
#include "kernels/linear_attn/op.h"
#include "kernels/linear_attn/split_bwd.h"
#include "linac/error.h"

namespace linac {

namespace {

/// The fastest measured (docs/ops/linear_attn.md, "Measured": the backward's sweep): chunk 64 with one
/// program per head (bk = bv = 128, 8 warps); gated, chunk 32 (at 64 its dq and dk kernels spill 84-96
/// bytes). Shared memory bounds it: 16-bit gated at chunk 64 and 128 columns plans 175 KB (an H100/H200
/// block has 227 KB); fp32 tiles are twice as large, so fp32 takes chunks of 32 and 64 columns (168 KB
/// gated; at chunk 64 it needed 292 KB).
int default_bwd_chunk(DType dt, bool gated) { return dt == DType::f32 || gated ? 32 : 64; }
/// Head dims over 128, in order of preference: chunk 32, then 16 where the walks at 32 do not fit the call's
/// GPU (16-bit gated at K = V = 256 plans 168 KB at 32: more than an A100 block's 163 KB). fp32 takes 16
/// (the gated walks plan 285 KB of shared memory at 32 with K = V = 256, the normalized ones 238 KB; 176
/// and 156 KB at 16).
std::vector<int> wide_heads_bwd_chunks(DType dt) { return dt == DType::f32 ? std::vector<int>{16} : std::vector<int>{32, 16}; }
int64_t default_bwd_split(DType dt, int64_t padded) { return std::min<int64_t>(padded, dt == DType::f32 ? 64 : 128); }

/// The walks' configuration (bwd.h): chunk, bk, bv and warps are tuned.
const ConfigSchema<LinearAttnBwdConfig>& walks_schema() {
  using C = LinearAttnBwdConfig;
  static const ConfigSchema<C> schema(
      field<&C::dtype>(), tuned<&C::chunk>(chunk_key()), field<&C::block_k>(), field<&C::block_v>(),
      tuned<&C::split_k>(
          {"bk", {16, 32, 64, 128, 256}, "--backward: key columns per program of the dq and dk kernels"}),
      tuned<&C::split_v>({"bv", {16, 32, 64, 128, 256}, "--backward: value columns per program of the dv kernel"}),
      field<&C::gated>(), field<&C::initial_state>(), field<&C::final_state_grad>(), field<&C::initial_state_grad>(),
      field<&C::varlen>(), field<&C::denominator>(), tuned<&C::num_warps>(warps_key()));
  return schema;
}

/// The split schedule's configuration (split_bwd.h): chunk, sbk, sbv and warps are tuned.
const ConfigSchema<LinearAttnSplitBwdConfig>& split_schema() {
  using C = LinearAttnSplitBwdConfig;
  static const ConfigSchema<C> schema(
      field<&C::dtype>(), tuned<&C::chunk>(chunk_key()), field<&C::block_k>(), field<&C::block_v>(),
      tuned<&C::state_block_k>(
          {"sbk", {16, 32, 64, 128}, "--backward split=1: key columns per program of the state passes (default 32)"}),
      tuned<&C::state_block_v>(
          {"sbv", {16, 32, 64, 128}, "--backward split=1: value columns per program of the state passes (default 32)"}),
      field<&C::state_warps>(), field<&C::state_stages>(), tuned<&C::num_warps>(warps_key()),
      field<&C::initial_state>(), field<&C::final_state_grad>(), field<&C::initial_state_grad>());
  return schema;
}

/// The switch between the walks and the split schedule.
TuningKey split_key() {
  return {"split",
          {0, 1},
          "--backward: 1 = the split schedule (plain form, head dims up to 128; varlen walks): state passes "
          "storing the state and its gradient per chunk, then every chunk's gradients in parallel"};
}

std::shared_ptr<ir::Kernel> cached_bwd(const LinearAttnBwdConfig& cfg, LinearAttnBwdKernel which) {
  static KernelMemo memo;
  return memo.get(walks_schema().key(cfg, which), [&] { return build_linear_attn_bwd(cfg, which); });
}

/// Few (sequence, head) pairs leave SMs idle: each walk program takes a head's column block through every
/// chunk. While the programs of a walk are few (few_walks) the default halves the column blocks (down to
/// 32), with chunks of 32 and 4 warps: faster at few heads, and what `linac tune --backward` chose there;
/// from 96 heads on the wide defaults stand (docs/ops/linear_attn.md, "Measured").
int64_t narrowed_split(int64_t split, int64_t padded, int64_t heads, const OpOptions& opts) {
  while (heads > 0 && split > 32 && few_walks(heads * (padded / split), opts)) split /= 2;
  return split;
}

/// The walks the plan launches at `cfg` (dq, dk, dv; dg when gated).
std::vector<std::shared_ptr<ir::Kernel>> walk_kernels(const LinearAttnBwdConfig& cfg) {
  std::vector<std::shared_ptr<ir::Kernel>> out = {cached_bwd(cfg, LinearAttnBwdKernel::dq),
                                                  cached_bwd(cfg, LinearAttnBwdKernel::dk),
                                                  cached_bwd(cfg, LinearAttnBwdKernel::dv)};
  if (cfg.gated) out.push_back(cached_bwd(cfg, LinearAttnBwdKernel::dg));
  return out;
}

/// Reads chunk, bk, bv and warps from opts (defaults otherwise) for padded head dims block_k, block_v and
/// cfg's options (gated, states, denominator: set before); `heads` (sequences x heads, 0 when unknown)
/// narrows the default column blocks (narrowed_split).
void configure(LinearAttnBwdConfig& cfg, const OpOptions& opts, int64_t heads = 0) {
  const int64_t wide_k = default_bwd_split(cfg.dtype, cfg.block_k), wide_v = default_bwd_split(cfg.dtype, cfg.block_v);
  const int64_t bk = narrowed_split(wide_k, cfg.block_k, heads, opts);
  const int64_t bv = narrowed_split(wide_v, cfg.block_v, heads, opts);
  const bool narrowed = bk < wide_k || bv < wide_v;
  // Head dims over 128: the first of wide_heads_bwd_chunks whose walks fit the call's GPU.
  const bool wide_heads = std::max(cfg.block_k, cfg.block_v) > 128;
  cfg.split_k = bk;
  cfg.split_v = bv;
  cfg.num_warps = narrowed ? 4 : 8;
  if (wide_heads) {
    cfg.chunk = first_fitting<int>(
        wide_heads_bwd_chunks(cfg.dtype),
        [&](const int& chunk) {
          LinearAttnBwdConfig c = cfg;
          c.chunk = chunk;
          return walk_kernels(c);
        },
        opts);
  }
  cfg.chunk = checked_chunk_size(opts.chunk_size, wide_heads ? cfg.chunk
                                                  : narrowed ? 32 : default_bwd_chunk(cfg.dtype, cfg.gated));
  walks_schema().apply(opts, cfg);
  if (cfg.split_k > cfg.block_k || cfg.split_v > cfg.block_v)
    throw UserError(fmt::format("linear_attn --backward: --config bk={} bv={} exceed the padded head dims {} and {}",
                                cfg.split_k, cfg.split_v, cfg.block_k, cfg.block_v));
}

}  // namespace

TuningKeys linear_attn_bwd_tuning_keys() {
  return merge_tuning_keys({walks_schema().tuning(), {split_key()}, split_schema().tuning()});
}

namespace {

/// The split schedule's plan (split_bwd.h): dense inputs, plain form.
OpPlan plan_split_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted,
                      const SequenceLayout& seq, const LinearAttnBwdConfig& walks, double scale) {
  LinearAttnSplitBwdConfig cfg;
  cfg.dtype = walks.dtype;
  // Its own defaults (the walks' narrow ones are for the walks): chunk 64 in 16-bit, 32 in fp32 (the
  // per-chunk kernel holds S and dS' whole); 8 warps.
  cfg.chunk = checked_chunk_size(opts.chunk_size, cfg.dtype == DType::f32 ? 32 : 64);
  cfg.block_k = walks.block_k;
  cfg.block_v = walks.block_v;
  cfg.state_block_k = cfg.state_block_v = 32;
  cfg.state_stages = cfg.dtype == DType::f32 ? 1 : 2;
  cfg.num_warps = 8;
  split_schema().apply(opts, cfg);
  cfg.state_block_k = std::min(cfg.state_block_k, cfg.block_k);
  cfg.state_block_v = std::min(cfg.state_block_v, cfg.block_v);
  cfg.initial_state = walks.initial_state;
  cfg.final_state_grad = walks.final_state_grad;
  cfg.initial_state_grad = walks.initial_state_grad;
  static KernelMemo memo;
  auto kernel = [&](const char* which, auto build) {
    return memo.get(split_schema().key(cfg, which), [&] { return build(cfg); });
  };

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {"initial_state", "dfinal_state"});
  const int64_t chunks = (seq.T + cfg.chunk - 1) / cfg.chunk;
  for (const char* name : {"h", "dh"})
    plan.tensors[name] = HostTensor::zeros(cfg.dtype, {seq.B, std::max<int64_t>(chunks, 1), seq.H, seq.K, seq.V});
  plan.tensors["dq"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  if (cfg.initial_state_grad)
    plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});
  const std::array<int64_t, 3> state_grid{(seq.V + cfg.state_block_v - 1) / cfg.state_block_v, seq.N * seq.H,
                                          (seq.K + cfg.state_block_k - 1) / cfg.state_block_k};
  plan.launches.push_back(plan_launch(plan, kernel("states", build_linear_attn_bwd_states), state_grid, {}));
  plan.launches.push_back(
      plan_launch(plan, kernel("dstates", build_linear_attn_bwd_dstates), state_grid, {{"scale", scale}}));
  if (chunks > 0)
    plan.launches.push_back(plan_launch(plan, kernel("chunk", build_linear_attn_bwd_chunk),
                                        {chunks, seq.N * seq.H, 1}, {{"scale", scale}}));
  for (const char* name : {"dq", "dk", "dv", "dinitial_state"})
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

OpPlan plan_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted,
                bool denominator) {
  SequenceLayout seq = check_qkv_inputs("linear_attn", inputs);
  if (!inputs.count("do")) throw UserError("linear_attn --backward: missing input 'do' (dL/do, [B,T,H,V])");
  check_shape("do", inputs.at("do"), {seq.B, seq.T, seq.H, seq.V});
  const bool gated = inputs.count("g") > 0;
  if (gated) check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H});
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});
  const bool has_dht = inputs.count("dfinal_state") > 0;
  if (has_dht) check_shape("dfinal_state", inputs.at("dfinal_state"), {seq.N, seq.H, seq.K, seq.V});
  for (const auto& w : wanted) {
    if (w != "dq" && w != "dk" && w != "dv" && w != "dg" && w != "dinitial_state")
      throw UserError(fmt::format("linear_attn --backward produces dq, dk, dv, dg and dinitial_state, not '{}'", w));
  }
  if (wants(wanted, "dg") && !gated) throw UserError("linear_attn --backward: -o dg needs the gate input g");

  check_config_keys("linear_attn --backward", opts, linear_attn_bwd_tuning_keys());
  LinearAttnBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(seq.K);
  cfg.block_v = padded_head_dim(seq.V);
  cfg.gated = gated;
  cfg.initial_state = has_h0;
  cfg.final_state_grad = has_dht;
  cfg.initial_state_grad = wants(wanted, "dinitial_state");
  cfg.varlen = seq.varlen;
  cfg.denominator = denominator;
  configure(cfg, opts, seq.N * seq.H);
  if (denominator && (has_h0 || has_dht || cfg.initial_state_grad))
    throw InternalError("linear_attn bwd: the denominator form has no states");
  const double scale = attention_scale(opts, seq.K);
  // The split schedule by default where the walks leave most SMs idle: plain form, 16-bit, dense, head
  // dims up to 128, one walk per sequence x head busying at most a quarter of the SMs, over at least
  // 1024 tokens. At half the SMs it depends (`linac tune --backward` times both there: few_walks); a
  // walk per SM and more favour the walks (docs/ops/linear_attn.md, "Measured": split vs walks).
  const bool split_by_default = !gated && !denominator && !seq.varlen && cfg.dtype != DType::f32 &&
                                std::max(cfg.block_k, cfg.block_v) <= 128 &&
                                4 * seq.N * seq.H <= device_limits(opts).sms && seq.T >= 1024;
  if (split_key().value(opts, split_by_default ? 1 : 0) == 1) {
    if (gated || denominator || std::max(cfg.block_k, cfg.block_v) > 128)
      throw UserError("linear_attn --backward --config split=1 takes the plain form (no g, no --normalize) with "
                      "head dims up to 128");
    if (!seq.varlen) return plan_split_bwd(inputs, opts, wanted, seq, cfg, scale);
  }
  const int64_t k_blocks = cfg.block_k / cfg.split_k, v_blocks = cfg.block_v / cfg.split_v;

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {"g", "initial_state", "dfinal_state"});
  plan.tensors["dq"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  if (gated) {
    plan.tensors["dg"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
    // Per key block, the partial row sums q.dq and k.dk (O(T) scratch).
    plan.tensors["dg_q"] = HostTensor::zeros(DType::f32, {k_blocks, seq.B, seq.T, seq.H});
    plan.tensors["dg_k"] = HostTensor::zeros(DType::f32, {k_blocks, seq.B, seq.T, seq.H});
    if (has_dht) plan.tensors["dg_s"] = HostTensor::zeros(DType::f32, {k_blocks, seq.N, seq.H});
  }
  if (cfg.initial_state_grad)
    plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});
  if (denominator)
    for (const char* name : {"den_do", "ones"}) {
      check_shape(name, inputs.at(name), {seq.B, seq.T, seq.H, 1});
      plan.tensors[name] = inputs.at(name).cast(cfg.dtype);
    }

  auto launch = [&](LinearAttnBwdKernel which, int64_t blocks) {
    const std::array<int64_t, 3> grid =
        which == LinearAttnBwdKernel::dg ? std::array<int64_t, 3>{seq.N * seq.H, 1, 1}
                                         : std::array<int64_t, 3>{blocks, seq.N * seq.H, 1};
    plan.launches.push_back(plan_launch(plan, cached_bwd(cfg, which), grid, {{"scale", scale}}));
  };
  launch(LinearAttnBwdKernel::dq, k_blocks);
  launch(LinearAttnBwdKernel::dk, k_blocks);
  launch(LinearAttnBwdKernel::dv, v_blocks);
  if (gated) launch(LinearAttnBwdKernel::dg, 1);
  for (const char* name : {"dq", "dk", "dv", "dg", "dinitial_state"})
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

}  // namespace

OpPlan plan_linear_attn_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  if (opts.normalize || opts.recurrent)
    throw UserError("linear_attn: --backward is not implemented with --normalize or --recurrent");
  return plan_bwd(inputs, opts, wanted, false);
}

OpPlan plan_linear_attn_bwd_with_denominator(const TensorMap& inputs, const OpOptions& opts,
                                             const std::vector<std::string>& wanted) {
  OpOptions o = opts;
  o.normalize = false;
  return plan_bwd(inputs, o, wanted, true);
}

std::vector<std::shared_ptr<ir::Kernel>> linear_attn_bwd_kernels(const OpOptions& opts) {
  // Head dim 64, plain and with every option; the dq and dk walks also with --normalize's denominator
  // in 16-bit (these lists feed test_ptxas's zero-spill check: in fp32 the denominator's walks spill
  // 4-12 bytes at 255 registers, so they are left out there).
  std::vector<std::shared_ptr<ir::Kernel>> out;
  LinearAttnBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = cfg.block_v = 64;
  LinearAttnBwdConfig gated = cfg;
  gated.gated = gated.initial_state = gated.final_state_grad = gated.initial_state_grad = true;
  configure(cfg, opts);
  configure(gated, opts);
  for (const auto& c : {cfg, gated})
    for (auto which : {LinearAttnBwdKernel::dq, LinearAttnBwdKernel::dk, LinearAttnBwdKernel::dv})
      out.push_back(cached_bwd(c, which));
  out.push_back(cached_bwd(gated, LinearAttnBwdKernel::dg));
  for (bool g : {false, true}) {
    if (opts.dtype == DType::f32) break;
    LinearAttnBwdConfig norm = cfg;
    norm.gated = g;
    norm.denominator = true;
    configure(norm, opts);
    for (auto which : {LinearAttnBwdKernel::dq, LinearAttnBwdKernel::dk}) out.push_back(cached_bwd(norm, which));
  }
  // The split schedule at its defaults, with both states.
  LinearAttnSplitBwdConfig split;
  split.dtype = opts.dtype;
  split.chunk = opts.dtype == DType::f32 ? 32 : 64;
  split.state_stages = opts.dtype == DType::f32 ? 1 : 2;
  split.initial_state = split.final_state_grad = split.initial_state_grad = true;
  out.push_back(build_linear_attn_bwd_states(split));
  out.push_back(build_linear_attn_bwd_dstates(split));
  out.push_back(build_linear_attn_bwd_chunk(split));
  return out;
}

namespace {

std::shared_ptr<ir::Kernel> cached_prep(DType dt, int64_t block_v) {
  static KernelMemo memo;
  return memo.get(memo_key(dt, block_v), [&] { return build_linear_attn_normalized_bwd_prep(dt, block_v); });
}

/// Appends `part`'s launches to `plan`. Its tensors are renamed `prefix + name`, except those named in
/// `shared` (part's name -> plan's name), which are the plan's own: how the sub-plans of one op
/// hand tensors to each other.
void append_plan(OpPlan& plan, OpPlan part, const std::string& prefix, const std::map<std::string, std::string>& shared) {
  auto rename = [&](const std::string& name) {
    auto it = shared.find(name);
    return it != shared.end() ? it->second : prefix + name;
  };
  for (auto& [name, t] : part.tensors)
    if (!shared.count(name)) plan.tensors[prefix + name] = std::move(t);
  for (auto& l : part.launches) {
    for (auto& [param, tensor] : l.tensors) tensor = rename(tensor);
    plan.launches.push_back(std::move(l));
  }
}

}  // namespace

OpPlan plan_linear_attn_normalized_bwd(const TensorMap& inputs, const OpOptions& opts,
                                       const std::vector<std::string>& wanted) {
  SequenceLayout seq = check_qkv_inputs("linear_attn", inputs);
  if (opts.recurrent) throw UserError("linear_attn: --backward is not implemented with --recurrent");
  if (inputs.count("initial_state") || inputs.count("dfinal_state"))
    throw UserError("linear_attn --normalize has no states, so no initial_state or dfinal_state either");
  if (!inputs.count("do")) throw UserError("linear_attn --backward: missing input 'do' (dL/do, [B,T,H,V])");
  check_shape("do", inputs.at("do"), {seq.B, seq.T, seq.H, seq.V});
  const bool gated = inputs.count("g") > 0;
  for (const auto& w : wanted) {
    if (w != "dq" && w != "dk" && w != "dv" && w != "dg")
      throw UserError(fmt::format("linear_attn --normalize --backward produces dq, dk, dv and dg, not '{}'", w));
  }
  if (wants(wanted, "dg") && !gated) throw UserError("linear_attn --backward: -o dg needs the gate input g");
  const DType dt = opts.dtype;

  // o = N / (D + eps) with N = LA(q, k, v) and D = LA(q, k, 1) (both with the scale), so
  //   (dq, dk, dg) = LA_bwd(q, k, v; dN) + LA_bwd(q, k, 1; dD),  dv = LA_bwd(q, k, v; dN)'s dv
  // with dN, dD from the prep kernel: plain linear attention's kernels do all the chunked work, the
  // two backwards in one set of walks (plan_linear_attn_bwd_with_denominator: the dq and dk walks
  // carry D's one-column pair beside N's, faster than two backwards plus elementwise sums: docs/ops/
  // linear_attn.md, "Measured").
  TensorMap base;
  for (const char* name : {"q", "k", "v", "g", "cu_seqlens"})
    if (inputs.count(name)) base[name] = inputs.at(name);
  TensorMap ones_in = base;
  HostTensor ones = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, 1});
  for (int64_t i = 0; i < ones.numel(); ++i) ones.set(i, 1.0);
  ones_in["v"] = ones;

  // The sub-plans are plain linear attention: no normalization, and no noise-dropout (the caller
  // applies it once, to this plan's do).
  OpOptions fwd = opts;
  fwd.noise_dropout.reset();
  fwd.backward = fwd.normalize = false;
  fwd.config.clear();  // the user's --config is for the backward kernels
  fwd.chunk_size.reset();
  OpOptions bwd = opts;
  bwd.noise_dropout.reset();
  bwd.normalize = false;
  const OpDef la = linear_attn_op();

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, dt, {"g"});
  plan.tensors["ones"] = ones.cast(dt);
  const std::map<std::string, std::string> common = {{"q", "q"}, {"k", "k"}, {"g", "g"}, {"cu_seqlens", "cu_seqlens"}};
  auto with = [&](std::map<std::string, std::string> m) {
    m.insert(common.begin(), common.end());
    return m;
  };
  // Forward recomputation: the numerator and the denominator.
  append_plan(plan, la.prepare(base, fwd, {"o"}), "num_", with({{"v", "v"}}));
  append_plan(plan, la.prepare(ones_in, fwd, {"o"}), "den_", with({{"v", "ones"}}));
  // dN, dD.
  plan.tensors["dnum"] = HostTensor::zeros(dt, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dden"] = HostTensor::zeros(dt, {seq.B, seq.T, seq.H, 1});
  // The prep reads the recomputed N and D under their sub-plans' prefixed names.
  constexpr int64_t kRows = kNormalizedBwdPrepRows;
  plan.launches.push_back(bound_launch(
      cached_prep(dt, padded_head_dim(seq.V)), {std::max<int64_t>(1, (seq.T + kRows - 1) / kRows), seq.B * seq.H, 1},
      {{"do", "do"}, {"num", "num_o"}, {"den", "den_o"}, {"dnum", "dnum"}, {"dden", "dden"}}));
  // Both backwards at once: dq, dk (and dg) come out as the sums.
  std::vector<std::string> grads = {"dq", "dk", "dv"};
  if (gated) grads.push_back("dg");
  TensorMap bwd_in = base;
  bwd_in["do"] = inputs.at("do");
  bwd_in["den_do"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, 1});  // placeholders: the
  bwd_in["ones"] = ones;                                                      // plan's own are bound
  append_plan(plan, plan_linear_attn_bwd_with_denominator(bwd_in, bwd, grads), "",
              with({{"v", "v"}, {"do", "dnum"}, {"den_do", "dden"}, {"ones", "ones"}}));
  for (const auto& name : grads)
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> linear_attn_normalized_bwd_kernels(const OpOptions& opts) {
  // (The walks with the denominator folded in are among linear_attn_bwd_kernels.)
  return {cached_prep(opts.dtype, 64)};
}

}  // namespace linac
