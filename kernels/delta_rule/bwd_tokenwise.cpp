#include "kernels/delta_rule/bwd_tokenwise.h"
#include "kernels/delta_rule/bwd.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "kernels/delta_rule/fwd.h"
#include "kernels/common/l2norm.h"
#include "kernels/common/op_support.h"
#include "kernels/common/sequence_bounds.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

namespace {

/// Tokens between checkpoints.
constexpr int64_t kBlock = 16;

struct DeltaBwdConfig {
  DType dtype = DType::f32;
  int block_k = 64, block_v = 64;  // the whole head (dk sums over V, dv and dbeta over K)
  bool gated = false, initial_state = false, final_state_grad = false, initial_state_grad = false, varlen = false;
};

/// Warps per program: the counts at which ptxas keeps each kernel's two or three [K, V] fp32 tiles
/// without spills at K = V = 64 (test_ptxas): 8 spill the forward walk and the gated reverse walk,
/// 4 the plain reverse walk.
int bwd_warps(const DeltaBwdConfig& cfg, bool forward) { return forward || cfg.gated ? 4 : 8; }

/// The loads of token t (zeros past the sequence end, where the update is the identity: beta = 0, g = 0).
struct Token {
  Tile q, k, v, d_o, beta, a;
};

struct DeltaTensors {
  Tensor q, k, v, beta, g, d_o;
};

Token load_token(const DeltaBwdConfig& cfg, const DeltaTensors& x, const SequenceBounds& seq, const Tile& i_h,
                 const Tile& t) {
  const DType f32 = DType::f32;
  AccessOptions in_seq{.limits = {{1, seq.eos}}};
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  Token tok;
  tok.q = load(x.q, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, in_seq).to(f32);
  tok.k = load(x.k, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, in_seq).to(f32);
  tok.v = load(x.v, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}, in_seq).to(f32);
  tok.d_o = load(x.d_o, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}, in_seq).to(f32);
  tok.beta = load(x.beta, {seq.b, t, i_h}, {kIndex, kIndex, kIndex}, in_seq);
  tok.a = cfg.gated ? exp(load(x.g, {seq.b, t, i_h}, {kIndex, kIndex, kIndex}, in_seq)) : constant(1.0, f32);
  return tok;
}

/// S_t from S_{t-1}.
Tile step(const Token& tok, const Tile& S) {
  Tile w = sum(S * expand_dims(tok.k, 1), 0);
  Tile u = tok.v - w * tok.a;
  return S * tok.a + expand_dims(tok.k * tok.beta, 1) * expand_dims(u, 0);
}

DeltaTensors declare_inputs(KernelBuilder& kb, const DeltaBwdConfig& cfg) {
  DeltaTensors x;
  x.q = kb.tensor("q", cfg.dtype, 4);
  x.k = kb.tensor("k", cfg.dtype, 4);
  x.v = kb.tensor("v", cfg.dtype, 4);
  x.beta = kb.tensor("beta", DType::f32, 3);
  if (cfg.gated) x.g = kb.tensor("g", DType::f32, 3);
  x.d_o = kb.tensor("do", cfg.dtype, 4);
  return x;
}

/// Forward walk: dq_t = scale S_t do_t, and the state before every block of 16 tokens.
std::shared_ptr<ir::Kernel> build_delta_bwd_forward(const DeltaBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_bwd_fwd" : "delta_rule_bwd_fwd");
  kb.set_num_warps(bwd_warps(cfg, true));
  kb.set_num_stages(1);
  DeltaTensors x = declare_inputs(kb, cfg);
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor ckpt = kb.tensor("checkpoints", f32, 5);
  Tensor dq = kb.tensor("dq", cfg.dtype, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_nh = program_id(0);
  Tile H = x.q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(x.q, cu, cfg.varlen, i_n);
  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
  Tile blocks = (seq.eos - seq.bos + (kBlock - 1)) / kBlock;
  for_range(0, blocks, [&](Tile c) {
    store(ckpt, {i_n, i_h, c, 0, 0}, {kIndex, kIndex, kIndex, BK, BV}, S);
    for_range(0, kBlock, [&](Tile j) {
      Tile t = seq.bos + c * kBlock + j;
      Token tok = load_token(cfg, x, seq, i_h, t);
      S = step(tok, S);
      store(dq, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, (sum(S * expand_dims(tok.d_o, 0), 1) * scale).to(cfg.dtype),
            AccessOptions{.limits = {{1, seq.eos}}});
    }, S);
  }, S);
  return kb.finish();
}

/// Reverse walk over the blocks: recompute the block's states into scratch, then walk it backwards.
std::shared_ptr<ir::Kernel> build_delta_bwd_reverse(const DeltaBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_bwd_rev" : "delta_rule_bwd_rev");
  kb.set_num_warps(bwd_warps(cfg, false));
  kb.set_num_stages(1);
  DeltaTensors x = declare_inputs(kb, cfg);
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor ckpt = kb.tensor("checkpoints", f32, 5);
  Tensor scratch = kb.tensor("scratch", f32, 4);
  Tensor dk = kb.tensor("dk", dt, 4);
  Tensor dv = kb.tensor("dv", dt, 4);
  Tensor dbeta = kb.tensor("dbeta", f32, 3);
  Tensor dg = cfg.gated ? kb.tensor("dg", f32, 3) : Tensor();
  Tensor dh0 = cfg.initial_state_grad ? kb.tensor("dinitial_state", f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  Tile i_nh = program_id(0);
  Tile H = x.q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(x.q, cu, cfg.varlen, i_n);
  AccessOptions in_seq{.limits = {{1, seq.eos}}};
  Tile dS = zeros({BK, BV}, f32);
  if (cfg.final_state_grad) dS = load(dht, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
  Tile blocks = (seq.eos - seq.bos + (kBlock - 1)) / kBlock;
  for_range(0, blocks, [&](Tile cr) {
    Tile c = blocks - 1 - cr;
    Tile S = load(ckpt, {i_n, i_h, c, 0, 0}, {kIndex, kIndex, kIndex, BK, BV});
    for_range(0, kBlock, [&](Tile j) {
      store(scratch, {i_nh, j, 0, 0}, {kIndex, kIndex, BK, BV}, S);  // S_{t-1} of token j
      S = step(load_token(cfg, x, seq, i_h, seq.bos + c * kBlock + j), S);
    }, S);
    for_range(0, kBlock, [&](Tile jr) {
      Tile j = kBlock - 1 - jr;
      Tile t = seq.bos + c * kBlock + j;
      Token tok = load_token(cfg, x, seq, i_h, t);
      Tile Sp = load(scratch, {i_nh, j, 0, 0}, {kIndex, kIndex, BK, BV});
      dS = dS + expand_dims(tok.q * scale, 1) * expand_dims(tok.d_o, 0);
      Tile w = sum(Sp * expand_dims(tok.k, 1), 0);
      Tile u = tok.v - w * tok.a;
      Tile xk = sum(dS * expand_dims(tok.k, 1), 0);  // dS^T k
      Tile du = xk * tok.beta;
      Tile dkt = sum(dS * expand_dims(u, 0), 1) * tok.beta - sum(Sp * expand_dims(du, 0), 1) * tok.a;
      store(dk, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, dkt.to(dt), in_seq);
      store(dv, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}, du.to(dt), in_seq);
      store(dbeta, {seq.b, t, i_h}, {kIndex, kIndex, kIndex}, sum(xk * u, 0), in_seq);
      if (cfg.gated) {
        Tile da = sum(sum(dS * Sp, 1), 0) - sum(xk * w, 0) * tok.beta;
        store(dg, {seq.b, t, i_h}, {kIndex, kIndex, kIndex}, da * tok.a, in_seq);
      }
      dS = (dS - expand_dims(tok.k, 1) * expand_dims(du, 0)) * tok.a;
    }, dS);
  }, dS);
  if (cfg.initial_state_grad) store(dh0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV}, dS);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> cached_delta_bwd(const DeltaBwdConfig& cfg, bool forward) {
  static KernelMemo memo;
  std::string key = fmt::format("{}/{}/{}/{}/{}{}{}{}{}", forward, dtype_name(cfg.dtype), cfg.block_k, cfg.block_v,
                                cfg.gated, cfg.initial_state, cfg.final_state_grad, cfg.initial_state_grad, cfg.varlen);
  return memo.get(key, [&] { return forward ? build_delta_bwd_forward(cfg) : build_delta_bwd_reverse(cfg); });
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
      HostTensor::zeros(DType::f32, {seq.N, seq.H, std::max<int64_t>(1, (longest + kBlock - 1) / kBlock), seq.K, seq.V});
  plan.tensors["scratch"] = HostTensor::zeros(DType::f32, {seq.N * seq.H, kBlock, seq.K, seq.V});
  plan.tensors["dq"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dbeta"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
  if (gated) plan.tensors["dg"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
  if (cfg.initial_state_grad) plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});

  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));
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
