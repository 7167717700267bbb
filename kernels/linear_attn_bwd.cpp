#include "kernels/linear_attn_bwd.h"

#include <cmath>
#include <fmt/format.h>
#include <map>
#include <mutex>

#include "kernels/op_support.h"
#include "kernels/sequence_bounds.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

// Notation (one sequence, one head): S_t = a_t S_{t-1} + k_t^T v_t, a_t = exp(g_t), o_t = scale q_t S_t,
// dH_t = dL/dS_t = scale q_t^T do_t + a_{t+1} dH_{t+1}, seeded by dS_T = dfinal_state. Then
//   dq_t = scale do_t S_t^T,  dk_t = v_t dH_t^T,  dv_t = k_t dH_t,  dinitial_state = a_1 dH_1,
//   dg_t = sum_{s>=t} (q_s.dq_s - k_s.dk_s) + <dfinal_state, S_T>   (= a_t <dH_t, S_{t-1}>).
// Per chunk, b is the chunk-local cumulative log-decay (zeros without a gate), b_C its last row.

std::shared_ptr<ir::Kernel> build_linear_attn_bwd_dq(const LinearAttnBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype;
  KernelBuilder kb("linear_attn_bwd_dq");
  kb.set_num_warps(cfg.num_warps);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor g = cfg.gated ? kb.tensor("g", DType::f32, 3) : Tensor();
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", DType::f32, 4) : Tensor();
  const bool state_term = cfg.gated && cfg.final_state_grad;
  Tensor dht = state_term ? kb.tensor("dfinal_state", DType::f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dq = kb.tensor("dq", dt, 4);
  Tensor dg = cfg.gated ? kb.tensor("dg", DType::f32, 3) : Tensor();
  Tensor dg_state = state_term ? kb.tensor("dg_state", DType::f32, 2) : Tensor();
  Tile scale = kb.scalar("scale", DType::f32);

  Tile i_nh = program_id(0);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq_rows = sequence_bounds(q, cu, cfg.varlen, i_n);
  const Tile b = seq_rows.b, bos = seq_rows.bos, eos = seq_rows.eos;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;

  Tile S = zeros({BK, BV}, DType::f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});

  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile causal = row >= col;
  AccessOptions in_seq{.limits = {{1, eos}}};

  // dQ = scale * (exp(b) .* (dO S^T) + ((dO V^T) .* exp(b_r - b_c) .* M) K)
  for_range(0, num_chunks, [&](Tile i) {
    Tile t0 = bos + i * BT;
    Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile V = load(v, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile dO = load(dout, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile A = where(causal, dot(dO, V.T()) * scale, 0.0f);
    Tile dQ;
    if (cfg.gated) {
      Tile gc = load(g, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq);
      Tile bg = cumsum(gc, 0);
      Tile b_last = sum(gc, 0);
      Tile br = expand_dims(bg, 1), bc = expand_dims(bg, 0);
      A = A * exp(where(causal, br - bc, 0.0f));
      dQ = dot(dO, S.T().to(dt)) * (exp(br) * scale);
      Tile K_decayed = (K.to(DType::f32) * expand_dims(exp(b_last - bg), 1)).to(dt);
      S = S * exp(b_last) + dot(K_decayed.T(), V);
    } else {
      dQ = dot(dO, S.T().to(dt)) * scale;
      S = S + dot(K.T(), V);
    }
    dQ = dQ + dot(A.to(dt), K);
    store(dq, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, dQ.to(dt), in_seq);
    // The first half of dg's per-token term, q.dq, in fp32 before dq is rounded.
    if (cfg.gated) store(dg, {b, t0, i_h}, {kIndex, BT, kIndex}, sum(Q.to(DType::f32) * dQ, 1), in_seq);
  }, S);

  if (state_term) {
    Tile dS = load(dht, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
    store(dg_state, {i_n, i_h}, {kIndex, kIndex}, sum(sum(dS * S, 1), 0));
  }
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_linear_attn_bwd_dkv(const LinearAttnBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype;
  KernelBuilder kb("linear_attn_bwd_dkv");
  kb.set_num_warps(cfg.num_warps);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor g = cfg.gated ? kb.tensor("g", DType::f32, 3) : Tensor();
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", DType::f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  const bool state_term = cfg.gated && cfg.final_state_grad;
  Tensor dg_state = state_term ? kb.tensor("dg_state", DType::f32, 2) : Tensor();
  Tensor dk = kb.tensor("dk", dt, 4);
  Tensor dv = kb.tensor("dv", dt, 4);
  Tensor dg = cfg.gated ? kb.tensor("dg", DType::f32, 3) : Tensor();
  Tensor dh0 = cfg.initial_state_grad ? kb.tensor("dinitial_state", DType::f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", DType::f32);

  Tile i_nh = program_id(0);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq_rows = sequence_bounds(q, cu, cfg.varlen, i_n);
  const Tile b = seq_rows.b, bos = seq_rows.bos, eos = seq_rows.eos;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;

  // E: dL/dS at the end of the chunk being processed, through everything after it.
  Tile E = zeros({BK, BV}, DType::f32);
  if (cfg.final_state_grad) E = load(dht, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV});
  // dg_t's suffix sum over later chunks, started at the final-state term.
  Tile dg_acc = constant(0.0, DType::f32);
  if (state_term) dg_acc = load(dg_state, {i_n, i_h}, {kIndex, kIndex});

  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile anticausal = row <= col;  // token r receives from tokens s >= r
  AccessOptions in_seq{.limits = {{1, eos}}};

  // dK = exp(b_C - b) .* (V E^T) + scale * ((V dO^T) .* exp(b_s - b_r) .* M^T) Q
  // dV = exp(b_C - b) .* (K E)   + scale * ((K Q^T)  .* exp(b_s - b_r) .* M^T) dO
  // E  <- exp(b_C) E + scale * (exp(b) .* Q)^T dO
  for_range(0, num_chunks, [&](Tile j) {
    Tile i = num_chunks - 1 - j;
    Tile t0 = bos + i * BT;
    Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile V = load(v, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile dO = load(dout, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile Adk = where(anticausal, dot(V, dO.T()) * scale, 0.0f);
    Tile Adv = where(anticausal, dot(K, Q.T()) * scale, 0.0f);
    Tile dK, dV;
    if (cfg.gated) {
      // Rows past the sequence end load g = 0, so b_C = b at the last valid row.
      Tile gc = load(g, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq);
      Tile bg = cumsum(gc, 0);
      Tile b_last = sum(gc, 0);
      Tile br = expand_dims(bg, 1), bc = expand_dims(bg, 0);
      Tile decay = exp(where(anticausal, bc - br, 0.0f));
      Adk = Adk * decay;
      Adv = Adv * decay;
      Tile to_end = expand_dims(exp(b_last - bg), 1);
      dK = dot(V, E.T().to(dt)) * to_end;
      dV = dot(K, E.to(dt)) * to_end;
      Tile Q_decayed = (Q.to(DType::f32) * expand_dims(exp(bg) * scale, 1)).to(dt);
      E = E * exp(b_last) + dot(Q_decayed.T(), dO);
    } else {
      dK = dot(V, E.T().to(dt));
      dV = dot(K, E.to(dt));
      E = E + dot(Q.T(), dO) * scale;
    }
    dK = dK + dot(Adk.to(dt), Q);
    dV = dV + dot(Adv.to(dt), dO);
    store(dk, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, dK.to(dt), in_seq);
    store(dv, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BV}, dV.to(dt), in_seq);
    if (cfg.gated) {
      // dg holds q.dq from the dq kernel; rows past the end read 0 and contribute nothing.
      Tile x = load(dg, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq) - sum(K.to(DType::f32) * dK, 1);
      store(dg, {b, t0, i_h}, {kIndex, BT, kIndex}, cumsum(x, 0, true) + dg_acc, in_seq);
      dg_acc = dg_acc + sum(x, 0);
    }
  }, E, dg_acc);

  if (cfg.initial_state_grad) store(dh0, {i_n, i_h, 0, 0}, {kIndex, kIndex, BK, BV}, E);
  return kb.finish();
}

namespace {

/// Chunks of 64 rows, 32 past head dims of 64: at 128 the dq kernel's shared memory at 64 rows
/// (241664 bytes) exceeds an H200's 232448.
int default_bwd_chunk(int64_t block_k, int64_t block_v) { return std::max(block_k, block_v) > 64 ? 32 : 64; }

std::shared_ptr<ir::Kernel> cached_bwd(const LinearAttnBwdConfig& cfg, bool dq_kernel) {
  static KernelMemo memo;
  std::string key = fmt::format("{}/{}/{}/{}/{}/{}{}{}{}{}/{}", dq_kernel, dtype_name(cfg.dtype), cfg.chunk,
                                cfg.block_k, cfg.block_v, cfg.gated, cfg.initial_state, cfg.final_state_grad,
                                cfg.initial_state_grad, cfg.varlen, cfg.num_warps);
  return memo.get(key, [&] { return dq_kernel ? build_linear_attn_bwd_dq(cfg) : build_linear_attn_bwd_dkv(cfg); });
}

const std::vector<std::pair<std::string, std::string>>& bwd_config_keys() { return chunked_config_keys(); }

}  // namespace

OpPlan plan_linear_attn_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  if (opts.normalize || opts.recurrent)
    throw UserError("linear_attn: --backward is not implemented with --normalize or --recurrent");
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

  check_config_keys("linear_attn", opts, bwd_config_keys());
  LinearAttnBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(seq.K);
  cfg.block_v = padded_head_dim(seq.V);  // one program covers all of V: dq and dk sum over it
  cfg.chunk = checked_chunk_size(opts.chunk_size, default_bwd_chunk(cfg.block_k, cfg.block_v));
  cfg.chunk = static_cast<int>(config_value(opts, "chunk", cfg.chunk, {16, 32, 64, 128}));
  cfg.num_warps = static_cast<int>(config_value(opts, "warps", 8, {2, 4, 8}));
  cfg.gated = gated;
  cfg.initial_state = has_h0;
  cfg.final_state_grad = has_dht;
  cfg.initial_state_grad = wants(wanted, "dinitial_state");
  cfg.varlen = seq.varlen;
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));

  OpPlan plan;
  for (const char* name : {"q", "k", "v", "do"}) plan.tensors[name] = inputs.at(name).cast(cfg.dtype);
  plan.tensors["dq"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  if (gated) {
    plan.tensors["g"] = inputs.at("g").cast(DType::f32);
    plan.tensors["dg"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
  }
  if (has_h0) plan.tensors["initial_state"] = inputs.at("initial_state").cast(DType::f32);
  if (has_dht) plan.tensors["dfinal_state"] = inputs.at("dfinal_state").cast(DType::f32);
  if (gated && has_dht) plan.tensors["dg_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H});
  if (cfg.initial_state_grad)
    plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});
  if (seq.varlen) plan.tensors["cu_seqlens"] = seq.cu_seqlens;

  auto bind = [&](KernelLaunch& l, std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (plan.tensors.count(n)) l.tensors[n] = n;
  };
  KernelLaunch l1;
  l1.kernel = cached_bwd(cfg, true);
  l1.grid = {seq.N * seq.H, 1, 1};
  bind(l1, {"q", "k", "v", "do", "g", "initial_state", "cu_seqlens", "dq", "dg"});
  if (gated && has_dht) bind(l1, {"dfinal_state", "dg_state"});
  l1.scalars["scale"] = scale;
  KernelLaunch l2;
  l2.kernel = cached_bwd(cfg, false);
  l2.grid = {seq.N * seq.H, 1, 1};
  bind(l2, {"q", "k", "v", "do", "g", "dfinal_state", "cu_seqlens", "dg_state", "dk", "dv", "dg", "dinitial_state"});
  l2.scalars["scale"] = scale;
  plan.launches.push_back(std::move(l1));
  plan.launches.push_back(std::move(l2));
  for (const char* name : {"dq", "dk", "dv", "dg", "dinitial_state"})
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> linear_attn_bwd_kernels(const OpOptions& opts) {
  // Head dim 64, plain and with every option. (At 128 the dkv kernel with gate and both states spills
  // 28-44 bytes at its default chunk of 32, 32 bytes even at 16: it is left out of this zero-spill list
  // like the fp32 kernels; the plain one does not spill.)
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (int d : {64}) {
    LinearAttnBwdConfig cfg;
    cfg.dtype = opts.dtype;
    cfg.block_k = cfg.block_v = d;
    cfg.chunk = static_cast<int>(
        config_value(opts, "chunk", checked_chunk_size(opts.chunk_size, default_bwd_chunk(d, d)), {16, 32, 64, 128}));
    cfg.num_warps = static_cast<int>(config_value(opts, "warps", 8, {2, 4, 8}));
    LinearAttnBwdConfig gated = cfg;
    gated.gated = gated.initial_state = gated.final_state_grad = gated.initial_state_grad = true;
    for (const auto& c : {cfg, gated})
      for (bool dq : {true, false}) out.push_back(cached_bwd(c, dq));
  }
  return out;
}

}  // namespace linac
