#include "kernels/gla/split_bwd.h"

#include "kernels/common/prologue.h"
#include "kernels/common/state_pass.h"
#include "kernels/gla/bwd.h"
#include "linac/blocks.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {
constexpr int64_t kDgOffsetChunks = 64;  // chunk totals per step of gla_bwd_dg_offsets (summing_rows: fewer at K > 64)
constexpr int64_t kDgFinalColumns = 32;  // value columns per step of its final-state term
}

// GLA backward, split schedule (dense inputs; --backward --config split=1). The walks of the default
// schedule carry the whole gradient computation from chunk to chunk: with few sequences x heads they
// leave most SMs idle and the chain of dots per chunk sets the time (docs/ops/gla.md, "Measured"). Here only
// the state recurrences walk, in key x value blocks (many programs, one product per chunk), on operands
// gla_bwd_gates decayed beforehand for every chunk in parallel (so that no scan of the gates sits in a
// walk's chain: each took a pass through shared memory per chunk):
//   gla_bwd_gates (parallel):  Qd = Q .* exp(L), Kd = K .* exp(R) (input dtype), exp(tot) per chunk
//   gla_bwd_states:            h[c] = S before chunk c,     S' = diag(exp(tot)) S + Kd^T V
//   gla_bwd_dstates (reverse): dh[c] = dS' after chunk c,   dS = diag(exp(tot)) dS' + scale Qd^T dO
// and gla_bwd_inter computes every chunk's gradients in parallel from h and dh (gla_bwd_intra's parts
// added; equations at the top of bwd.cpp):
//   dQ = scale (dO S^T) .* exp(L) + dQi,  dK = (V dS'^T) .* exp(R) + dKi,  dV = (K .* exp(R)) dS' + dVi
// dg's suffix sums: gla_bwd_inter stores each chunk's own (and its total), gla_bwd_dg_offsets sums the
// later chunks' totals for every chunk (a walk over blocks of 64 chunks per head), gla_bwd_dg_add adds
// them to the rows (every chunk in parallel).
// h and dh hold a [K, V] state per chunk in the input dtype: O(T K V / chunk) memory, linear in T.

std::shared_ptr<ir::Kernel> build_gla_bwd_gates(const GlaSplitBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_bwd_gates");
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor qd = cfg.decay_queries ? kb.tensor("qd", dt, 4) : Tensor();
  Tensor kd = kb.tensor("kd", dt, 4);
  Tensor etot = kb.tensor("etot", f32, 4);  // [B, NT, H, K]

  Tile ic = program_id(0), i_nh = program_id(1);
  Tile H = q.dim(2), T = q.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile t0 = ic * BT;
  AccessOptions in_seq{.limits = {{1, T}}};
  auto rows_of = [&](const Tensor& t, const Tile& row0) {
    return load(t, {b, row0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  };
  // L = the chunk's inclusive cumsum of g; R_r = g_{r+1} + ... + g_{BT-1}, summed directly from the gates
  // one row ahead, never tot - L, so that very negative gates early in the chunk do not cancel the
  // precision of the decays after them.
  Tile gc = rows_of(g, t0);
  Tile R = blocks::decays_to_chunk_end_from_next(rows_of(g, t0 + 1));
  if (cfg.decay_queries)
    store(qd, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, (rows_of(q, t0).to(f32) * exp(cumsum(gc, 0))).to(dt), in_seq);
  store(kd, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, (rows_of(k, t0).to(f32) * exp(R)).to(dt), in_seq);
  store(etot, {b, ic, i_h, 0}, {kIndex, kIndex, kIndex, BK}, exp(sum(gc, 0)));
  return kb.finish();
}

namespace {

StatePassConfig state_pass(const GlaSplitBwdConfig& cfg, const char* name) {
  StatePassConfig p;
  p.name = name;
  p.dtype = cfg.dtype;
  p.chunk = cfg.chunk;
  p.block_k = cfg.state_block_k;
  p.block_v = cfg.state_block_v;
  p.num_warps = cfg.state_warps;
  p.num_stages = cfg.state_stages;
  p.decay = "etot";
  return p;
}

}  // namespace

std::shared_ptr<ir::Kernel> build_gla_bwd_states(const GlaSplitBwdConfig& cfg) {
  StatePassConfig p = state_pass(cfg, "gla_bwd_states");
  p.a = "kd";  // S' = diag(exp(tot)) S + Kd^T V
  p.b = "v";
  p.init = cfg.initial_state ? "initial_state" : nullptr;
  p.last = cfg.final_state ? "final_state" : nullptr;
  p.table = "h";
  return build_state_pass(p);
}

std::shared_ptr<ir::Kernel> build_gla_bwd_dstates(const GlaSplitBwdConfig& cfg) {
  StatePassConfig p = state_pass(cfg, "gla_bwd_dstates");
  p.reverse = true;
  p.a = "qd";  // dS = diag(exp(tot)) dS' + scale Qd^T dO
  p.b = "do";
  p.scaled = true;
  p.init = cfg.final_state_grad ? "dfinal_state" : nullptr;
  p.last = cfg.initial_state_grad ? "dinitial_state" : nullptr;
  p.table = "dh";
  return build_state_pass(p);
}

std::shared_ptr<ir::Kernel> build_gla_bwd_inter(const GlaSplitBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_bwd_inter");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor h = kb.tensor("h", dt, 5);
  Tensor dh = kb.tensor("dh", dt, 5);
  Tensor dq_in = kb.tensor("dq_intra", f32, 4);
  Tensor dk_in = kb.tensor("dk_intra", f32, 4);
  Tensor dv_in = kb.tensor("dv_intra", f32, 4);
  Tensor dq_out = kb.tensor("dq", dt, 4);
  Tensor dk_out = kb.tensor("dk", dt, 4);
  Tensor dv_out = kb.tensor("dv", dt, 4);
  Tensor dg = kb.tensor("dg", f32, 4);              // the chunk-local part, completed by gla_bwd_dg_add
  Tensor dg_chunk = kb.tensor("dg_chunk", f32, 4);  // [B, NT, H, K]
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
  // The chunk's blocks loaded before the gates are first used, so that no load waits for their data;
  // the gates one row ahead prefetched too (AccessOptions), as the others are (shared-memory operands).
  const AccessOptions prefetched = in_seq.prefetched();
  Tile gc = rows_of(g, BK);
  Tile next = load(g, {b, t0 + 1, i_h, 0}, {kIndex, BT, kIndex, BK}, prefetched);
  Tile S = load(h, {b, ic, i_h, 0, 0}, {kIndex, kIndex, kIndex, BK, BV});
  Tile dS = load(dh, {b, ic, i_h, 0, 0}, {kIndex, kIndex, kIndex, BK, BV});
  Tile Q = rows_of(q, BK), K = rows_of(k, BK), V = rows_of(v, BV), dO = rows_of(dout, BV);
  // L = the chunk's inclusive cumsum of g; R_r = g_{r+1} + ... + g_{BT-1}, summed directly from the gates
  // one row ahead, as the walks take them.
  Tile eL = exp(cumsum(gc, 0));
  Tile eR = exp(blocks::decays_to_chunk_end_from_next(next));

  Tile dQ = dot(dO, S.T()) * eL * scale + rows_of(dq_in, BK);
  store_rows(dq_out, BK, dQ.to(dt));
  Tile Kr = K.to(f32) * eR;
  Tile dK = dot(V, dS.T()) * eR + rows_of(dk_in, BK);
  store_rows(dk_out, BK, dK.to(dt));
  Tile dV = dot(Kr.to(dt), dS) + rows_of(dv_in, BV);
  store_rows(dv_out, BV, dV.to(dt));
  // dg_t = sum_{s >= t} (q_s .* dq_s - k_s .* dk_s) (+ the final state's term): the sums within this
  // chunk here, the chunks after it added by gla_bwd_dg_add from their totals. Rows past T are 0.
  Tile x = Q.to(f32) * dQ - K.to(f32) * dK;
  store_rows(dg, BK, cumsum(x, 0, /*reverse=*/true));
  store(dg_chunk, {b, ic, i_h, 0}, {kIndex, kIndex, kIndex, BK}, sum(x, 0));
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_gla_bwd_dg_offsets(const GlaSplitBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, NB = summing_rows(kDgOffsetChunks, BK);
  const DType f32 = DType::f32;
  KernelBuilder kb("gla_bwd_dg_offsets");
  kb.set_num_warps(4);
  // One program per (sequence, head), too few to share SMs: left to choose, ptxas held it to 96 registers
  // (blocks per SM it never gets) and spilled 4 bytes.
  kb.set_min_ctas_per_sm(1);
  Tensor dg_chunk = kb.tensor("dg_chunk", f32, 4);  // [B, NT, H, K]
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor ht = cfg.final_state_grad ? kb.tensor("final_state", f32, 4) : Tensor();  // S_T, from gla_bwd_states
  Tensor dg_offset = kb.tensor("dg_offset", f32, 4);  // [B, NT, H, K]

  Tile i_nh = program_id(0);
  Tile H = dg_chunk.dim(2), NT = dg_chunk.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile num_blocks = (NT + (NB - 1)) / NB;
  AccessOptions in_chunks{.limits = {{1, NT}}};
  // The sum over the chunks after each, carried from the last block of NB chunks: the final state's
  // term rowsum(dfinal_state .* S_T) (over value columns in steps of kDgFinalColumns), then the totals.
  // Each offset sums the totals after its chunk directly (the next rows, the block's last taking the
  // carry), never an inclusive sum minus the chunk's own.
  Tile acc = zeros({BK}, f32);
  if (cfg.final_state_grad) {
    for (int v0 = 0; v0 < cfg.block_v; v0 += kDgFinalColumns) {
      Tile dS = load(dht, {b, i_h, 0, v0}, {kIndex, kIndex, BK, kDgFinalColumns});
      Tile S = load(ht, {b, i_h, 0, v0}, {kIndex, kIndex, BK, kDgFinalColumns});
      acc = acc + sum(dS * S, 1);
    }
  }
  Tile last_row = expand_dims(iota(NB), 1) == NB - 1;
  for_range(0, num_blocks, [&](Tile j) {
    Tile c0 = (num_blocks - 1 - j) * NB;
    Tile after = where(last_row, 0.0f, load(dg_chunk, {b, c0 + 1, i_h, 0}, {kIndex, NB, kIndex, BK}, in_chunks));
    store(dg_offset, {b, c0, i_h, 0}, {kIndex, NB, kIndex, BK}, cumsum(after, 0, /*reverse=*/true) + expand_dims(acc, 0),
          in_chunks);
    acc = acc + sum(load(dg_chunk, {b, c0, i_h, 0}, {kIndex, NB, kIndex, BK}, in_chunks), 0);
  }, acc);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_gla_bwd_dg_add(const GlaSplitBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k;
  const DType f32 = DType::f32;
  KernelBuilder kb("gla_bwd_dg_add");
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor dg_offset = kb.tensor("dg_offset", f32, 4);
  Tensor dg = kb.tensor("dg", f32, 4);

  Tile ic = program_id(0), i_nh = program_id(1);
  Tile H = dg.dim(2), T = dg.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile t0 = ic * BT;
  AccessOptions in_seq{.limits = {{1, T}}};
  Tile local = load(dg, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile offset = load(dg_offset, {b, ic, i_h, 0}, {kIndex, kIndex, kIndex, BK});
  store(dg, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, local + expand_dims(offset, 0), in_seq);
  return kb.finish();
}

}  // namespace linac
