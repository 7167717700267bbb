#include "kernels/linear_attn/normalized.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <mutex>

#include "kernels/common/log_decay.h"
#include "kernels/common/op_support.h"
#include "kernels/common/sequence_bounds.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

// The fused-chunk schedule of linear_attn_fwd with the normalizer z [BK] carried beside S. Per chunk,
// with b the chunk-local cumulative log-decay (zeros without a gate) and A = (scale Q K^T) .* exp(b_r - b_c) .* M:
//   num = scale (exp(b) .* Q) S + A V           den = scale exp(b) .* (Q z) + rowsum(A) + eps
//   S   = exp(b_C) S + (exp(b_C - b) .* K)^T V  z   = exp(b_C) z + colsum(exp(b_C - b) .* K)
std::shared_ptr<ir::Kernel> build_linear_attn_normalized_fwd(const LinearAttnNormalizedConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("linear_attn_normalized_fwd");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor g = cfg.gated ? kb.tensor("g", f32, 3) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq_rows = sequence_bounds(q, cu, cfg.varlen, i_n);
  const Tile b = seq_rows.b, bos = seq_rows.bos, eos = seq_rows.eos;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;

  Tile S = zeros({BK, BV}, f32);
  Tile z = zeros({BK}, f32);
  Tile causal = expand_dims(iota(BT), 1) >= expand_dims(iota(BT), 0);
  AccessOptions in_seq{.limits = {{1, eos}}};

  for_range(0, num_chunks, [&](Tile i) {
    Tile t0 = bos + i * BT;
    Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile A = where(causal, dot(Q, K.T()) * scale, 0.0f);
    Tile Qz = sum(Q.to(f32) * expand_dims(z, 0), 1);
    Tile O, den_inter;
    if (cfg.gated) {
      // Rows past the sequence end load g = 0, so b stops growing there and b_C = b at the last row.
      // Gates of -inf are floored (kernels/common/log_decay.h): b_r - b_c would be -inf - -inf.
      Tile gc = floor_log_decay(load(g, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq));
      Tile bg = cumsum(gc, 0);
      Tile b_last = sum(gc, 0);
      Tile br = expand_dims(bg, 1), bc = expand_dims(bg, 0);
      // Exponentiate only where r >= c: the upper triangle would overflow.
      A = A * exp(where(causal, br - bc, 0.0f));
      Tile inter = exp(bg) * scale;
      O = dot(Q, S.to(dt)) * expand_dims(inter, 1);
      den_inter = Qz * inter;
      Tile K_decayed = K.to(f32) * expand_dims(exp(b_last - bg), 1);
      S = S * exp(b_last) + dot(K_decayed.to(dt).T(), V);
      z = z * exp(b_last) + sum(K_decayed, 0);
    } else {
      O = dot(Q, S.to(dt)) * scale;
      den_inter = Qz * scale;
      S = S + dot(K.T(), V);
      z = z + sum(K.to(f32), 0);
    }
    O = O + dot(A.to(dt), V);
    Tile den = den_inter + sum(A, 1) + kNormalizedLinearAttnEps;
    store(o, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, (O / expand_dims(den, 1)).to(dt), in_seq);
  }, S, z);
  return kb.finish();
}

namespace {

// The tuning parameters of linear_attn (its non-normalized kernel takes the same).
const std::vector<std::pair<std::string, std::string>>& normalized_config_keys() { return chunked_config_keys(); }

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_normalized_fwd(const LinearAttnNormalizedConfig& cfg) {
  static KernelMemo memo;
  std::string key = fmt::format("{}/{}/{}/{}/{}{}/{}/{}", dtype_name(cfg.dtype), cfg.chunk, cfg.block_k, cfg.block_v,
                                cfg.gated, cfg.varlen, cfg.num_warps, cfg.num_stages);
  return memo.get(key, [&] { return build_linear_attn_normalized_fwd(cfg); });
}

/// The configuration for the given head dims and `heads` = sequences x heads (0: unknown); opts.config and
/// --chunk-size override the defaults.
LinearAttnNormalizedConfig normalized_config(const OpOptions& opts, int64_t K, int64_t V, int64_t heads) {
  check_config_keys("linear_attn", opts, normalized_config_keys());
  LinearAttnNormalizedConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(K);
  // Until the normalized form is tuned on its own, the defaults are what ptxas assembles without
  // spills for sm_80 and sm_90a in every dtype (tests/python/test_ptxas.py): z and the row sums cost
  // registers that linear_attn's 64-row chunks with 4 warps do not have. fp32 above head dim 128:
  // chunk 16 (259 KB of shared memory at 32 with K = 256; 164 KB at 16).
  // In 16-bit with 128-column value blocks filling the GPU (as linear_attn's forward chooses them),
  // chunk 64 with whole 128-column blocks and 8 warps: H200, B8 T4096 H16 D128 bf16, 0.707 -> 0.536 ms
  // (ptxas spills 64 bytes at 255 registers there, sm_90a; measured faster anyway). At B2 T16384 H16
  // the defaults below were within 1% of the best of 7 configurations (1.396 ms).
  const bool wide = opts.dtype != DType::f32 && K <= 128 && V > 64 && heads * ((V + 127) / 128) >= 120;
  const int dflt_chunk = wide ? 64 : opts.dtype == DType::f32 && cfg.block_k > 128 ? 16 : 32;
  cfg.chunk = static_cast<int>(config_value(opts, "chunk", checked_chunk_size(opts.chunk_size, dflt_chunk), {16, 32, 64, 128}));
  cfg.block_v = static_cast<int>(
      config_value(opts, "bv", wide ? 128 : std::min(64, padded_head_dim(V)), {16, 32, 64, 128, 256}));
  cfg.num_warps = static_cast<int>(config_value(opts, "warps", 8, {2, 4, 8}));
  cfg.num_stages = static_cast<int>(config_value(opts, "stages", 2, {1, 2}));
  return cfg;
}

}  // namespace

OpPlan plan_linear_attn_normalized(const TensorMap& inputs, const OpOptions& opts,
                                   const std::vector<std::string>& wanted) {
  SequenceLayout seq = check_qkv_inputs("linear_attn", inputs);
  if (opts.recurrent) throw UserError("linear_attn: --normalize has no --recurrent form");
  if (inputs.count("initial_state"))
    throw UserError("linear_attn --normalize takes no initial_state (the normalizer state would be needed too)");
  if (wants(wanted, "final_state"))
    throw UserError("linear_attn --normalize gives no final_state (the normalizer state would be needed too)");
  const bool gated = inputs.count("g") > 0;
  if (gated) check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H});

  LinearAttnNormalizedConfig cfg = normalized_config(opts, seq.K, seq.V, seq.N * seq.H);
  cfg.gated = gated;
  cfg.varlen = seq.varlen;

  OpPlan plan;
  for (const char* name : {"q", "k", "v"}) plan.tensors[name] = inputs.at(name).cast(cfg.dtype);
  plan.tensors["o"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  KernelLaunch launch;
  launch.kernel = cached_normalized_fwd(cfg);
  launch.grid = {(seq.V + cfg.block_v - 1) / cfg.block_v, seq.N * seq.H, 1};
  for (const char* name : {"q", "k", "v", "o"}) launch.tensors[name] = name;
  launch.scalars["scale"] = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));
  if (gated) plan.tensors["g"] = inputs.at("g").cast(DType::f32), launch.tensors["g"] = "g";
  if (seq.varlen) plan.tensors["cu_seqlens"] = seq.cu_seqlens, launch.tensors["cu_seqlens"] = "cu_seqlens";
  plan.launches.push_back(std::move(launch));
  if (wants(wanted, "o")) plan.outputs["o"] = "o";
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> linear_attn_normalized_kernels(const OpOptions& opts) {
  LinearAttnNormalizedConfig cfg = normalized_config(opts, 64, 64, 0);
  LinearAttnNormalizedConfig gated = cfg;
  gated.gated = gated.varlen = true;
  return {cached_normalized_fwd(cfg), cached_normalized_fwd(gated)};
}

}  // namespace linac
