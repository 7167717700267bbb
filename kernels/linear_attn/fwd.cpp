#include "kernels/linear_attn/fwd.h"

#include "kernels/common/log_decay.h"
#include "kernels/common/prologue.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

// One program per (V block, sequence x head) walks the chunks of its sequence in order, carrying the
// state S [BK, BV] in registers (the "fused chunk" schedule). Per chunk, with b the chunk-local
// cumulative log-decay (all zeros without a gate):
//   O = scale * ((exp(b) .* Q) S + ((Q K^T) .* exp(b_r - b_c) .* M) V)
//   S = exp(b_C) S + (exp(b_C - b) .* K)^T V
std::shared_ptr<ir::Kernel> build_linear_attn_fwd(const LinearAttnConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype;
  KernelBuilder kb("linear_attn_fwd");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g = cfg.gated ? kb.tensor("g", DType::f32, 3) : Tensor();
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", DType::f32, 4) : Tensor();
  Tensor ht = cfg.final_state ? kb.tensor("final_state", DType::f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", DType::f32);

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, cu, cfg.varlen, 1);
  const auto [b, bos, eos] = seq_rows;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;

  Tile S = zeros({BK, BV}, DType::f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});

  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile causal = row >= col;
  AccessOptions in_seq{.limits = {{1, eos}}};

  for_range(0, num_chunks, [&](Tile i) {
    Tile t0 = bos + i * BT;
    // scale is applied to the fp32 products rather than to Q: Q then feeds the tensor cores as loaded.
    Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile A = where(causal, dot(Q, K.T()) * scale, 0.0f);
    Tile O;
    if (cfg.gated) {
      // Rows past the sequence end load g = 0, so b stops growing there and b_C = b at the last row.
      // Gates of -inf are floored (kernels/common/log_decay.h): b_r - b_c would be -inf - -inf.
      Tile gc = floor_log_decay(load(g, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq));
      Tile bg = cumsum(gc, 0);
      Tile b_last = sum(gc, 0);
      Tile br = expand_dims(bg, 1), bc = expand_dims(bg, 0);
      // Exponentiate only where r >= c: the upper triangle would overflow.
      A = A * exp(where(causal, br - bc, 0.0f));
      O = dot(Q, S.to(dt)) * (exp(br) * scale);
      Tile K_decayed = (K.to(DType::f32) * expand_dims(exp(b_last - bg), 1)).to(dt);
      S = S * exp(b_last) + dot(K_decayed.T(), V);
    } else {
      O = dot(Q, S.to(dt)) * scale;
      S = S + dot(K.T(), V);
    }
    O = O + dot(A.to(dt), V);
    store(o, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt), in_seq);
  }, S);

  if (cfg.final_state) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

}  // namespace linac
