// The backward of the op "linear_attn" (docs/ops/linear_attn.md): the plans and defaults of the three
// walks (bwd.h), of the split schedule (split_bwd.h) and of the normalized form, composed from the
// forward and the walks with its prep kernel (normalized_bwd.h).
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>

#include "kernels/common/chunk_gate_sums.h"
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

/// Whether the walks spill at `columns` columns per program over padded head dims block_k x block_v: a
/// bound of registers, not of shared memory. A walk's tiles span the other head dim whole, so a block of
/// 128 key columns (dq, dk) spills where the value head dim is over 128, and one of 128 value columns
/// (dv) where the key head dim is (sm_90a, ptxas 13.0: 352-1048 bytes at K = V = 256, 576-1036 in dv at
/// K = 256, V = 128; none at K = 64, V = 256). gla's walks spill there too but ran faster at 128
/// (kernels/gla/op_bwd.cpp).
bool wide_blocks_spill(int64_t columns, int64_t block_k, int64_t block_v) {
  return (std::min(columns, block_k) >= 128 && block_v > 128) || (std::min(columns, block_v) >= 128 && block_k > 128);
}

/// The walks' (chunk, columns per program) in order of preference for cfg's dtype, gate and head dims
/// (docs/ops/linear_attn.md, "Measured"):
/// - chunk 64 in 16-bit, the sweep's fastest, gated too since session 21 (its walks at 64 spilled 84-96
///   bytes until then; now none under ptxas 13.0, and 16-21% faster on an H200); 32 in fp32 (chunk 64
///   fits there up to head dim 128 but ran slower);
/// - wider column blocks before larger chunks (one program per head up to 128 columns, then 64; 32 last),
///   but none where they spill (wide_blocks_spill: 64 at K = V = 256, where chunks of 64 then ran
///   fastest: B8 T2048 H32 D256 on an H200, backward 2.30 ms plain, 3.32 gated, against 3.33 and 6.92 at
///   chunk 32 with 128 columns and 3.17 plain at chunk 32 with 64, session 36);
/// - chunks of 16 last (fp32 at K = V = 256 ran slower at 16 than at 32 with half the columns);
/// the first whose walks fit the call's GPU is the default.
std::vector<std::pair<int, int64_t>> bwd_proposals(const LinearAttnBwdConfig& cfg) {
  const std::vector<int> chunks = cfg.dtype != DType::f32 ? std::vector<int>{64, 32} : std::vector<int>{32};
  auto fits_registers = [&](int64_t columns) { return !wide_blocks_spill(columns, cfg.block_k, cfg.block_v); };
  std::vector<std::pair<int, int64_t>> out;
  for (int64_t columns : {128, 64})
    for (int chunk : chunks)
      if (fits_registers(columns)) out.push_back({chunk, columns});
  for (int64_t columns : {128, 64, 32})
    if (fits_registers(columns)) out.push_back({16, columns});
  return out;
}

/// The walks' configuration (bwd.h): chunk, bk, bv and warps are tuned.
const ConfigSchema<LinearAttnBwdConfig>& walks_schema() {
  using C = LinearAttnBwdConfig;
  static const ConfigSchema<C> schema(
      field<&C::dtype>(), tuned<&C::chunk>(chunk_key()), field<&C::block_k>(), field<&C::block_v>(),
      tuned<&C::split_k>(
          {"bk", {16, 32, 64, 128, 256}, "--backward: key columns per program of the dq and dk kernels"}),
      tuned<&C::split_v>({"bv", {16, 32, 64, 128, 256}, "--backward: value columns per program of the dv kernel"}),
      field<&C::gated>(), field<&C::initial_state>(), field<&C::final_state_grad>(), field<&C::initial_state_grad>(),
      field<&C::varlen>(), field<&C::denominator>(), tuned<&C::num_warps>(warps_key()),
      tuned<&C::producer_warps>(producer_key()));
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
      field<&C::initial_state>(), field<&C::final_state_grad>(), field<&C::initial_state_grad>(),
      field<&C::accumulate_dqdk>());
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
/// 32: columns_for_walks), with chunks of at most 32 and 4 warps: faster at few heads, and what `linac
/// tune --backward` chose there; from 96 heads on the wide defaults stand (docs/ops/linear_attn.md,
/// "Measured").
constexpr int64_t kNarrowestColumns = 32;

/// The kernels the walks' plan launches at `cfg`, in order: dq, dk, dv; dg when gated.
std::vector<LinearAttnBwdKernel> walk_launch_order(const LinearAttnBwdConfig& cfg) {
  using K = LinearAttnBwdKernel;
  if (cfg.gated) return {K::dq, K::dk, K::dv, K::dg};
  return {K::dq, K::dk, K::dv};
}

std::vector<std::shared_ptr<ir::Kernel>> walk_kernels(const LinearAttnBwdConfig& cfg) {
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (LinearAttnBwdKernel which : walk_launch_order(cfg)) out.push_back(cached_bwd(cfg, which));
  return out;
}

/// Reads chunk, bk, bv and warps from opts (defaults otherwise) for padded head dims block_k, block_v and
/// cfg's options (gated, states, denominator: set before). The defaults: the first of bwd_proposals whose
/// walks fit the call's GPU, with 8 warps; then, where `heads` (sequences x heads, 0 when unknown) leaves
/// those walks few, their column blocks narrowed (kNarrowestColumns), at most 32 rows per chunk and 4
/// warps in 16-bit (fp32 keeps 8: 4 ran slower there, docs/ops/linear_attn.md, "Measured").
/// Narrowing only shrinks the walks' tiles, so what fitted still fits.
void configure(LinearAttnBwdConfig& cfg, const OpOptions& opts, int64_t heads = 0) {
  std::vector<LinearAttnBwdConfig> proposals;
  for (auto [chunk, columns] : bwd_proposals(cfg)) {
    LinearAttnBwdConfig c = cfg;
    c.chunk = chunk;
    c.split_k = std::min(columns, cfg.block_k);
    c.split_v = std::min(columns, cfg.block_v);
    c.num_warps = 8;
    proposals.push_back(c);
  }
  const LinearAttnBwdConfig wide = first_fitting<LinearAttnBwdConfig>(proposals, walk_kernels, opts);
  cfg.chunk = wide.chunk;
  cfg.split_k = columns_for_walks(wide.split_k, cfg.block_k, heads, kNarrowestColumns, opts);
  cfg.split_v = columns_for_walks(wide.split_v, cfg.block_v, heads, kNarrowestColumns, opts);
  cfg.num_warps = wide.num_warps;
  if (cfg.split_k < wide.split_k || cfg.split_v < wide.split_v) {
    cfg.chunk = std::min(cfg.chunk, 32);
    cfg.num_warps = cfg.dtype == DType::f32 ? 8 : 4;
  }
  cfg.chunk = checked_chunk_size(opts.chunk_size, cfg.chunk);
  walks_schema().apply(opts, cfg);
  if (cfg.split_k > cfg.block_k || cfg.split_v > cfg.block_v)
    throw UserError(fmt::format("linear_attn --backward: --config bk={} bv={} exceed the padded head dims {} and {}",
                                cfg.split_k, cfg.split_v, cfg.block_k, cfg.block_v));
  // A warpgroup of its own filling the walks' TMA ring (producer warps) in 16 bits, where their rings
  // take them: faster for every form measured (H200, B8 T4096 H16 D128: plain 0.563 -> 0.527 ms, gated
  // 1.083 -> 0.951, normalized 1.427 -> 1.365; docs/ops/linear_attn.md, "Measured", session 34).
  default_producer_warps(cfg, &LinearAttnBwdConfig::producer_warps, walk_kernels, opts);
}

}  // namespace

TuningKeys linear_attn_bwd_tuning_keys() {
  return merge_tuning_keys({walks_schema().tuning(), {split_key()}, split_schema().tuning()});
}

namespace {

enum class SplitBwdKernel { states, dstates, chunk };

std::shared_ptr<ir::Kernel> cached_split(const LinearAttnSplitBwdConfig& cfg, SplitBwdKernel which) {
  static KernelMemo memo;
  return memo.get(split_schema().key(cfg, which), [&] {
    switch (which) {
      case SplitBwdKernel::states: return build_linear_attn_bwd_states(cfg);
      case SplitBwdKernel::dstates: return build_linear_attn_bwd_dstates(cfg);
      case SplitBwdKernel::chunk: return build_linear_attn_bwd_chunk(cfg);
    }
    throw InternalError("bad linear_attn split backward kernel");
  });
}

/// The kernels the split schedule's plan launches at `cfg`, in order: the state pass, the pass of the
/// state gradients, every chunk's gradients.
std::vector<std::shared_ptr<ir::Kernel>> split_kernels(const LinearAttnSplitBwdConfig& cfg) {
  return {cached_split(cfg, SplitBwdKernel::states), cached_split(cfg, SplitBwdKernel::dstates),
          cached_split(cfg, SplitBwdKernel::chunk)};
}

/// The split schedule's defaults for `base` (head dims and states set): state passes in 32 x 32 blocks
/// of 4 warps and the per-chunk kernel on 8 warps (the fastest measured, docs/ops/linear_attn.md); then
/// the first of chunk 64, 32, 16 (the per-chunk kernel holds S and dS' whole) and, for each, the state
/// passes' loads two stages deep, then one, whose kernels fit the call's GPU.
LinearAttnSplitBwdConfig split_defaults(LinearAttnSplitBwdConfig base, const OpOptions& opts) {
  base.state_block_k = std::min<int64_t>(32, base.block_k);
  base.state_block_v = std::min<int64_t>(32, base.block_v);
  base.state_warps = 4;
  base.num_warps = 8;
  std::vector<LinearAttnSplitBwdConfig> proposals;
  for (int chunk : {64, 32, 16})
    for (int stages : {2, 1}) {
      LinearAttnSplitBwdConfig c = base;
      c.chunk = chunk;
      c.state_stages = stages;
      proposals.push_back(c);
    }
  return first_fitting<LinearAttnSplitBwdConfig>(proposals, split_kernels, opts);
}

/// The split schedule's plan (split_bwd.h): dense inputs, plain form.
OpPlan plan_split_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted,
                      const SequenceLayout& seq, const LinearAttnBwdConfig& walks, double scale, bool accumulate_dqdk) {
  LinearAttnSplitBwdConfig base;
  base.accumulate_dqdk = accumulate_dqdk;
  base.dtype = walks.dtype;
  base.block_k = walks.block_k;
  base.block_v = walks.block_v;
  base.initial_state = walks.initial_state;
  base.final_state_grad = walks.final_state_grad;
  base.initial_state_grad = walks.initial_state_grad;
  LinearAttnSplitBwdConfig cfg = split_defaults(base, opts);
  cfg.chunk = checked_chunk_size(opts.chunk_size, cfg.chunk);
  split_schema().apply(opts, cfg);
  cfg.state_block_k = std::min(cfg.state_block_k, cfg.block_k);
  cfg.state_block_v = std::min(cfg.state_block_v, cfg.block_v);
  const std::vector<std::shared_ptr<ir::Kernel>> kernels = split_kernels(cfg);

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
  plan.launches.push_back(plan_launch(plan, kernels[0], state_grid, {}));
  plan.launches.push_back(plan_launch(plan, kernels[1], state_grid, {{"scale", scale}}));
  if (chunks > 0)
    plan.launches.push_back(plan_launch(plan, kernels[2], {chunks, seq.N * seq.H, 1}, {{"scale", scale}}));
  for (const char* name : {"dq", "dk", "dv", "dinitial_state"})
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

/// The plain backward's plan (`denominator`: the walks carry --normalize's denominator pair too);
/// `accumulate_dqdk`: the split schedule adds dq and dk to what the plan's dq and dk hold (the plan
/// that appends this one binds them to its own).
OpPlan plan_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted,
                bool denominator, bool accumulate_dqdk = false) {
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
  if (!denominator && linear_attn_bwd_takes_split(seq, opts, gated)) {
    if (gated || std::max(cfg.block_k, cfg.block_v) > 128)
      throw UserError("linear_attn --backward --config split=1 takes the plain form (no g) with head dims up to 128");
    if (!seq.varlen) return plan_split_bwd(inputs, opts, wanted, seq, cfg, scale, accumulate_dqdk);
  }
  if (accumulate_dqdk) throw InternalError("linear_attn bwd: only the split schedule accumulates dq and dk");
  const int64_t k_blocks = cfg.block_k / cfg.split_k, v_blocks = cfg.block_v / cfg.split_v;

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {"g", "initial_state", "dfinal_state"});
  if (gated) add_chunk_gate_sums(plan, seq, cfg.chunk);  // the walks read the gates' sums
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

  for (LinearAttnBwdKernel which : walk_launch_order(cfg)) {
    const int64_t heads = seq.N * seq.H;
    const std::array<int64_t, 3> grid = which == LinearAttnBwdKernel::dg   ? std::array<int64_t, 3>{heads, 1, 1}
                                        : which == LinearAttnBwdKernel::dv ? std::array<int64_t, 3>{v_blocks, heads, 1}
                                                                           : std::array<int64_t, 3>{k_blocks, heads, 1};
    plan.launches.push_back(plan_launch(plan, cached_bwd(cfg, which), grid, {{"scale", scale}}));
  }
  for (const char* name : {"dq", "dk", "dv", "dg", "dinitial_state"})
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

}  // namespace

bool linear_attn_bwd_takes_split(const SequenceLayout& seq, const OpOptions& opts, bool gated) {
  // The split schedule by default where the walks leave most SMs idle: plain form, 16-bit, dense, head
  // dims up to 128, one walk per sequence x head busying at most a quarter of the SMs, over at least
  // 1024 tokens. At half the SMs it depends (`linac tune --backward` times both there: few_walks); a
  // walk per SM and more favour the walks (docs/ops/linear_attn.md, "Measured": split vs walks).
  const bool by_default = !gated && !seq.varlen && opts.dtype != DType::f32 &&
                          std::max(padded_head_dim(seq.K), padded_head_dim(seq.V)) <= 128 &&
                          4 * seq.N * seq.H <= device_limits(opts).sms && seq.T >= 1024;
  return split_key().value(opts, by_default ? 1 : 0) == 1;
}

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
  split.block_k = split.block_v = 64;
  split.initial_state = split.final_state_grad = split.initial_state_grad = true;
  for (auto& k : split_kernels(split_defaults(split, opts))) out.push_back(k);
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
  const HostTensor ones = HostTensor::filled(DType::f32, {seq.B, seq.T, seq.H, 1}, 1.0);
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
  std::vector<std::string> grads = {"dq", "dk", "dv"};
  if (gated) grads.push_back("dg");
  if (linear_attn_bwd_takes_split(seq, bwd, gated)) {
    // Where the plain backward takes its split schedule (few walks; plain form), the two backwards run
    // on it apart, N's giving dq, dk, dv and D's adding its dq and dk to them (its chunk kernel
    // accumulates): the walks that carry both at once leave those SMs idle (docs/ops/linear_attn.md,
    // "Measured").
    TensorMap num_in = base, den_in = base;
    num_in["do"] = inputs.at("do");
    den_in["v"] = ones;
    den_in["do"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, 1});  // placeholders: the plan's
    append_plan(plan, plan_linear_attn_bwd(num_in, bwd, grads), "", with({{"v", "v"}, {"do", "dnum"}}));
    append_plan(plan, plan_bwd(den_in, bwd, {"dq", "dk"}, /*denominator=*/false, /*accumulate_dqdk=*/true), "den_",
                with({{"v", "ones"}, {"do", "dden"}, {"dq", "dq"}, {"dk", "dk"}}));
  } else {
    // Both backwards at once: dq, dk (and dg) come out as the sums.
    TensorMap bwd_in = base;
    bwd_in["do"] = inputs.at("do");
    bwd_in["den_do"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, 1});  // placeholders: the
    bwd_in["ones"] = ones;                                                      // plan's own are bound
    append_plan(plan, plan_linear_attn_bwd_with_denominator(bwd_in, bwd, grads), "",
                with({{"v", "v"}, {"do", "dnum"}, {"den_do", "dden"}, {"ones", "ones"}}));
  }
  for (const auto& name : grads)
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> linear_attn_normalized_bwd_kernels(const OpOptions& opts) {
  // (The walks with the denominator folded in are among linear_attn_bwd_kernels.)
  return {cached_prep(opts.dtype, 64)};
}

}  // namespace linac
