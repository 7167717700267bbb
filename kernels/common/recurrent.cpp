#include "kernels/common/recurrent.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <mutex>

#include "kernels/common/op_support.h"
#include "kernels/common/sequence_bounds.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

std::shared_ptr<ir::Kernel> build_recurrent_fwd(const RecurrentConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gate == RecurrentGate::channel ? "gla_recurrent" : "linear_attn_recurrent");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);  // one-row loads: nothing for cp.async to overlap
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor g;
  if (cfg.gate == RecurrentGate::scalar) g = kb.tensor("g", f32, 3);
  if (cfg.gate == RecurrentGate::channel) g = kb.tensor("g", f32, 4);
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor ht = cfg.final_state ? kb.tensor("final_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq_rows = sequence_bounds(q, cu, cfg.varlen, i_n);
  const Tile b = seq_rows.b, bos = seq_rows.bos, eos = seq_rows.eos;
  Tile v0 = i_v * BV;

  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});

  // Every t in [bos, eos) is in the sequence: only the head dims need masking (by the tensor sizes).
  for_range(bos, eos, [&](Tile t) {
    Tile qt = load(q, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile kt = load(k, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile vt = load(v, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    if (cfg.gate == RecurrentGate::scalar) {
      S = S * exp(load(g, {b, t, i_h}, {kIndex, kIndex, kIndex}));
    } else if (cfg.gate == RecurrentGate::channel) {
      // g <= 0, and channels past K load 0 (their rows of S stay 0 either way).
      S = S * expand_dims(exp(load(g, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK})), 1);
    }
    S = S + expand_dims(kt, 1) * expand_dims(vt, 0);
    Tile ot = sum(expand_dims(qt, 1) * S, 0) * scale;
    store(o, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}, ot.to(dt));
  }, S);

  if (cfg.final_state) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

namespace {

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_recurrent_fwd(const RecurrentConfig& cfg) {
  static KernelMemo memo;
  std::string key = fmt::format("{}/{}/{}/{}/{}{}{}/{}", dtype_name(cfg.dtype), cfg.block_k, cfg.block_v,
                                static_cast<int>(cfg.gate), cfg.initial_state, cfg.final_state, cfg.varlen,
                                cfg.num_warps);
  return memo.get(key, [&] { return build_recurrent_fwd(cfg); });
}

/// dtype, tiles and warps for head dims K and V (opts.config's bv and warps override the defaults).
RecurrentConfig recurrent_config(const OpOptions& opts, int64_t K, int64_t V) {
  RecurrentConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(K);
  // S lives in registers: at most 8192 fp32 elements per program (64 per thread at 4 warps); narrow
  // value blocks also mean more programs for the few sequences of a decode step.
  int64_t bv = std::min<int64_t>(padded_head_dim(V), 64);
  while (bv > 16 && cfg.block_k * bv > 8192) bv /= 2;
  cfg.block_v = static_cast<int>(config_value(opts, "bv", bv, {16, 32, 64, 128, 256}));
  cfg.num_warps = static_cast<int>(config_value(opts, "warps", 4, {2, 4, 8}));
  return cfg;
}

}  // namespace

OpPlan plan_recurrent(const std::string& op, RecurrentGate gate, bool gate_required,
                      const std::vector<std::pair<std::string, std::string>>& config_keys, const TensorMap& inputs,
                      const OpOptions& opts, const std::vector<std::string>& wanted) {
  SequenceLayout seq = check_qkv_inputs(op, inputs);
  const bool gated = inputs.count("g") > 0;
  if (gate_required && !gated) throw UserError(fmt::format("{}: missing input 'g'", op));
  if (gated && gate == RecurrentGate::none) throw UserError(fmt::format("{} takes no input 'g'", op));
  if (gated && gate == RecurrentGate::scalar) check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H});
  if (gated && gate == RecurrentGate::channel) check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H, seq.K});
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});

  check_config_keys(op, opts, config_keys);
  RecurrentConfig cfg = recurrent_config(opts, seq.K, seq.V);
  cfg.gate = gated ? gate : RecurrentGate::none;
  cfg.initial_state = has_h0;
  cfg.final_state = wants(wanted, "final_state");
  cfg.varlen = seq.varlen;

  OpPlan plan;
  for (const char* name : {"q", "k", "v"}) plan.tensors[name] = inputs.at(name).cast(cfg.dtype);
  plan.tensors["o"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  KernelLaunch launch;
  launch.kernel = cached_recurrent_fwd(cfg);
  launch.grid = {(seq.V + cfg.block_v - 1) / cfg.block_v, seq.N * seq.H, 1};
  for (const char* name : {"q", "k", "v", "o"}) launch.tensors[name] = name;
  launch.scalars["scale"] = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));
  if (gated) plan.tensors["g"] = inputs.at("g").cast(DType::f32), launch.tensors["g"] = "g";
  if (has_h0)
    plan.tensors["initial_state"] = inputs.at("initial_state").cast(DType::f32),
    launch.tensors["initial_state"] = "initial_state";
  if (cfg.final_state)
    plan.tensors["final_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V}),
    launch.tensors["final_state"] = "final_state";
  if (seq.varlen) plan.tensors["cu_seqlens"] = seq.cu_seqlens, launch.tensors["cu_seqlens"] = "cu_seqlens";
  plan.launches.push_back(std::move(launch));
  if (wants(wanted, "o")) plan.outputs["o"] = "o";
  if (cfg.final_state) plan.outputs["final_state"] = "final_state";
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> recurrent_kernels(const OpOptions& opts, RecurrentGate gate) {
  RecurrentConfig cfg = recurrent_config(opts, 64, 64);
  cfg.gate = gate;
  cfg.initial_state = cfg.final_state = true;
  return {cached_recurrent_fwd(cfg)};
}

}  // namespace linac
