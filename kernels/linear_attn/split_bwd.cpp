#include "kernels/linear_attn/split_bwd.h"

#include "kernels/common/prologue.h"
#include "kernels/common/state_pass.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

// Plain linear attention, o_t = scale q_t S_t with S_t = S_{t-1} + k_t^T v_t, in chunks of BT rows with S
// the state before a chunk, S' = S + K^T V after it, dS' = dL/dS' (dfinal_state after the last chunk),
// M the causal mask (r >= c), A = scale (Q K^T) .* M, dA = scale (dO V^T) .* M:
//   dQ = scale dO S^T + dA K,   dK = V dS'^T + dA^T Q,   dV = K dS' + A^T dO,   dS = dS' + scale Q^T dO
// The default walks (bwd.cpp) carry S or dS' through every chunk, three walks of a column
// block each; with few sequences x heads most SMs idle and the chain of products per chunk sets the time
// (docs/ops/linear_attn.md, "Measured"). Here the walks only add one product
// per chunk, in key x value blocks (many programs), storing S and dS' per chunk (h, dh [B, NT, H, K, V]
// in the input dtype, T·K·V/chunk elements each); linear_attn_bwd_chunk does the rest, every chunk in
// parallel.

namespace {

StatePassConfig state_pass(const LinearAttnSplitBwdConfig& cfg, const char* name) {
  StatePassConfig p;
  p.name = name;
  p.dtype = cfg.dtype;
  p.chunk = cfg.chunk;
  p.block_k = cfg.state_block_k;
  p.block_v = cfg.state_block_v;
  p.num_warps = cfg.state_warps;
  p.num_stages = cfg.state_stages;
  return p;
}

}  // namespace

std::shared_ptr<ir::Kernel> build_linear_attn_bwd_states(const LinearAttnSplitBwdConfig& cfg) {
  StatePassConfig p = state_pass(cfg, "linear_attn_bwd_states");
  p.a = "k";  // S' = S + K^T V
  p.b = "v";
  p.init = cfg.initial_state ? "initial_state" : nullptr;
  p.table = "h";
  return build_state_pass(p);
}

std::shared_ptr<ir::Kernel> build_linear_attn_bwd_dstates(const LinearAttnSplitBwdConfig& cfg) {
  StatePassConfig p = state_pass(cfg, "linear_attn_bwd_dstates");
  p.reverse = true;
  p.a = "q";  // dS = dS' + scale Q^T dO
  p.b = "do";
  p.scaled = true;
  p.init = cfg.final_state_grad ? "dfinal_state" : nullptr;
  p.last = cfg.initial_state_grad ? "dinitial_state" : nullptr;
  p.table = "dh";
  return build_state_pass(p);
}

std::shared_ptr<ir::Kernel> build_linear_attn_bwd_chunk(const LinearAttnSplitBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("linear_attn_bwd_chunk");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  auto [q, k, v] = declare_qkv(kb, dt);
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
  Tile dQ = dot(dO, S.T()) * scale + dot(dA, K), dK = dot(V, dS.T()) + dot(dA.T(), Q);
  if (cfg.accumulate_dqdk) {
    // Added to what dq and dk hold (another backward's share), in fp32, rounded once.
    dQ = dQ + rows_of(dq_out, BK).to(f32);
    dK = dK + rows_of(dk_out, BK).to(f32);
  }
  store_rows(dq_out, BK, dQ.to(dt));
  store_rows(dk_out, BK, dK.to(dt));
  store_rows(dv_out, BV, (dot(K, dS) + dot(A.T(), dO)).to(dt));
  return kb.finish();
}

}  // namespace linac
