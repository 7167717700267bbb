#include "retnet_kernel.h"

using namespace linac::dsl;
using linac::DType;

// One program per (value block, sequence x head) walks its sequence chunk by chunk, carrying the state
// S [BK, BV] in registers. With row r and column c counted inside a chunk and g = log gamma_h:
//   O   = (exp((r+1) g) .* Q) S  +  ((Q K^T) .* D) V,   D[r,c] = gamma^(r-c) if r >= c else 0
//   S'  = gamma^BT S  +  (exp((BT-1-c) g) .* K)^T V
// Rows past the end of the sequence load as 0, so they add nothing to S and their outputs are masked.
std::shared_ptr<linac::ir::Kernel> build_retnet(const RetNetConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype;
  KernelBuilder kb("retnet_fwd");
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor o = kb.tensor("o", dt, 4);

  Tile i_v = program_id(0), i_bh = program_id(1);
  Tile H = q.dim(2), T = q.dim(1);
  Tile i_b = i_bh / H, i_h = i_bh % H;
  Tile v0 = i_v * BV;
  Tile num_chunks = (T + (BT - 1)) / BT;

  // The decays depend on the head only: compute them once, outside the chunk loop.
  Tile g = log(1.0f - exp2(-5.0f - i_h.to(DType::f32)));  // log gamma_h < 0
  Tile r = expand_dims(iota(BT), 1), c = expand_dims(iota(BT), 0);
  Tile D = where(r >= c, exp((r - c).to(DType::f32) * g), 0.0f);      // [BT, BT]
  Tile q_decay = exp((r + 1).to(DType::f32) * g);                      // [BT, 1]: gamma^(r+1)
  Tile k_decay = exp(((BT - 1) - r).to(DType::f32) * g);               // [BT, 1]: gamma^(BT-1-r)
  Tile chunk_decay = exp(g * static_cast<float>(BT));                  // gamma^BT

  Tile S = zeros({BK, BV}, DType::f32);
  for_range(0, num_chunks, [&](Tile i) {
    Tile t0 = i * BT;
    Tile Q = load(q, {i_b, t0, i_h, 0}, {kIndex, BT, kIndex, BK});
    Tile K = load(k, {i_b, t0, i_h, 0}, {kIndex, BT, kIndex, BK});
    Tile V = load(v, {i_b, t0, i_h, v0}, {kIndex, BT, kIndex, BV});
    Tile A = dot(Q, K.T()) * D;
    Tile O = dot(Q, S.to(dt)) * q_decay + dot(A.to(dt), V);
    store(o, {i_b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt));
    Tile K_decayed = (K.to(DType::f32) * k_decay).to(dt);
    S = S * chunk_decay + dot(K_decayed.T(), V);
  }, S);
  return kb.finish();
}
