#include "kernels/linear_attn/bwd.h"

#include <map>
#include <string>

#include "kernels/common/chunk_gate_sums.h"
#include "kernels/common/log_decay.h"
#include "kernels/common/prologue.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

// Notation (one sequence, one head): S_t = a_t S_{t-1} + k_t^T v_t, a_t = exp(g_t), o_t = scale q_t S_t,
// dH_t = dL/dS_t = scale q_t^T do_t + a_{t+1} dH_{t+1}, seeded by dS_T = dfinal_state. Then
//   dq_t = scale do_t S_t^T,  dk_t = v_t dH_t^T,  dv_t = k_t dH_t,  dinitial_state = a_1 dH_1,
//   dg_t = sum_{s>=t} (q_s.dq_s - k_s.dk_s) + <dfinal_state, S_T>   (= a_t <dH_t, S_{t-1}>).
//
// Each of dq, dk, dv is a walk with the shape of the forward, out = a X + ((a b^T) .* D) c and
// X <- decay X + b^T c, for roles (a, b, c) and a state X that needs no transpose:
//   dq: forward walk, a = do, b = v, c = k, X = S^T [V, K]   (dq = scale (do S^T + (do v^T .* M) k))
//   dk: reverse walk, a = v, b = do, c = q, X = dH^T [V, K]  (dk = v dH^T + scale (v do^T .* M^T) q)
//   dv: reverse walk, a = k, b = q, c = do, X = dH [K, V]    (dv = k dH + scale (k q^T .* M^T) do)
// The contraction a.b runs over a whole head dim; c, out and X's columns are split in blocks across
// programs (bk for dq and dk, bv for dv), so a head is spread over K/bk or V/bv programs. Per chunk,
// b is the chunk-local cumulative log-decay (zeros without a gate) and b_C its last row: forward walks
// weigh the state term by exp(b_r), pairs by exp(b_r - b_s) (s <= r) and the update rows by
// exp(b_C - b_s); reverse walks by exp(b_C - b_r), exp(b_s - b_r) (s >= r) and exp(b_s).
// dg's row sums (q.dq, k.dk) are split the same way: each dq/dk program writes its block's partial
// sum, and a last kernel adds the blocks in a fixed order and takes the suffix sums (deterministic).

namespace {

/// A block loaded (or stored) transposed: the state's rows c0.. as columns.
const AccessOptions kTransposed{.limits = {}, .transpose = true};

struct WalkRoles {
  const char* name;
  bool reverse;
  const char* a;
  const char* b;
  const char* c;
  const char* out;
  bool state_rows_k;  // X is [K, BC] (dv) rather than [V, BC] (dq, dk)
  const char* a2;     // the denominator's pair (LinearAttnBwdConfig::denominator), one column each
  const char* b2;
};

WalkRoles roles_of(LinearAttnBwdKernel which) {
  switch (which) {
    case LinearAttnBwdKernel::dq: return {"linear_attn_bwd_dq", false, "do", "v", "k", "dq", false, "den_do", "ones"};
    case LinearAttnBwdKernel::dk: return {"linear_attn_bwd_dk", true, "v", "do", "q", "dk", false, "ones", "den_do"};
    case LinearAttnBwdKernel::dv: return {"linear_attn_bwd_dv", true, "k", "q", "do", "dv", true, nullptr, nullptr};
    case LinearAttnBwdKernel::dg: break;
  }
  throw InternalError("roles_of: dg is not a walk");
}

std::shared_ptr<ir::Kernel> build_walk(const LinearAttnBwdConfig& cfg, LinearAttnBwdKernel which) {
  const WalkRoles r = roles_of(which);
  const int64_t BT = cfg.chunk;
  const int64_t W = r.state_rows_k ? cfg.block_k : cfg.block_v;  // a and b: a whole head dim
  const int64_t BC = r.state_rows_k ? cfg.split_v : cfg.split_k;  // c, out, X's columns: one block
  const DType dt = cfg.dtype;
  const bool is_dq = which == LinearAttnBwdKernel::dq, is_dk = which == LinearAttnBwdKernel::dk;
  const bool den = cfg.denominator && r.a2;
  constexpr int64_t W2 = 16;  // the denominator pair's one column, padded to the smallest dot
  const bool state_term = cfg.gated && cfg.final_state_grad;  // dg's <dfinal_state, S_T>
  KernelBuilder kb(r.name);
  kb.set_num_warps(cfg.num_warps);
  kb.set_producer_warps(cfg.producer_warps);
  // One program per SM holds a head's column block for the whole walk: registers over a second block
  // (at 8 warps and 64-row chunks ptxas otherwise caps at 128 registers and spills 12-40 bytes).
  kb.set_min_ctas_per_sm(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor dout = kb.tensor("do", dt, 4);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  Tensor chunk_offsets = cfg.gated ? kb.tensor("chunk_offsets", DType::i32, 1) : Tensor();
  Tensor h0 = is_dq && cfg.initial_state ? kb.tensor("initial_state", DType::f32, 4) : Tensor();
  Tensor dht = (!is_dq && cfg.final_state_grad) || (is_dq && state_term) ? kb.tensor("dfinal_state", DType::f32, 4)
                                                                         : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor den_do = den ? kb.tensor("den_do", dt, 4) : Tensor();
  Tensor ones = den ? kb.tensor("ones", dt, 4) : Tensor();
  Tensor out = kb.tensor(r.out, dt, 4);
  const bool dg_part = cfg.gated && (is_dq || is_dk);
  Tensor part = dg_part ? kb.tensor(is_dq ? "dg_q" : "dg_k", DType::f32, 4) : Tensor();  // [blocks, B, T, H]
  Tensor state_part = is_dq && state_term ? kb.tensor("dg_s", DType::f32, 3) : Tensor();  // [blocks, N, H]
  Tensor dh0 = !is_dq && !is_dk && cfg.initial_state_grad ? kb.tensor("dinitial_state", DType::f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", DType::f32);
  const std::map<std::string, Tensor> by_name = {{"q", q}, {"k", k}, {"v", v}, {"do", dout}, {"den_do", den_do},
                                                 {"ones", ones}};

  Tile i_c = program_id(0);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, cu, cfg.varlen, 1);
  const auto [b, bos, eos] = seq_rows;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile c0 = i_c * BC;
  Tile first_chunk = cfg.gated ? load(chunk_offsets, {i_n}, {kIndex}) : Tile();  // of the gates' sums

  // X starts at h0^T (dq) or dfinal_state^T (dk) or dfinal_state (dv): the block of columns c0.. of
  // the state's transpose is the block of rows c0.. of the state, loaded transposed.
  Tile X = zeros({W, BC}, DType::f32);
  if (h0.value()) X = load(h0, {i_n, i_h, c0, 0}, {kIndex, kIndex, BC, W}, kTransposed);
  if (!is_dq && dht.value())
    X = r.state_rows_k ? load(dht, {i_n, i_h, 0, c0}, {kIndex, kIndex, W, BC})
                       : load(dht, {i_n, i_h, c0, 0}, {kIndex, kIndex, BC, W}, kTransposed);

  // The denominator's state: the one-column pair's X (no initial or final state: --normalize has none).
  Tile X2 = den ? zeros({W2, BC}, DType::f32) : Tile();

  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile pairs = r.reverse ? row <= col : row >= col;  // forward: r receives from s <= r; reverse: s >= r
  AccessOptions in_seq{.limits = {{1, eos}}};

  auto body = [&](Tile j) {
    Tile i = r.reverse ? num_chunks - 1 - j : j;
    Tile t0 = bos + i * BT;
    Tile A_ = load(by_name.at(r.a), {b, t0, i_h, 0}, {kIndex, BT, kIndex, W}, in_seq);
    Tile B_ = load(by_name.at(r.b), {b, t0, i_h, 0}, {kIndex, BT, kIndex, W}, in_seq);
    Tile C_ = load(by_name.at(r.c), {b, t0, i_h, c0}, {kIndex, BT, kIndex, BC}, in_seq);
    Tile AB = dot(A_, B_.T());
    Tile A2, B2;  // the denominator's pair: [BT, 16] tiles whose columns past the first load zeros
    if (den) {
      A2 = load(by_name.at(r.a2), {b, t0, i_h, 0}, {kIndex, BT, kIndex, W2}, in_seq);
      B2 = load(by_name.at(r.b2), {b, t0, i_h, 0}, {kIndex, BT, kIndex, W2}, in_seq);
      AB = AB + dot(A2, B2.T());
    }
    Tile P = where(pairs, AB * scale, 0.0f);
    Tile inter, update_rows;  // the state term of out; the rows of b weighted for the state update
    Tile update_rows2;          // the same for the denominator's pair
    Tile decay_all;           // exp(b_C): the state's decay over the chunk
    if (cfg.gated) {
      const ChunkLogDecays dec = gates.load(first_chunk + i, i_h, BT).decays();
      P = P * dec.between(pairs, r.reverse);
      Tile row_weight = r.reverse ? dec.to_end() : dec.from_start();
      Tile update_weight = r.reverse ? dec.from_start() : dec.to_end();
      Tile rows_in = dot(A_, X.to(dt));
      if (den) rows_in = rows_in + dot(A2, X2.to(dt));
      inter = rows_in * expand_dims(row_weight, 1);
      update_rows = (B_.to(DType::f32) * expand_dims(update_weight, 1)).to(dt);
      if (den) update_rows2 = (B2.to(DType::f32) * expand_dims(update_weight, 1)).to(dt);
      decay_all = exp(dec.total);
    } else {
      inter = dot(A_, X.to(dt));
      if (den) inter = inter + dot(A2, X2.to(dt));
      update_rows = B_;
      update_rows2 = B2;
    }
    // P carries scale. For dq the state term needs it too; for dk and dv the state dH carries it in
    // its updates (dfinal_state, where it starts, has none).
    Tile O = (is_dq ? inter * scale : inter) + dot(P.to(dt), C_);
    Tile update = dot(update_rows.T(), C_);
    if (!is_dq) update = update * scale;
    X = cfg.gated ? X * decay_all + update : X + update;
    if (den) {
      Tile update2 = dot(update_rows2.T(), C_);
      if (!is_dq) update2 = update2 * scale;
      X2 = cfg.gated ? X2 * decay_all + update2 : X2 + update2;
    }
    store(out, {b, t0, i_h, c0}, {kIndex, BT, kIndex, BC}, O.to(dt), in_seq);
    if (dg_part) {
      // This block's share of q.dq (dq) or k.dk (dk), in fp32 before the gradient is rounded.
      Tile own = load(is_dq ? q : k, {b, t0, i_h, c0}, {kIndex, BT, kIndex, BC}, in_seq);
      store(part, {i_c, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, sum(own.to(DType::f32) * O, 1),
            {.limits = {{2, eos}}});
    }
  };
  if (den)
    for_range(0, num_chunks, body, X, X2);
  else
    for_range(0, num_chunks, body, X);

  if (state_part.value()) {
    Tile dS = load(dht, {i_n, i_h, c0, 0}, {kIndex, kIndex, BC, W}, kTransposed);
    store(state_part, {i_c, i_n, i_h}, {kIndex, kIndex, kIndex}, sum(sum(dS * X, 1), 0));
  }
  // After the reverse walk X = dL/dS_0 = a_1 dH_1 (its last step applied the first chunk's decay).
  if (dh0.value()) store(dh0, {i_n, i_h, 0, c0}, {kIndex, kIndex, W, BC}, X);
  return kb.finish();
}

/// dg_t = sum_{s>=t} (q_s.dq_s - k_s.dk_s) + <dfinal_state, S_T>: adds the per-block partial sums of
/// the dq and dk kernels in block order and takes suffix sums by a reverse walk over steps of rows.
/// The partials are per row, so the steps need not be the walks' chunks: 32 rows, one warp's scan by
/// shuffles (steps of 64 go through shared memory and ran slower: docs/ops/linear_attn.md, "Measured").
std::shared_ptr<ir::Kernel> build_dg(const LinearAttnBwdConfig& cfg) {
  const int64_t BT = 32;
  const int64_t blocks = cfg.block_k / cfg.split_k;
  const bool state_term = cfg.final_state_grad;
  KernelBuilder kb("linear_attn_bwd_dg");
  kb.set_num_warps(1);
  Tensor q = kb.tensor("q", cfg.dtype, 4);  // for the sequence bounds (B, T, H)
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dg_q = kb.tensor("dg_q", DType::f32, 4);
  Tensor dg_k = kb.tensor("dg_k", DType::f32, 4);
  Tensor dg_s = state_term ? kb.tensor("dg_s", DType::f32, 3) : Tensor();
  Tensor dg = kb.tensor("dg", DType::f32, 3);

  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, cu, cfg.varlen, 0);
  const auto [b, bos, eos] = seq_rows;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;

  Tile acc = constant(0.0, DType::f32);
  if (state_term)
    for (int64_t c = 0; c < blocks; ++c) acc = acc + load(dg_s, {c, i_n, i_h}, {kIndex, kIndex, kIndex});
  for_range(0, num_chunks, [&](Tile j) {
    Tile t0 = bos + (num_chunks - 1 - j) * BT;
    AccessOptions in_seq{.limits = {{2, eos}}};
    Tile x = zeros({BT}, DType::f32);
    for (int64_t c = 0; c < blocks; ++c)
      x = x + load(dg_q, {c, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, in_seq) -
          load(dg_k, {c, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, in_seq);
    store(dg, {b, t0, i_h}, {kIndex, BT, kIndex}, cumsum(x, 0, true) + acc, {.limits = {{1, eos}}});
    acc = acc + sum(x, 0);
  }, acc);
  return kb.finish();
}

}  // namespace

std::shared_ptr<ir::Kernel> build_linear_attn_bwd(const LinearAttnBwdConfig& cfg, LinearAttnBwdKernel which) {
  if (cfg.block_k % cfg.split_k || cfg.block_v % cfg.split_v)
    throw InternalError("linear_attn bwd: the column blocks must divide the padded head dims");
  return which == LinearAttnBwdKernel::dg ? build_dg(cfg) : build_walk(cfg, which);
}

}  // namespace linac
