#include "kernels/common/recurrent_op.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "kernels/common/op_support.h"
#include "linac/error.h"

namespace linac {

namespace {

/// The token-by-token kernel's configuration (recurrent.h): bv and warps are tuned.
const ConfigSchema<RecurrentConfig>& recurrent_schema() {
  using C = RecurrentConfig;
  static const ConfigSchema<C> schema(field<&C::dtype>(), field<&C::block_k>(), tuned<&C::block_v>(bv_key()),
                                      field<&C::gate>(), field<&C::initial_state>(), field<&C::final_state>(),
                                      field<&C::varlen>(), tuned<&C::num_warps>(warps_key()));
  return schema;
}

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_recurrent_fwd(const RecurrentConfig& cfg) {
  static KernelMemo memo;
  return memo.get(recurrent_schema().key(cfg), [&] { return build_recurrent_fwd(cfg); });
}

/// dtype, tiles and warps for head dims K and V (opts.config's bv and warps override the defaults).
RecurrentConfig recurrent_config(const OpOptions& opts, int64_t K, int64_t V) {
  RecurrentConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(K);
  // S lives in registers: at most 8192 fp32 elements per program (64 per thread at 4 warps); narrow
  // value blocks also mean more programs for the few sequences of a decode step.
  cfg.block_v = std::min(padded_head_dim(V), 64);
  while (cfg.block_v > 16 && cfg.block_k * cfg.block_v > 8192) cfg.block_v /= 2;
  cfg.num_warps = 4;
  recurrent_schema().apply(opts, cfg);
  return cfg;
}

}  // namespace

OpPlan plan_recurrent(const std::string& op, RecurrentGate gate, bool gate_required, const TuningKeys& config_keys,
                      const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
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
  add_forward_tensors(plan, inputs, seq, cfg.dtype, cfg.final_state);
  plan.launches.push_back(plan_launch(plan, cached_recurrent_fwd(cfg),
                                      {(seq.V + cfg.block_v - 1) / cfg.block_v, seq.N * seq.H, 1},
                                      {{"scale", attention_scale(opts, seq.K)}}));
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
