#include "kernels/linear_attn_split_bwd.h"

#include "linac/dsl.h"

namespace linac {

using namespace dsl;

// Plain linear attention, o_t = scale q_t S_t with S_t = S_{t-1} + k_t^T v_t, in chunks of BT rows with S
// the state before a chunk, S' = S + K^T V after it, dS' = dL/dS' (dfinal_state after the last chunk),
// M the causal mask (r >= c), A = scale (Q K^T) .* M, dA = scale (dO V^T) .* M:
//   dQ = scale dO S^T + dA K,   dK = V dS'^T + dA^T Q,   dV = K dS' + A^T dO,   dS = dS' + scale Q^T dO
// The default walks (linear_attn_bwd.cpp) carry S or dS' through every chunk, three walks of a column
// block each; with few sequences x heads most SMs idle and the chain of products per chunk sets the time
// (B2 T16384 H16 D128 bf16 on an H200: 0.64 ms per walk, 1.93 ms). Here the walks only add one product
// per chunk, in key x value blocks (many programs), storing S and dS' per chunk (h, dh [B, NT, H, K, V]
// in the input dtype, T·K·V/chunk elements each); linear_attn_bwd_chunk does the rest, every chunk in
// parallel.

std::shared_ptr<ir::Kernel> build_linear_attn_bwd_states(const LinearAttnSplitBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.state_block_k, BV = cfg.state_block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("linear_attn_bwd_states");
  kb.set_num_warps(cfg.state_warps);
  kb.set_min_ctas_per_sm(1);
  kb.set_num_stages(cfg.state_stages);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor h = kb.tensor("h", dt, 5);

  Tile i_v = program_id(0), i_nh = program_id(1);
  Tile H = k.dim(2), T = k.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile num_chunks = (T + (BT - 1)) / BT;
  Tile v0 = i_v * BV, k0 = program_id(2) * BK;
  AccessOptions in_seq{.limits = {{1, T}}};
  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {b, i_h, k0, v0}, {kIndex, kIndex, BK, BV});
  for_range(0, num_chunks, [&](Tile ic) {
    Tile t0 = ic * BT;
    store(h, {b, ic, i_h, k0, v0}, {kIndex, kIndex, kIndex, BK, BV}, S.to(dt));
    Tile K = load(k, {b, t0, i_h, k0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    S = S + dot(K.T(), V);
  }, S);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_linear_attn_bwd_dstates(const LinearAttnSplitBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.state_block_k, BV = cfg.state_block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("linear_attn_bwd_dstates");
  kb.set_num_warps(cfg.state_warps);
  kb.set_min_ctas_per_sm(1);
  kb.set_num_stages(cfg.state_stages);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor dh = kb.tensor("dh", dt, 5);
  Tensor dh0 = cfg.initial_state_grad ? kb.tensor("dinitial_state", f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0), i_nh = program_id(1);
  Tile H = q.dim(2), T = q.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile num_chunks = (T + (BT - 1)) / BT;
  Tile v0 = i_v * BV, k0 = program_id(2) * BK;
  AccessOptions in_seq{.limits = {{1, T}}};
  Tile X = zeros({BK, BV}, f32);
  if (cfg.final_state_grad) X = load(dht, {b, i_h, k0, v0}, {kIndex, kIndex, BK, BV});
  for_range(0, num_chunks, [&](Tile j) {
    Tile ic = num_chunks - 1 - j;
    Tile t0 = ic * BT;
    store(dh, {b, ic, i_h, k0, v0}, {kIndex, kIndex, kIndex, BK, BV}, X.to(dt));
    Tile Q = load(q, {b, t0, i_h, k0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile dO = load(dout, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    X = X + dot(Q.T(), dO) * scale;
  }, X);
  if (cfg.initial_state_grad) store(dh0, {b, i_h, k0, v0}, {kIndex, kIndex, BK, BV}, X);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_linear_attn_bwd_chunk(const LinearAttnSplitBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("linear_attn_bwd_chunk");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor h = kb.tensor("h", dt, 5);
  Tensor dh = kb.tensor("dh", dt, 5);
  Tensor dq_out = kb.tensor("dq", dt, 4);
  Tensor dk_out = kb.tensor("dk", dt, 4);
  Tensor dv_out = kb.tensor("dv", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile ic = program_id(0), i_nh = program_id(1);
  Tile H = q.dim(2), T = q.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile t0 = ic * BT;
  AccessOptions in_seq{.limits = {{1, T}}};
  auto rows_of = [&](const Tensor& t, int64_t width) {
    return load(t, {b, t0, i_h, 0}, {kIndex, BT, kIndex, width}, in_seq);
  };
  auto store_rows = [&](const Tensor& t, int64_t width, const Tile& x) {
    store(t, {b, t0, i_h, 0}, {kIndex, BT, kIndex, width}, x, in_seq);
  };
  Tile Q = rows_of(q, BK), K = rows_of(k, BK), V = rows_of(v, BV), dO = rows_of(dout, BV);
  Tile S = load(h, {b, ic, i_h, 0, 0}, {kIndex, kIndex, kIndex, BK, BV});
  Tile dS = load(dh, {b, ic, i_h, 0, 0}, {kIndex, kIndex, kIndex, BK, BV});
  Tile causal = expand_dims(iota(BT), 1) >= expand_dims(iota(BT), 0);
  Tile dA = where(causal, dot(dO, V.T()) * scale, 0.0f).to(dt);
  Tile A = where(causal, dot(Q, K.T()) * scale, 0.0f).to(dt);
  store_rows(dq_out, BK, (dot(dO, S.T()) * scale + dot(dA, K)).to(dt));
  store_rows(dk_out, BK, (dot(V, dS.T()) + dot(dA.T(), Q)).to(dt));
  store_rows(dv_out, BV, (dot(K, dS) + dot(A.T(), dO)).to(dt));
  return kb.finish();
}

}  // namespace linac
