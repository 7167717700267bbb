// The backward of the ops "delta_rule" and "gated_delta_rule" (docs/ops/delta_rule.md): the plans and
// defaults of the chunked form (bwd.h; the UT transform recomputed, or the forward's saved tensors taken)
// and of the token-by-token reference form (bwd_tokenwise.h, --config tokenwise=1), and --l2norm-qk's
// normalization around either.
#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "kernels/common/chunk_gate_sums.h"
#include "kernels/common/config_schema.h"
#include "kernels/common/device_limits.h"
#include "kernels/common/fitting.h"
#include "kernels/common/l2norm.h"
#include "kernels/common/op_support.h"
#include "kernels/delta_rule/bwd.h"
#include "kernels/delta_rule/bwd_tokenwise.h"
#include "kernels/delta_rule/fwd.h"
#include "kernels/delta_rule/op.h"
#include "linac/error.h"

namespace linac {

namespace {

/// The per-chunk kernel's value columns per step and warps.
struct ChunkKernelShape {
  int64_t chunk_v;
  int warps;
};

/// The per-chunk kernel's shapes for V padded to full_v, in order of preference; `one_kernel`: the
/// per-chunk work in one kernel (all of K in a program: delta_bwd_chunk_key_columns). It holds S and
/// dS' blocks [K, columns] beside the chunk's tiles. In 16 bits, one kernel, first steps of 32 columns
/// on 4 warps, the next step's loads prefetched: 255 registers and 72 KB at K = V = 128, two programs
/// per SM, so that one's loads run under the other's products (one program of 8 warps per SM left the
/// SM idle while it loaded: DRAM 49% busy in ncu); at B8 T4096 H16
/// D128 bf16 0.98 -> 0.72 ms, gated 1.30 -> 1.00 (docs/ops/delta_rule.md, "Measured", session 38). Then,
/// on 8 warps, all of V up to 128 in one step (straight-line code), then steps of 64, then 32 (head dim
/// 256 in one step: 360 KB in bf16; fp32 at K = V = 128 plans 191 KB in one step at chunk 16, more than
/// an A100 block's 163 KB). Not proposed, measured slower: steps of 16 on 4 warps (1.81 ms; tiles of
/// 16 columns stay out of the TMA ring: compiler/passes/pipeline.cpp), of 32 on 8 warps (1.14, one
/// program per SM). In fp32 (products by FMA loops, not the tensor cores), one kernel, V = 64: first all
/// of it in one step on 4 warps, faster than 8 (H200 B8 T1024 H8 K64: 0.273 -> 0.250 ms, gated 0.335 ->
/// 0.275; steps of 32 prefetched 0.299 / 0.337) and spill-free, where 8 warps spilled 8-16 bytes at 255
/// registers in the gated kernel with every option (docs/ops/delta_rule.md, "Measured", session 39). At
/// V = 16 and 32 (ptxas takes 255 registers on 4 warps or 8) 4 warps spilled 8-32 bytes in the gated
/// kernel, at V = 128 (chunks of 16) 12: 8 warps there.
std::vector<ChunkKernelShape> chunk_kernel_shapes(DType dtype, bool one_kernel, int64_t full_v) {
  std::vector<ChunkKernelShape> out;
  if (dtype_bytes(dtype) == 2 && one_kernel && full_v >= 64) out.push_back({32, 4});
  if (dtype_bytes(dtype) == 4 && one_kernel && full_v == 64) out.push_back({64, 4});
  if (full_v <= 128) out.push_back({full_v, 8});
  for (int64_t step : {64, 32})
    if (step < full_v) out.push_back({step, 8});
  return out;
}

/// Key columns per program of the per-chunk work for K padded to block_k: all of them (one kernel) up to
/// 128, blocks of 128 above (two kernels: build_delta_bwd_chunk_keys).
int64_t delta_bwd_chunk_key_columns(int64_t block_k, bool /*gated*/) {
  // Blocks of 128 above head dim 128 for both forms, the fastest with the key-block kernel's next value
  // step prefetched (docs/ops/delta_rule.md, "Measured"; the one kernel spills: 255 registers).
  return block_k > 128 ? 128 : block_k;
}

enum class DeltaBwdKernel { wy, states, dstates, chunk, chunk_keys, chunk_ut };

/// The chunked backward's rows per chunk (the saved tensors' chunk is checked against it when asked for).
TuningKey bwd_chunk_key() { return {"chunk", {16, 32, 64}, "--backward: rows per chunk"}; }
/// The key-block kernel's warps (read after the others: its default is warps, the per-chunk kernels').
TuningKey kwarps_key() {
  return {"kwarps", {2, 4, 8}, "--backward: warps of the key-block kernel where ck splits K (default warps)"};
}

/// The state walks' warps (read after the others: its default follows bv and warps).
TuningKey wwarps_key() {
  return {"wwarps", {2, 4, 8}, "--backward: warps of the state walks (default 4 where bv is under 128 and V, else 8)"};
}

/// The walks' warps unless asked: delta_walk_warps (fwd.h), 8 for the walks of whole value dims.
int default_walk_warps(const DeltaChunkedBwdConfig& cfg) {
  return delta_walk_warps(cfg.block_v, cfg.full_v, 8);
}

/// The chunked backward's configuration (bwd.h): chunk, bv, cv, ck, kwarps, kstages, wwarps and warps are
/// tuned.
const ConfigSchema<DeltaChunkedBwdConfig>& chunked_schema() {
  using C = DeltaChunkedBwdConfig;
  static const ConfigSchema<C> schema(
      field<&C::dtype>(), tuned<&C::chunk>(bwd_chunk_key()), field<&C::block_k>(),
      tuned<&C::block_v>({"bv", {16, 32, 64, 128}, "--backward: value columns per program of the state walks"}),
      field<&C::full_v>(),
      tuned<&C::chunk_v>({"cv",
                          {16, 32, 64, 128, 256},
                          "--backward: value columns per step of the per-chunk kernel (default 32 in 16 bits up to head dim "
                          "128, else all of V up to 128)"}),
      tuned<&C::chunk_k>({"ck",
                          {16, 32, 64, 128, 256},
                          "--backward: key columns per program of the per-chunk work, in two kernels under the "
                          "padded K (default all of K up to 128, else 128)"}),
      tuned<&C::keys_warps>(kwarps_key()), tuned<&C::walk_warps>(wwarps_key()),
      tuned<&C::step_stages>({"kstages",
                              {1, 2},
                              "--backward: 2 = the per-chunk kernel (the key-block kernel where ck splits K) "
                              "prefetches its next value step's loads (default 2 where it fits)"}),
      field<&C::gated>(), field<&C::initial_state>(), field<&C::final_state>(), field<&C::final_state_grad>(),
      field<&C::initial_state_grad>(), field<&C::varlen>(), tuned<&C::num_warps>(warps_key()),
      tuned<&C::walk_producer_warps>(producer_key()));
  return schema;
}

/// delta_rule_wy as the backward recomputes W, U and T (T stored: build_delta_bwd_chunk loads it
/// instead of inverting again).
DeltaRuleConfig wy_config(const DeltaChunkedBwdConfig& cfg) {
  DeltaRuleConfig wy;
  wy.dtype = cfg.dtype;
  wy.chunk = cfg.chunk;
  wy.block_k = static_cast<int>(cfg.block_k);
  wy.block_v = static_cast<int>(cfg.block_v);
  wy.wy_block_v = delta_wy_block_v(cfg.dtype, wy.block_v, cfg.full_v);
  wy.varlen = cfg.varlen;
  wy.gated = cfg.gated;
  wy.store_t = true;
  wy.v_blocks = static_cast<int>((cfg.full_v + wy.wy_block_v - 1) / wy.wy_block_v);
  return wy;
}

std::shared_ptr<ir::Kernel> cached(const DeltaChunkedBwdConfig& cfg, DeltaBwdKernel which) {
  static KernelMemo memo;
  return memo.get(chunked_schema().key(cfg, which), [&]() -> std::shared_ptr<ir::Kernel> {
    switch (which) {
      case DeltaBwdKernel::wy: return build_delta_rule_wy(wy_config(cfg));
      case DeltaBwdKernel::states: return build_delta_bwd_states(cfg);
      case DeltaBwdKernel::dstates: return build_delta_bwd_dstates(cfg);
      case DeltaBwdKernel::chunk: return build_delta_bwd_chunk(cfg);
      case DeltaBwdKernel::chunk_keys: return build_delta_bwd_chunk_keys(cfg);
      case DeltaBwdKernel::chunk_ut: return build_delta_bwd_chunk_ut(cfg);
    }
    throw InternalError("bad delta-rule backward kernel");
  });
}

}  // namespace

std::shared_ptr<ir::Kernel> delta_state_pass_kernel(const DeltaChunkedBwdConfig& cfg) {
  return cached(cfg, DeltaBwdKernel::states);
}

const std::vector<DeltaSavedTensor>& delta_saved_tensors() {
  static const std::vector<DeltaSavedTensor> saved = {
      {"saved_w", "w", "[B,T,H,K]", "W of the UT transform"},
      {"saved_t", "t_mat", "[B,T,H,chunk]", "T = (I + A)^-1 by rows"},
      {"saved_h", "h", "[chunks,H,K,V]", "the state before each chunk"},
      {"saved_v_new", "v_new", "[B,T,H,V]", "V_new = U - W S"}};
  return saved;
}

namespace {

/// The kernels the backward's plan launches at `cfg`, in order: without the saved tensors delta_rule_wy
/// and the state walk first; the walk of the state gradients; the per-chunk work, in key blocks where ck
/// splits K.
std::vector<DeltaBwdKernel> bwd_launch_order(const DeltaChunkedBwdConfig& cfg, bool saved) {
  using K = DeltaBwdKernel;
  std::vector<K> out;
  if (!saved) out = {K::wy, K::states};
  out.push_back(K::dstates);
  if (cfg.chunk_k < cfg.block_k) {
    out.push_back(K::chunk_keys);
    out.push_back(K::chunk_ut);
  } else {
    out.push_back(K::chunk);
  }
  return out;
}

std::vector<std::shared_ptr<ir::Kernel>> bwd_kernels(const DeltaChunkedBwdConfig& cfg, bool saved) {
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (DeltaBwdKernel which : bwd_launch_order(cfg, saved)) out.push_back(cached(cfg, which));
  return out;
}

/// The chunked backward's defaults for head dims K, V at `chunk` rows per chunk (before --config);
/// `heads`: sequences x heads of the call (0: unknown), for the few-walks value blocks.
DeltaChunkedBwdConfig bwd_defaults(const OpOptions& opts, bool gated, int64_t K, int64_t V, int64_t heads,
                                   int chunk) {
  DeltaChunkedBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.gated = gated;
  cfg.block_k = padded_head_dim(K);
  cfg.full_v = padded_head_dim(V);
  cfg.chunk = chunk;
  // V blocks of 128 in the walks: the fastest of `linac tune --backward` (docs/ops/delta_rule.md,
  // "Measured"); where those walks are few, halved down to 32 while they stay few (columns_for_walks:
  // more programs per walk, faster there); 32 above head dim 128, where [K, 128] states spilled (the
  // gated reverse walk 1296 bytes at K = 256, 5.60 -> 3.47 ms at 32 columns).
  const int64_t widest_v = cfg.block_k > 128 ? std::min<int64_t>(32, cfg.full_v)
                                             : columns_for_walks(std::min<int64_t>(128, cfg.full_v), cfg.full_v,
                                                                 heads, 32, opts);
  cfg.chunk_k = delta_bwd_chunk_key_columns(cfg.block_k, gated);
  // Then what shared memory decides, the first proposal whose kernels fit the call's GPU: the walks'
  // value blocks (128 or narrower where they are few, then halved down to 32), the per-chunk kernel's
  // shape (chunk_kernel_shapes) and its value steps prefetched (2 stages, much faster: docs/ops/
  // delta_rule.md, "Measured"), then not.
  std::vector<DeltaChunkedBwdConfig> proposals;
  for (int64_t bv = widest_v; bv >= std::min<int64_t>(32, widest_v); bv /= 2)
    for (const ChunkKernelShape& shape : chunk_kernel_shapes(cfg.dtype, cfg.chunk_k == cfg.block_k, cfg.full_v))
      for (int stages : {2, 1}) {
        DeltaChunkedBwdConfig c = cfg;
        c.block_v = bv;
        c.walk_warps = default_walk_warps(c);
        c.chunk_v = shape.chunk_v;
        c.num_warps = shape.warps;
        c.step_stages = stages;
        proposals.push_back(c);
      }
  return first_fitting<DeltaChunkedBwdConfig>(
      proposals, [](const DeltaChunkedBwdConfig& c) { return bwd_kernels(c, /*saved=*/false); }, opts);
}

}  // namespace

int delta_bwd_default_chunk(const OpOptions& opts, bool gated, int64_t K, int64_t V, int64_t heads) {
  // Chunks of 32, or of 16 where the backward's kernels at 32 do not fit the call's GPU (fp32 at
  // K = V = 128: the per-chunk kernel plans 252 KB at 32, 191 at 16, against an H100/H200 block's 227).
  // The gated form in fp32 above V = 64 proposes 16 alone: at K = 64, V = 128 its kernels fit at 32 but
  // the training pair ran 1.35x slower there (docs/ops/delta_rule.md, "Measured", session 18).
  const bool gated_wide_f32 = gated && opts.dtype == DType::f32 && padded_head_dim(V) > 64;
  return first_fitting<int>(
      gated_wide_f32 ? std::vector<int>{16} : std::vector<int>{32, 16},
      [&](const int& chunk) {
        return bwd_kernels(bwd_defaults(opts, gated, K, V, heads, chunk), /*saved=*/false);
      },
      opts);
}

TuningKeys delta_rule_bwd_tuning_keys() {
  return merge_tuning_keys(
      {chunked_schema().tuning(), {tokenwise_key("--backward: 1 = the token-by-token reference form")}});
}

OpPlan plan_delta_rule_chunked_bwd(bool gated, const TensorMap& inputs, const OpOptions& opts,
                                   const std::vector<std::string>& wanted) {
  const char* name = gated ? "gated_delta_rule" : "delta_rule";
  SequenceLayout seq = check_qkv_inputs(name, inputs);
  if (gated) check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H});
  check_shape("beta", inputs.at("beta"), {seq.B, seq.T, seq.H});
  check_shape("do", inputs.at("do"), {seq.B, seq.T, seq.H, seq.V});
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});
  const bool has_dht = inputs.count("dfinal_state") > 0;
  if (has_dht) check_shape("dfinal_state", inputs.at("dfinal_state"), {seq.N, seq.H, seq.K, seq.V});
  check_config_keys(fmt::format("{} --backward", name), opts, chunked_schema().tuning());

  // Defaults, then --config on top (kwarps and wwarps after: their defaults follow warps and bv).
  const int64_t heads = seq.N * seq.H;
  const int dflt_chunk = delta_bwd_default_chunk(opts, gated, seq.K, seq.V, heads);
  DeltaChunkedBwdConfig cfg =
      bwd_defaults(opts, gated, seq.K, seq.V, heads, checked_chunk_size(opts.chunk_size, dflt_chunk));
  chunked_schema().apply(opts, cfg);
  cfg.keys_warps = static_cast<int>(kwarps_key().value(opts, cfg.num_warps));
  cfg.block_v = std::min(cfg.block_v, cfg.full_v);
  cfg.walk_warps = static_cast<int>(wwarps_key().value(opts, default_walk_warps(cfg)));
  cfg.chunk_v = std::min(cfg.chunk_v, cfg.full_v);
  if (cfg.full_v % cfg.chunk_v != 0)
    throw UserError(fmt::format("{} --backward: --config cv={} does not divide the padded value dim {}", name,
                                cfg.chunk_v, cfg.full_v));
  cfg.chunk_k = std::min(cfg.chunk_k, cfg.block_k);
  if (cfg.block_k % cfg.chunk_k != 0)
    throw UserError(fmt::format("{} --backward: --config ck={} does not divide the padded key dim {}", name,
                                cfg.chunk_k, cfg.block_k));
  // What the forward saved for the backward (all of saved_w, saved_t, saved_h, saved_v_new, or none): the
  // UT transform's W and T, the state before each chunk and V_new. With them the backward skips its
  // recomputing kernels (delta_rule_wy, the state walk) and runs at the forward's chunk.
  std::vector<std::string> saved_names;
  size_t saved_count = 0;
  for (const auto& t : delta_saved_tensors()) {
    saved_names.push_back(t.name);
    saved_count += inputs.count(t.name);
  }
  const bool saved = saved_count == saved_names.size();
  if (saved_count > 0 && !saved)
    throw UserError(fmt::format("{} --backward: give all of {} (the forward's, with -o) or none of them", name,
                                fmt::join(saved_names, ", ")));
  if (saved) {
    const HostTensor& t_saved = inputs.at("saved_t");
    if (t_saved.rank() != 4 || (t_saved.shape[3] != 16 && t_saved.shape[3] != 32 && t_saved.shape[3] != 64))
      throw UserError(fmt::format("{} --backward: saved_t has shape {}, expected [B,T,H,chunk] with chunk 16, 32 "
                                  "or 64 (the forward's chunk)", name, t_saved.shape_str()));
    const int saved_chunk = static_cast<int>(t_saved.shape[3]);
    if ((opts.chunk_size || bwd_chunk_key().asked(opts)) && cfg.chunk != saved_chunk)
      throw UserError(fmt::format("{} --backward: chunk {} asked for, but the saved tensors are in chunks of {}", name,
                                  cfg.chunk, saved_chunk));
    if (saved_chunk > dflt_chunk && dflt_chunk == 16)
      throw UserError(fmt::format("{} --backward: the saved tensors are in chunks of {}; in fp32 above head dim 64 the "
                                  "backward needs chunks of 16 (run the forward with --chunk-size 16)", name, saved_chunk));
    cfg.chunk = saved_chunk;
  }
  cfg.initial_state = has_h0;
  cfg.final_state_grad = has_dht;
  cfg.initial_state_grad = wants(wanted, "dinitial_state");
  cfg.varlen = seq.varlen;
  // A warpgroup of its own filling the state walks' TMA rings (producer warps) in 16 bits, where their
  // rings take them, as the forward's walk (docs/hopper.md, "Session 33").
  default_producer_warps(cfg, &DeltaChunkedBwdConfig::walk_producer_warps, [](const DeltaChunkedBwdConfig& c) {
    return std::vector<std::shared_ptr<ir::Kernel>>{cached(c, DeltaBwdKernel::states),
                                                    cached(c, DeltaBwdKernel::dstates)};
  }, opts);
  const int64_t BT = cfg.chunk;
  const int64_t v_blocks = (seq.V + cfg.block_v - 1) / cfg.block_v;

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {"beta", "g", "initial_state", "dfinal_state"});
  if (gated) plan.tensors["dg"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
  HostTensor offsets, indices;
  const int64_t chunks = chunk_tables(seq, BT, &offsets, &indices);
  plan.tensors["chunk_offsets"] = offsets;
  if (seq.varlen) plan.tensors["chunk_indices"] = indices;
  if (gated) add_chunk_gate_sums(plan, seq, cfg.chunk);  // for the two walks
  // W, T, the states before each chunk ([chunks, H, K, V]) and Vn: the forward's when saved, else
  // recomputed into scratch (with U) by delta_rule_wy and the state walk. Scratch: the state gradients
  // after each chunk and dVn.
  const std::vector<int64_t> w_shape{seq.B, seq.T, seq.H, seq.K}, t_shape{seq.B, seq.T, seq.H, BT},
      h_shape{std::max<int64_t>(chunks, 1), seq.H, seq.K, seq.V}, vn_shape{seq.B, seq.T, seq.H, seq.V};
  if (saved) {
    const std::map<std::string, std::vector<int64_t>> shapes{
        {"w", w_shape}, {"t_mat", t_shape}, {"h", h_shape}, {"v_new", vn_shape}};
    for (const auto& t : delta_saved_tensors()) {
      check_shape(t.name, inputs.at(t.name), shapes.at(t.tensor));
      plan.tensors[t.tensor] = inputs.at(t.name).cast(cfg.dtype);
    }
  } else {
    plan.tensors["w"] = HostTensor::zeros(cfg.dtype, w_shape);
    const DeltaRuleConfig wy = wy_config(cfg);
    plan.tensors["u"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, int64_t{wy.v_blocks} * wy.wy_block_v});
    plan.tensors["t_mat"] = HostTensor::zeros(cfg.dtype, t_shape);
    plan.tensors["h"] = HostTensor::zeros(cfg.dtype, h_shape);
    plan.tensors["v_new"] = HostTensor::zeros(cfg.dtype, vn_shape);
  }
  plan.tensors["dh"] = HostTensor::zeros(cfg.dtype, {std::max<int64_t>(chunks, 1), seq.H, seq.K, seq.V});
  plan.tensors["dv_new"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dq"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dbeta"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
  if (cfg.initial_state_grad) plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});

  const int64_t key_blocks = cfg.block_k / cfg.chunk_k;
  if (chunks > 0 && key_blocks > 1) {
    // The per-chunk work in key blocks (build_delta_bwd_chunk_keys): O(T*K) scratch between the two.
    plan.tensors["dk_out"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.K});
    plan.tensors["dw"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
    if (gated) {
      plan.tensors["dqs_q"] = HostTensor::zeros(DType::f32, {key_blocks, seq.B, seq.T, seq.H});
      plan.tensors["vds_k"] = HostTensor::zeros(DType::f32, {key_blocks, seq.B, seq.T, seq.H});
      plan.tensors["ssds"] = HostTensor::zeros(DType::f32, {key_blocks, chunks, seq.H});
    }
  }
  const double scale = attention_scale(opts, seq.K);
  const std::array<int64_t, 3> per_chunk =
      seq.varlen ? std::array<int64_t, 3>{chunks, seq.H, 1} : std::array<int64_t, 3>{(seq.T + BT - 1) / BT, seq.B * seq.H, 1};
  for (DeltaBwdKernel which : bwd_launch_order(cfg, saved)) {
    const bool walks = which == DeltaBwdKernel::states || which == DeltaBwdKernel::dstates;
    if (!walks && chunks == 0) continue;  // the per-chunk kernels have no chunks to run
    std::array<int64_t, 3> grid = walks ? std::array<int64_t, 3>{v_blocks, seq.N * seq.H, 1} : per_chunk;
    if (which == DeltaBwdKernel::chunk_keys) grid[2] = key_blocks;
    plan.launches.push_back(plan_launch(plan, cached(cfg, which), grid, {{"scale", scale}}));
  }
  for (const char* n : {"dq", "dk", "dv", "dbeta", "dg", "dinitial_state"})
    if (wants(wanted, n) && plan.tensors.count(n)) plan.outputs[n] = n;
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> delta_chunked_bwd_kernels(bool gated, const OpOptions& opts) {
  DeltaChunkedBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.gated = gated;
  cfg.block_k = cfg.full_v = 64;
  cfg.block_v = 64;
  cfg.chunk = 32;
  // The per-chunk kernel in one step, on the warps its dtype's defaults give that step.
  for (const ChunkKernelShape& shape : chunk_kernel_shapes(cfg.dtype, /*one_kernel=*/true, cfg.full_v))
    if (shape.chunk_v == cfg.full_v) {
      cfg.num_warps = shape.warps;
      break;
    }
  DeltaChunkedBwdConfig full = cfg;
  // (final_state: the state pass as the forward's split schedule runs it.)
  full.initial_state = full.final_state = full.final_state_grad = full.initial_state_grad = full.varlen = true;
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (const auto* c : {&cfg, &full})
    for (auto which : {DeltaBwdKernel::states, DeltaBwdKernel::dstates, DeltaBwdKernel::chunk})
      out.push_back(cached(*c, which));
  // The per-chunk kernel in value-column steps, prefetched, on 4 warps (its 16-bit default up to head dim 128).
  DeltaChunkedBwdConfig stepped = cfg;
  stepped.full_v = 128;
  stepped.chunk_v = 32;
  stepped.num_warps = 4;
  stepped.step_stages = 2;
  out.push_back(cached(stepped, DeltaBwdKernel::chunk));
  // ... and in key blocks (as head dims over 128 run it), with every option.
  DeltaChunkedBwdConfig keyed = full;
  keyed.block_k = keyed.full_v = 128;
  keyed.chunk_v = keyed.chunk_k = 64;
  for (auto which : {DeltaBwdKernel::chunk_keys, DeltaBwdKernel::chunk_ut}) out.push_back(cached(keyed, which));
  return out;
}


namespace {

/// The token-by-token form's configuration (bwd_tokenwise.h): nothing tuned (it takes no --config).
const ConfigSchema<DeltaBwdConfig>& tokenwise_schema() {
  using C = DeltaBwdConfig;
  static const ConfigSchema<C> schema(field<&C::dtype>(), field<&C::block_k>(), field<&C::block_v>(),
                                      field<&C::gated>(), field<&C::initial_state>(), field<&C::final_state_grad>(),
                                      field<&C::initial_state_grad>(), field<&C::varlen>());
  return schema;
}

std::shared_ptr<ir::Kernel> cached_delta_bwd(const DeltaBwdConfig& cfg, bool forward) {
  static KernelMemo memo;
  return memo.get(tokenwise_schema().key(cfg, forward),
                  [&] { return forward ? build_delta_bwd_forward(cfg) : build_delta_bwd_reverse(cfg); });
}

/// --l2norm-qk: the backward of the normalized q and k (`plan`, made as if the inputs were normalized)
/// between a normalization of the inputs and the normalization's backward on dq and dk.
OpPlan with_l2norm_qk(OpPlan plan) {
  std::vector<KernelLaunch> before;
  for (const std::string name : {"q", "k"}) {
    HostTensor& t = plan.tensors.at(name);
    plan.tensors[name + "_raw"] = t;  // the caller's input
    t.input.clear();                  // the normalized copy: scratch
    before.push_back(l2norm_rows_launch(plan, name + "_raw", name, kDeltaL2NormEps));
  }
  plan.launches.insert(plan.launches.begin(), before.begin(), before.end());
  for (const std::string name : {"q", "k"})
    if (plan.tensors.count("d" + name))
      plan.launches.push_back(l2norm_rows_bwd_launch(plan, name + "_raw", "d" + name, kDeltaL2NormEps));
  return plan;
}

}  // namespace

OpPlan plan_delta_rule_bwd(bool gated, const TensorMap& inputs, const OpOptions& opts,
                           const std::vector<std::string>& wanted) {
  const char* name = gated ? "gated_delta_rule" : "delta_rule";
  if (opts.recurrent) throw UserError(fmt::format("{}: --backward is not implemented with --recurrent", name));
  if (opts.l2norm_qk) {
    if (inputs.count("saved_w"))
      throw UserError(fmt::format("{}: saved_* tensors are not taken with --l2norm-qk (the forward does not save "
                                  "them then)", name));
    OpOptions normalized = opts;
    normalized.l2norm_qk = false;
    return with_l2norm_qk(plan_delta_rule_bwd(gated, inputs, normalized, wanted));
  }
  // In chunks unless --config tokenwise=1 asks for the token-by-token reference form.
  OpOptions rest = opts;
  const bool tokenwise = take_tokenwise(rest);
  if (tokenwise && (opts.chunk_size || !rest.config.empty()))
    throw UserError(fmt::format("{} --backward --config tokenwise=1 runs token by token: no other --config or "
                                "--chunk-size applies", name));
  SequenceLayout seq = check_qkv_inputs(name, inputs);
  if (!inputs.count("beta")) throw UserError(fmt::format("{}: missing input 'beta'", name));
  check_shape("beta", inputs.at("beta"), {seq.B, seq.T, seq.H});
  if (gated) {
    if (!inputs.count("g")) throw UserError(fmt::format("{}: missing input 'g'", name));
    check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H});
  }
  if (!inputs.count("do")) throw UserError(fmt::format("{} --backward: missing input 'do' (dL/do, [B,T,H,V])", name));
  check_shape("do", inputs.at("do"), {seq.B, seq.T, seq.H, seq.V});
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});
  const bool has_dht = inputs.count("dfinal_state") > 0;
  if (has_dht) check_shape("dfinal_state", inputs.at("dfinal_state"), {seq.N, seq.H, seq.K, seq.V});
  for (const auto& w : wanted)
    if (w != "dq" && w != "dk" && w != "dv" && w != "dbeta" && !(gated && w == "dg") && w != "dinitial_state")
      throw UserError(fmt::format("{} --backward produces dq, dk, dv, dbeta{} and dinitial_state, not '{}'", name,
                                  gated ? ", dg" : "", w));
  if (!tokenwise) return plan_delta_rule_chunked_bwd(gated, inputs, rest, wanted);

  DeltaBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(seq.K);
  cfg.block_v = padded_head_dim(seq.V);
  cfg.gated = gated;
  cfg.initial_state = has_h0;
  cfg.final_state_grad = has_dht;
  cfg.initial_state_grad = wants(wanted, "dinitial_state");
  cfg.varlen = seq.varlen;
  const int64_t longest = seq.longest_sequence();

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {"beta", "g", "initial_state", "dfinal_state"});
  plan.tensors["checkpoints"] =
      HostTensor::zeros(DType::f32, {seq.N, seq.H, std::max<int64_t>(1, (longest + kDeltaBwdCheckpointTokens - 1) / kDeltaBwdCheckpointTokens), seq.K, seq.V});
  plan.tensors["scratch"] = HostTensor::zeros(DType::f32, {seq.N * seq.H, kDeltaBwdCheckpointTokens, seq.K, seq.V});
  plan.tensors["dq"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dbeta"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
  if (gated) plan.tensors["dg"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
  if (cfg.initial_state_grad) plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});

  const double scale = attention_scale(opts, seq.K);
  const std::array<int64_t, 3> grid = {seq.N * seq.H, 1, 1};
  plan.launches.push_back(plan_launch(plan, cached_delta_bwd(cfg, true), grid,
                                      {"q", "k", "v", "beta", "g", "do", "initial_state", "cu_seqlens", "checkpoints",
                                       "dq"},
                                      {{"scale", scale}}));
  plan.launches.push_back(plan_launch(plan, cached_delta_bwd(cfg, false), grid,
                                      {"q", "k", "v", "beta", "g", "do", "dfinal_state", "cu_seqlens", "checkpoints",
                                       "scratch", "dk", "dv", "dbeta", "dg", "dinitial_state"},
                                      {{"scale", scale}}));
  for (const char* n : {"dq", "dk", "dv", "dbeta", "dg", "dinitial_state"})
    if (wants(wanted, n) && plan.tensors.count(n)) plan.outputs[n] = n;
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> delta_rule_bwd_kernels(bool gated, const OpOptions& opts) {
  std::vector<std::shared_ptr<ir::Kernel>> out = delta_chunked_bwd_kernels(gated, opts);
  DeltaBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.gated = gated;
  cfg.initial_state = cfg.final_state_grad = cfg.initial_state_grad = true;
  out.push_back(cached_delta_bwd(cfg, true));
  out.push_back(cached_delta_bwd(cfg, false));
  OpPlan rows;  // --l2norm-qk's normalization and its backward
  rows.tensors["x"] = rows.tensors["y"] = HostTensor::zeros(opts.dtype, {1, 1, 1, 128});
  out.push_back(l2norm_rows_launch(rows, "x", "y", kDeltaL2NormEps).kernel);
  out.push_back(l2norm_rows_bwd_launch(rows, "x", "y", kDeltaL2NormEps).kernel);
  return out;
}

}  // namespace linac
