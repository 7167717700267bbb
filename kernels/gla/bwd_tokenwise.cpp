#include "kernels/gla/bwd_tokenwise.h"
#include "kernels/gla/bwd.h"

#include <cmath>
#include <fmt/format.h>

#include "kernels/common/op_support.h"
#include "kernels/common/sequence_bounds.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

namespace {

struct GlaBwdConfig {
  DType dtype = DType::f32;
  int block_k = 64, block_v = 64;  // the whole head: dq and dk sum over V, dv over K
  bool initial_state = false, final_state_grad = false, initial_state_grad = false, varlen = false;
  int num_warps = 8;
};

/// Forward walk: the states, dq_t = scale S_t do_t, and c = rowsum(dfinal .* S_T) (into dg_final).
std::shared_ptr<ir::Kernel> build_gla_bwd_dq(const GlaBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_bwd_tokenwise_dq");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor d_o = kb.tensor("do", dt, 4);
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dq = kb.tensor("dq", dt, 4);
  Tensor dg_final = cfg.final_state_grad ? kb.tensor("dg_final", f32, 3) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  Tile i_nh = program_id(0);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(q, cu, cfg.varlen, i_n);
  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
  for_range(seq.bos, seq.eos, [&](Tile t) {
    Tile kt = load(k, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile vt = load(v, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile dot_ = load(d_o, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile gt = load(g, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK});
    S = S * expand_dims(exp(gt), 1) + expand_dims(kt, 1) * expand_dims(vt, 0);
    Tile dqt = sum(S * expand_dims(dot_, 0), 1) * scale;
    store(dq, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, dqt.to(dt));
  }, S);
  if (cfg.final_state_grad) {
    Tile dS = load(dht, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
    store(dg_final, {i_n, i_h, 0}, {kIndex, kIndex, BK}, sum(dS * S, 1));
  }
  return kb.finish();
}

/// Reverse walk: dH (dL/dS_t) carried backwards; dk, dv, dg (dq read back) and dinitial_state.
std::shared_ptr<ir::Kernel> build_gla_bwd_dkv(const GlaBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_bwd_tokenwise_dkv");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor d_o = kb.tensor("do", dt, 4);
  Tensor dq = kb.tensor("dq", dt, 4);
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor dg_final = cfg.final_state_grad ? kb.tensor("dg_final", f32, 3) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dk = kb.tensor("dk", dt, 4);
  Tensor dv = kb.tensor("dv", dt, 4);
  Tensor dg = kb.tensor("dg", f32, 4);
  Tensor dh0 = cfg.initial_state_grad ? kb.tensor("dinitial_state", f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  Tile i_nh = program_id(0);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(q, cu, cfg.varlen, i_n);
  Tile dH = zeros({BK, BV}, f32);
  Tile acc = zeros({BK}, f32);  // the suffix sum of q .* dq - k .* dk (+ the final state's term)
  if (cfg.final_state_grad) {
    dH = load(dht, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
    acc = load(dg_final, {i_n, i_h, 0}, {kIndex, kIndex, BK});
  }
  for_range(0, seq.eos - seq.bos, [&](Tile i) {
    Tile t = seq.eos - 1 - i;
    Tile qt = load(q, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile kt = load(k, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile vt = load(v, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile dot_ = load(d_o, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile dqt = load(dq, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile gt = load(g, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK});
    dH = dH + expand_dims(qt * scale, 1) * expand_dims(dot_, 0);
    Tile dkt = sum(dH * expand_dims(vt, 0), 1);
    Tile dvt = sum(dH * expand_dims(kt, 1), 0);
    store(dk, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, dkt.to(dt));
    store(dv, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}, dvt.to(dt));
    acc = acc + qt * dqt - kt * dkt;
    store(dg, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, acc);
    dH = dH * expand_dims(exp(gt), 1);
  }, dH, acc);
  if (cfg.initial_state_grad) store(dh0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV}, dH);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> cached_gla_bwd(const GlaBwdConfig& cfg, bool dq_kernel) {
  static KernelMemo memo;
  std::string key = fmt::format("{}/{}/{}/{}/{}{}{}{}/{}", dq_kernel, dtype_name(cfg.dtype), cfg.block_k, cfg.block_v,
                                cfg.initial_state, cfg.final_state_grad, cfg.initial_state_grad, cfg.varlen,
                                cfg.num_warps);
  return memo.get(key, [&] { return dq_kernel ? build_gla_bwd_dq(cfg) : build_gla_bwd_dkv(cfg); });
}

const std::vector<std::pair<std::string, std::string>>& gla_bwd_config_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {{"warps", "warps per program (2, 4, 8)"}};
  return keys;
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
  check_config_keys("gla --backward", opts, gla_chunked_bwd_config_keys());
  // In chunks unless --config tokenwise=1 asks for the token-by-token reference form.
  OpOptions tw = opts;
  if (!take_tokenwise(tw)) return plan_gla_chunked_bwd(inputs, tw, wanted);
  check_config_keys("gla --backward --config tokenwise=1", tw, gla_bwd_config_keys());
  if (opts.chunk_size) throw UserError("gla --backward --config tokenwise=1 runs token by token: --chunk-size does not apply");

  GlaBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(seq.K);
  cfg.block_v = padded_head_dim(seq.V);
  cfg.num_warps = static_cast<int>(config_value(tw, "warps", 8, {2, 4, 8}));
  cfg.initial_state = has_h0;
  cfg.final_state_grad = has_dht;
  cfg.initial_state_grad = wants(wanted, "dinitial_state");
  cfg.varlen = seq.varlen;
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));

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
