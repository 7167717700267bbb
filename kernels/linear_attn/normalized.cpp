#include "kernels/linear_attn/normalized.h"

#include "kernels/common/log_decay.h"
#include "kernels/common/prologue.h"
#include "linac/blocks.h"
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
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g = cfg.gated ? kb.tensor("g", f32, 3) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  const bool segments = cfg.segment > 0;
  Tensor seg_inputs = segments ? kb.tensor("segment_inputs", f32, 5) : Tensor();
  Tensor z_inputs = segments ? kb.tensor("normalizer_inputs", f32, 5) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, cu, cfg.varlen, 1);
  // With segments, a segment's rows from the states entering it.
  Tile i_s = segments ? program_id(2) : Tile();
  const auto [b, bos, eos] = segments ? segment_bounds(seq_rows, i_s, cfg.segment) : seq_rows;
  Tile v0 = i_v * BV;
  Tile S = zeros({BK, BV}, f32);
  Tile z = zeros({BK}, f32);
  if (segments) {
    S = load(seg_inputs, {i_n, i_s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
    z = load(z_inputs, {i_n, i_s, i_h, 0, 0}, {kIndex, kIndex, kIndex, BK, kIndex});
  }
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
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
      const ChunkLogDecays dec = chunk_log_decays(load(g, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq));
      A = A * dec.between(causal);
      Tile inter = dec.from_start() * scale;
      O = dot(Q, S.to(dt)) * expand_dims(inter, 1);
      den_inter = Qz * inter;
      Tile K_decayed = K.to(f32) * expand_dims(dec.to_end(), 1);
      S = blocks::state_update(S, K_decayed, V, dec.total);
      z = z * exp(dec.total) + sum(K_decayed, 0);
    } else {
      O = dot(Q, S.to(dt)) * scale;
      den_inter = Qz * scale;
      S = blocks::state_update(S, K, V);
      z = z + sum(K.to(f32), 0);
    }
    O = O + dot(A.to(dt), V);
    Tile den = den_inter + sum(A, 1) + kNormalizedLinearAttnEps;
    store(o, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, (O / expand_dims(den, 1)).to(dt), in_seq);
  }, S, z);
  return kb.finish();
}

}  // namespace linac
