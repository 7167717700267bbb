#include "kernels/delta_rule/bwd.h"

#include <fmt/format.h>
#include <vector>

#include "kernels/common/chunk_gate_sums.h"
#include "kernels/common/log_decay.h"
#include "kernels/common/prologue.h"
#include "kernels/delta_rule/fwd.h"
#include "linac/blocks.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

// DeltaNet backward in chunks (keys as given; the gate's additions below). Per chunk, with S the state
// before it, S' after it, M the causal mask (r >= c), strict the mask r > c, and from the forward
// (docs/ops/delta_rule.md):
//   A = strict(diag(beta) K K^T),  T = (I + A)^-1,  W = T diag(beta) K,  U = T diag(beta) V
//   Vn = U - W S,   O = scale (Q S + ((Q K^T) .* M) Vn),   S' = S + K^T Vn
// the reverse mode, with dS' = dL/dS' (dfinal_state after the last chunk):
//   dVn = scale ((Q K^T) .* M)^T dO + K dS'            dS = dS' + scale Q^T dO - W^T dVn
//   dQ  = scale (dO S^T + ((dO Vn^T) .* M) K)
//   dK  = scale ((dO Vn^T) .* M)^T Q + Vn dS'^T        (+ the UT terms below)
//   dW  = -dVn S^T,  dU = dVn
//   dKb = T^T dW,  dVb = T^T dU,  dT = dW (beta K)^T + dU (beta V)^T,  dA = -strict(T^T dT T^T)
//   dV  = beta dVb,   dbeta = rowsum(dVb V) + rowsum(dKb K) + rowsum(dA .* K K^T)
//   dK += beta dKb + (beta dA) K + (beta dA)^T K
// Three kernels after delta_rule_wy recomputes W and U (and stores T, so that the per-chunk kernel does
// not invert again: docs/ops/delta_rule.md, "Measured"): a forward walk stores S per chunk
// and Vn; a reverse walk stores dS' per chunk and dVn (and dinitial_state); then every chunk is
// independent.
// The per-chunk states are [chunks, H, K, V] in the input dtype: T*K*V/chunk elements each, linear in T.
//
// Gated (gated_delta_rule), with b the chunk-local cumulative log-decay, b_C its last row and
// Gam[r, c] = exp(b_r - b_c): the forward multiplies Q K^T and K K^T by Gam, W = T diag(beta exp(b)) K,
// O's state term by exp(b), S' = exp(b_C) S + (exp(b_C - b) .* K)^T Vn. The same reverse mode with those
// factors (dVn = P^T dO + (exp(b_C - b) .* K) dS', dS = exp(b_C) dS' + scale (exp(b) .* Q)^T dO - W^T dVn,
// ...), and the gate's gradient per chunk from every place b enters: with P = scale (Q K^T) .* Gam .* M,
//   db_r += sum_c Z[r, c] - sum_c Z[c, r]  for Z = dP .* P and for Z = dA .* A   (the Gam factors)
//   db_r += rowsum(dQ_state .* Q) + beta_r exp(b_r) dKb_r . k_r - Y_r,  Y_r = exp(b_C - b_r) k_r . (Vn dS'^T)_r
//   db_C += exp(b_C) <dS', S> + sum_r Y_r
// then dg_t = sum_{r >= t in the chunk} db_r + db_C (b is a chunk-local cumulative sum and b_C the sum of
// all the chunk's gates; earlier chunks' gates reach this one only through S, whose gradient the walks
// carry). Every kernel here takes the exponents as differences of b read from the gates' sums
// (chunk_gate_sums), gates below the floor set apart (ChunkLogDecays, kernels/common/log_decay.h), as
// the forward's walk does.

std::shared_ptr<ir::Kernel> build_delta_bwd_states(const DeltaChunkedBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_bwd_states" : "delta_rule_bwd_states");
  kb.set_num_warps(cfg.walk_warps);
  kb.set_producer_warps(cfg.walk_producer_warps);
  kb.set_min_ctas_per_sm(1);
  Tensor q = kb.tensor("q", dt, 4);  // for the sequence bounds (B, T, H)
  Tensor k = kb.tensor("k", dt, 4);
  Tensor w = kb.tensor("w", dt, 4);
  Tensor u = kb.tensor("u", dt, 4);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor ht = cfg.final_state ? kb.tensor("final_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor chunk_offsets = kb.tensor("chunk_offsets", DType::i32, 1);
  Tensor h = kb.tensor("h", dt, 4);      // [chunks, H, K, V]: S before each chunk
  Tensor vn = kb.tensor("v_new", dt, 4);  // [B, T, H, V]

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 1);
  Tile num_chunks = (seq.eos - seq.bos + (BT - 1)) / BT;
  Tile first_chunk = load(chunk_offsets, {i_n}, {kIndex});
  Tile v0 = i_v * BV;
  AccessOptions in_seq{.limits = {{1, seq.eos}}};

  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});
  // The gates' sums an iteration ahead (as delta_rule_fwd loads them: too small for the pipeliner).
  GateSums next;
  if (cfg.gated) next = gates.load(first_chunk, i_h, BT);
  auto body = [&](Tile i) {
    Tile t0 = seq.bos + i * BT;
    Tile K = load(k, {seq.b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile W = load(w, {seq.b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile U = load(u, {seq.b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile S_dt = S.to(dt);
    store(h, {first_chunk + i, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S_dt);
    Tile Vn32 = U.to(f32) - dot(W, S_dt);
    Tile Vn = Vn32.to(dt);
    store(vn, {seq.b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, Vn, in_seq);
    if (cfg.gated) {
      // As delta_rule_fwd rounds it: the decay goes on the fp32 V_new before the product.
      const ChunkLogDecays dec = next.decays();  // as the forward's walk
      next = gates.load(first_chunk + i + 1, i_h, BT);
      S = blocks::state_update(S, K, (Vn32 * expand_dims(dec.to_end(), 1)).to(dt), dec.total);
    } else {
      S = blocks::state_update(S, K, Vn);
    }
  };
  for_range_carrying(0, num_chunks, body, next.carried_with(S));
  if (cfg.final_state) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_delta_bwd_dstates(const DeltaChunkedBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_bwd_dstates" : "delta_rule_bwd_dstates");
  kb.set_num_warps(cfg.walk_warps);
  kb.set_producer_warps(cfg.walk_producer_warps);
  kb.set_min_ctas_per_sm(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor w = kb.tensor("w", dt, 4);
  Tensor dout = kb.tensor("do", dt, 4);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  Tensor dht = cfg.final_state_grad ? kb.tensor("dfinal_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor chunk_offsets = kb.tensor("chunk_offsets", DType::i32, 1);
  Tensor dh = kb.tensor("dh", dt, 4);        // [chunks, H, K, V]: dL/dS' after each chunk
  Tensor dvn = kb.tensor("dv_new", dt, 4);   // [B, T, H, V]
  Tensor dh0 = cfg.initial_state_grad ? kb.tensor("dinitial_state", f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 1);
  Tile num_chunks = (seq.eos - seq.bos + (BT - 1)) / BT;
  Tile first_chunk = load(chunk_offsets, {i_n}, {kIndex});
  Tile v0 = i_v * BV;
  AccessOptions in_seq{.limits = {{1, seq.eos}}};
  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile pairs_t = row <= col;  // P^T's pairs: (c, r) with r >= c

  Tile dS = zeros({BK, BV}, f32);
  if (cfg.final_state_grad) dS = load(dht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});
  // The gates' sums an iteration ahead (the chunk before; the first chunk's again at the end, unused).
  GateSums next;
  if (cfg.gated) next = gates.load(first_chunk + maximum(num_chunks - 1, 0), i_h, BT);
  auto body = [&](Tile j) {
    Tile i = num_chunks - 1 - j;
    Tile t0 = seq.bos + i * BT;
    Tile Q = load(q, {seq.b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile K = load(k, {seq.b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile W = load(w, {seq.b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile dO = load(dout, {seq.b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile dS_dt = dS.to(dt);
    store(dh, {first_chunk + i, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, dS_dt);
    // (Q K^T .* M)^T as K Q^T masked to r <= c: the transpose is taken before the mask.
    Tile Pt = where(pairs_t, dot(K, Q.T()) * scale, 0.0f);
    if (cfg.gated) {
      const ChunkLogDecays dec = next.decays();  // as the forward's walk
      next = gates.load(first_chunk + maximum(i - 1, 0), i_h, BT);
      Pt = Pt * dec.between(pairs_t, /*reverse=*/true);  // Gam[c, r] = exp(b_c - b_r), c >= r
      // The row factors on the [BT, BV] tiles, not on K and Q ([BT, BK], read from their copies as loaded):
      // (diag(f) K) dS' = diag(f) (K dS') and (diag(e) Q)^T dO = Q^T (diag(e) dO). Scaling K and Q
      // (converted, multiplied, rounded and stored back for the products) was a third of the gated
      // walk's samples at bv 32 (ncu, docs/ops/delta_rule.md, "Measured").
      Tile dVn32 = dot(Pt.to(dt), dO) + dot(K, dS_dt) * expand_dims(dec.to_end(), 1);
      store(dvn, {seq.b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, dVn32.to(dt), in_seq);
      // dS' exp(total) + Q^T (diag(e) dO) scale - W^T dVn as two products accumulating into the decayed
      // state (compiler/passes/dot_accumulate.h): the scale goes on e (dOe is rounded either way), dVn
      // is negated before rounding (exact). One [BK, BV] tile of registers stands through them, not
      // three (fp32 at K = V = 128 spilled 24 bytes at 255 registers so). One statement per step: in
      // `dS * exp(total) + dot(..)` the C++ compiler may evaluate the product first, which records it
      // before its accumulator (a product from zero, then an add).
      Tile dOe = (dO.to(f32) * expand_dims(dec.from_start() * scale, 1)).to(dt);
      dS = dS * exp(dec.total);
      dS = dS + dot(Q.T(), dOe);
      dS = dS + dot(W.T(), (-dVn32).to(dt));
    } else {
      Tile dVn32 = dot(Pt.to(dt), dO) + dot(K, dS_dt);
      store(dvn, {seq.b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, dVn32.to(dt), in_seq);
      // As the gated form's, W^T dVn accumulating into the state; Q^T dO apart, its scale after the
      // product (on dO it would round dO again).
      dS = dS + dot(W.T(), (-dVn32).to(dt));
      dS = dS + dot(Q.T(), dO) * scale;
    }
  };
  for_range_carrying(0, num_chunks, body, next.carried_with(dS));
  if (cfg.initial_state_grad) store(dh0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, dS);
  return kb.finish();
}

namespace {

/// The terms of one chunk's gradients that sum over the value columns, accumulated over column steps of
/// the per-chunk kernel (one step when all of V fits its shared memory): with Vb = V diag(beta),
///   dP = dO Vn^T, dQs = dO S^T, VdS = Vn dS'^T, dW = -dVn S^T, dTv = dVn Vb^T (or dVn V^T: see dT below),
///   dBv = rowsum(dVb .* V) with dVb = T^T dVn (whose columns, times beta, are dv's: stored per step).
/// S and dS' are [K, columns] blocks of the state and its gradient; sSdS = sum(dS' .* S) (the gate's).
struct ValueSums {
  Tile dP, dQs, VdS, dW, dTv, dBv, sSdS;
};

/// acc += x, where an invalid acc (no step yet, straight-line code) takes x as it is.
void accumulate(Tile& acc, const Tile& x) { acc = acc.valid() ? acc + x : x; }

/// An fp32 sum carried over the value steps and its shape ({} for a scalar).
struct StepSum {
  Tile* sum;
  std::vector<int64_t> shape;
};

/// Runs step(v0) over the value columns in `steps` steps of CV columns: straight-line code for one step (the
/// sums, left invalid, take the step's terms through accumulate), else a loop carrying `sums`, each set to
/// zeros first.
void over_value_steps(int64_t steps, int64_t CV, const std::vector<StepSum>& sums,
                      const std::function<void(const Tile&)>& step) {
  if (steps == 1) {
    step(constant(0, DType::i32));
    return;
  }
  std::vector<Tile*> carried;
  for (const StepSum& s : sums) {
    *s.sum = s.shape.empty() ? constant(0, DType::f32) : zeros(s.shape, DType::f32);
    carried.push_back(s.sum);
  }
  for_range_carrying(0, steps, [&](Tile i) { step(i * CV); }, carried);
}

/// Through the UT transform of one chunk of BT rows, the adjoint (see the top of this file) given the value
/// sums. Tt = T^T as delta_rule_wy stored it (rounded to the input dtype, as the products use it; rows past
/// the sequence end load 0 and meet only zero rows of dT and dW); dW in the input dtype; G = K K^T;
/// beta_r and k_factor ([BT, 1]) the row factors of V in U and of K in W (beta, gated beta exp(b)); Gam and
/// from_start = exp(b) ([BT]) the gate's (invalid: ungated); strict the mask r > c. dK = dK_in + dK's UT
/// terms; dKbK = rowsum(dKb .* K).
///
/// dT = dW (diag(k_factor) K)^T + dU (diag(beta) V)^T is the caller's (`form_dT`, called after dKb): its
/// factors go on copies of K and V rounded for the tensor cores, or on the columns of its [BT, BT]
/// products (no [BT, K] and [BT, V] copies to convert, scale, round and store; the first use of V was the
/// per-chunk kernel's hottest stall in ncu). The products' form measured faster in build_delta_bwd_chunk
/// (H200, gated 1.359 -> 1.303 ms at B8 T4096 H16 D128: docs/ops/delta_rule.md, "Measured"); in
/// build_delta_bwd_chunk_ut ptxas 13.0 then spilled the fp32 form (255 registers), which keeps the copies.
struct UtAdjoint {
  Tile dKb, dKbK, dA, dK, dBeta;
};

UtAdjoint ut_adjoint(const Tile& Tt, const Tile& dW, const std::function<Tile()>& form_dT, const Tile& dBv,
                     const Tile& K, const Tile& G, const Tile& beta_r, const Tile& k_factor, const Tile& Gam,
                     const Tile& from_start, const Tile& dK_in, const Tile& strict, DType dt) {
  const DType f32 = DType::f32;
  UtAdjoint r;
  r.dKb = dot(Tt, dW);
  Tile dT = form_dT();
  r.dA = where(strict, dot(dot(Tt, dT.to(dt)).to(dt), Tt) * -1.0f, 0.0f);
  Tile dA_gam = Gam.valid() ? r.dA * Gam : r.dA;  // dL/d(beta_r G_rc)
  Tile dG = dA_gam * beta_r;
  r.dK = dK_in + r.dKb * k_factor + dot(dG.to(dt), K) + dot(dG.T().to(dt), K);
  r.dKbK = sum(r.dKb * K.to(f32), 1);
  Tile kdkb = from_start.valid() ? r.dKbK * from_start : r.dKbK;
  r.dBeta = dBv + kdkb + sum(dA_gam * G, 1);
  return r;
}

/// The output's terms of one chunk from the value sums: dPm = dP .* Gam .* M * scale, dQ's state term dQs
/// (gated: times exp(b)), dQ and dK's output terms. Gam, e_b = exp(b) and to_end = exp(b_C - b) are the
/// gate's (invalid: ungated).
struct OutputTerms {
  Tile dPm, dQs, dQ, dK;
};

OutputTerms output_terms(const Tile& Q, const Tile& K, const ValueSums& vs, const Tile& scale, const Tile& causal,
                         const Tile& Gam, const Tile& e_b, const Tile& to_end, DType dt) {
  OutputTerms r;
  r.dPm = vs.dP * scale;
  if (Gam.valid()) r.dPm = r.dPm * Gam;
  r.dPm = where(causal, r.dPm, 0.0f);
  r.dQs = vs.dQs * scale;
  if (e_b.valid()) r.dQs = r.dQs * e_b;
  r.dQ = r.dQs + dot(r.dPm.to(dt), K);
  r.dK = dot(r.dPm.T().to(dt), Q) + (to_end.valid() ? vs.VdS * to_end : vs.VdS);
  return r;
}

/// One chunk's gate factors, from the gates' sums (chunk_gate_sums, already in the backward's plan for
/// its walks): Gam = exp(b_r - b_c) where `causal` holds (1 elsewhere: every use is masked), exp(b_r),
/// exp(b_C - b_r) ([BT] each) and exp(b_C), gates below the floor set apart (ChunkLogDecays) as the
/// walks take them. (Summing the chunk's gates here cost a [BT] scan and a [BT, BT] scan per chunk.)
struct ChunkGate {
  Tile Gam, from_start, to_end, end_decay;
};

ChunkGate chunk_gate(const GateSumTables& gates, const Tile& global_chunk, const Tile& i_h, int64_t BT,
                     const Tile& causal) {
  const ChunkLogDecays dec = gates.load(global_chunk, i_h, BT).decays();
  return {dec.between(causal), dec.from_start(), dec.to_end(), exp(dec.total)};
}

}  // namespace

std::shared_ptr<ir::Kernel> build_delta_bwd_chunk(const DeltaChunkedBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, CV = cfg.chunk_v;
  if (CV <= 0 || cfg.full_v % CV != 0)
    throw InternalError(fmt::format("delta_bwd_chunk: {} value columns per step do not divide {}", CV, cfg.full_v));
  const int64_t steps = cfg.full_v / CV;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_bwd_chunk" : "delta_rule_bwd_chunk");
  kb.set_num_warps(cfg.num_warps);
  kb.set_min_ctas_per_sm(1);
  kb.set_num_stages(steps > 1 ? cfg.step_stages : 1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor beta = kb.tensor("beta", f32, 3);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor vn = kb.tensor("v_new", dt, 4);
  Tensor dvn = kb.tensor("dv_new", dt, 4);
  Tensor h = kb.tensor("h", dt, 4);
  Tensor dh = kb.tensor("dh", dt, 4);
  Tensor t_mat = kb.tensor("t_mat", dt, 4);  // T by rows, from delta_rule_wy
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, cfg.varlen);
  Tensor dq = kb.tensor("dq", dt, 4);
  Tensor dk = kb.tensor("dk", dt, 4);
  Tensor dv = kb.tensor("dv", dt, 4);
  Tensor dbeta = kb.tensor("dbeta", f32, 3);
  Tensor dg = cfg.gated ? kb.tensor("dg", f32, 3) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  // Which chunk: (sequence, chunk of it) from chunk_indices with varlen, else (batch row, program).
  Tile i_c = program_id(0), i_x = program_id(1);
  const ChunkBounds cb = index_tables.bounds(q, i_c, i_x, BT);
  const Tile b = cb.b, i_h = cb.i_h, global_chunk = cb.global_chunk, t0 = cb.t0;
  const AccessOptions& in_seq = cb.in_seq;
  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile causal = row >= col, strict = row > col;

  Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile beta_c = load(beta, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq);
  Tile beta_r = expand_dims(beta_c, 1);
  Tile Tt = load(t_mat, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BT}, in_seq).T();

  // The value sums (ValueSums), over column steps of CV: each step's dv columns are stored as they come.
  ValueSums vs;
  auto value_step = [&](const Tile& v0) {
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
    Tile dO = load(dout, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
    Tile Vn = load(vn, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
    Tile dVn = load(dvn, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
    Tile S = load(h, {global_chunk, i_h, 0, v0}, {kIndex, kIndex, BK, CV});
    Tile dS1 = load(dh, {global_chunk, i_h, 0, v0}, {kIndex, kIndex, BK, CV});
    accumulate(vs.dP, dot(dO, Vn.T()));
    accumulate(vs.dQs, dot(dO, S.T()));
    accumulate(vs.VdS, dot(Vn, dS1.T()));
    accumulate(vs.dW, dot(dVn, S.T()) * -1.0f);
    accumulate(vs.dTv, dot(dVn, V.T()));  // beta goes on the product (ut_adjoint's dT)
    Tile dVb = dot(Tt, dVn);
    accumulate(vs.dBv, sum(dVb * V.to(f32), 1));
    if (cfg.gated) accumulate(vs.sSdS, sum(sum(dS1.to(f32) * S.to(f32), 1), 0));
    store(dv, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, (dVb * beta_r).to(dt), in_seq);
  };
  std::vector<StepSum> sums = {{&vs.dP, {BT, BT}}, {&vs.dQs, {BT, BK}}, {&vs.VdS, {BT, BK}},
                                {&vs.dW, {BT, BK}},  {&vs.dTv, {BT, BT}}, {&vs.dBv, {BT}}};
  if (cfg.gated) sums.push_back({&vs.sSdS, {}});
  over_value_steps(steps, CV, sums, value_step);

  // The gate: b (chunk-local cumulative log-decay), b_C, Gam = exp(b_r - b_c) where r >= c.
  ChunkGate gate;
  Tile e_b, to_end;
  if (cfg.gated) {
    gate = chunk_gate(gates, global_chunk, i_h, BT, causal);
    e_b = expand_dims(gate.from_start, 1);
    to_end = expand_dims(gate.to_end, 1);
  }
  const Tile& Gam = gate.Gam;

  const OutputTerms out = output_terms(Q, K, vs, scale, causal, Gam, e_b, to_end, dt);
  const Tile &dPm = out.dPm, &dQs = out.dQs;
  Tile dK = out.dK;
  // dq is final here: stored before the UT adjoint, whose tiles then need not stand beside it; and the
  // gate's row sums of dQs and VdS ([BT, K] each) taken here, so that neither stands through it either
  // (the 4-warp form spilled 28 bytes with them held).
  store(dq, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, out.dQ.to(dt), in_seq);
  Tile qdq, Y;
  if (cfg.gated) {
    qdq = sum(dQs * Q.to(f32), 1);
    Y = sum(vs.VdS * K.to(f32), 1) * gate.to_end;
  }

  // Through the UT transform (ut_adjoint). A is only needed for the gate's terms; G for dbeta.
  Tile G = dot(K, K.T());
  Tile A;
  if (cfg.gated) A = where(strict, G * beta_r * Gam, 0.0f);
  Tile k_factor = cfg.gated ? beta_c * gate.from_start : beta_c;  // W = T diag(beta exp(b)) K
  const Tile dW = vs.dW.to(dt);
  auto form_dT = [&] { return dot(dW, K.T()) * expand_dims(k_factor, 0) + vs.dTv * expand_dims(beta_c, 0); };
  const UtAdjoint ut = ut_adjoint(Tt, dW, form_dT, vs.dBv, K, G, beta_r, expand_dims(k_factor, 1), Gam,
                                  gate.from_start, dK, strict, dt);
  dK = ut.dK;

  if (cfg.gated) {
    // db per row from every place b enters (see the top of this file), then dg = suffix sums + db_C.
    Tile Z1 = dPm * dot(Q, K.T());  // dP .* P
    Tile Z2 = ut.dA * A;
    Tile db = sum(Z1, 1) - sum(Z1, 0) + sum(Z2, 1) - sum(Z2, 0) + qdq + ut.dKbK * k_factor - Y;
    Tile db_C = sum(Y, 0) + gate.end_decay * vs.sSdS;
    store(dg, {b, t0, i_h}, {kIndex, BT, kIndex}, cumsum(db, 0, true) + db_C, in_seq);
  }

  store(dk, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, dK.to(dt), in_seq);
  store(dbeta, {b, t0, i_h}, {kIndex, BT, kIndex}, ut.dBeta, in_seq);
  return kb.finish();
}

// ---- The per-chunk work in key blocks (gated_delta_rule above head dim 128) ----------------------------
// At K = V = 256 the one per-chunk kernel holds [BT, K] accumulators (dQs, VdS, dW) beside Q, K, the UT
// transform's tiles and (gated) the gate's: 255 registers with spills, one program per SM. Split in two:
// delta_bwd_chunk_keys, one program per (chunk, key block of CK columns), computes every term whose sum
// runs over V (value_step's, for its key columns) and what follows from them column by column: dq
// (final), dK's output terms and dW (to scratch), and the gate's row sums per key block (to scratch,
// summed in block order by the next kernel: no atomics); then delta_bwd_chunk_ut, one program per
// chunk, the terms that need every key column: the UT adjoint (dT = dW Kb^T + dVn Vb^T, dA, dK's UT
// terms, dbeta), dv, and the gate's dg. Faster above head dim 128 (docs/ops/delta_rule.md, "Measured";
// delta_bwd_chunk_key_columns in op_bwd.cpp).

std::shared_ptr<ir::Kernel> build_delta_bwd_chunk_keys(const DeltaChunkedBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, CK = cfg.chunk_k, CV = cfg.chunk_v;
  if (CV <= 0 || cfg.full_v % CV != 0 || CK <= 0 || cfg.block_k % CK != 0)
    throw InternalError(fmt::format("delta_bwd_chunk_keys: steps {}x{} do not divide {}x{}", CK, CV, cfg.block_k, cfg.full_v));
  const int64_t steps = cfg.full_v / CV;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_bwd_chunk_keys" : "delta_rule_bwd_chunk_keys");
  kb.set_num_warps(cfg.keys_warps);
  kb.set_min_ctas_per_sm(1);
  kb.set_num_stages(cfg.step_stages);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor vn = kb.tensor("v_new", dt, 4);
  Tensor dvn = kb.tensor("dv_new", dt, 4);
  Tensor h = kb.tensor("h", dt, 4);
  Tensor dh = kb.tensor("dh", dt, 4);
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, cfg.varlen);
  Tensor dq = kb.tensor("dq", dt, 4);
  Tensor dk_out = kb.tensor("dk_out", f32, 4);  // [B, T, H, K]: dK's output terms
  Tensor dw = kb.tensor("dw", dt, 4);           // [B, T, H, K]: dW, rounded as ut_adjoint takes it
  // The gate's per-key-block sums: rowsum(dQs .* Q), rowsum(VdS .* K) ([blocks, B, T, H]) and
  // sum(dS' .* S) ([blocks, chunks, H]).
  Tensor dqs_q = cfg.gated ? kb.tensor("dqs_q", f32, 4) : Tensor();
  Tensor vds_k = cfg.gated ? kb.tensor("vds_k", f32, 4) : Tensor();
  Tensor ssds = cfg.gated ? kb.tensor("ssds", f32, 3) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  Tile i_c = program_id(0), i_x = program_id(1), i_k = program_id(2);
  const ChunkBounds cb = index_tables.bounds(q, i_c, i_x, BT);
  const Tile b = cb.b, i_h = cb.i_h, global_chunk = cb.global_chunk, t0 = cb.t0;
  const AccessOptions& in_seq = cb.in_seq;
  const AccessOptions in_parts{.limits = {{2, cb.eos}}};  // the [blocks, B, T, H] sums: T is dim 2
  Tile k0 = i_k * CK;
  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile causal = row >= col;

  Tile Q = load(q, {b, t0, i_h, k0}, {kIndex, BT, kIndex, CK}, in_seq);
  Tile K = load(k, {b, t0, i_h, k0}, {kIndex, BT, kIndex, CK}, in_seq);

  // value_step's sums for this program's key columns (dP over all of V, the same in every key block).
  Tile dP, dQs, VdS, dW, sSdS;
  auto value_step = [&](const Tile& v0) {
    Tile dO = load(dout, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
    Tile Vn = load(vn, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
    Tile dVn = load(dvn, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
    Tile S = load(h, {global_chunk, i_h, k0, v0}, {kIndex, kIndex, CK, CV});
    Tile dS1 = load(dh, {global_chunk, i_h, k0, v0}, {kIndex, kIndex, CK, CV});
    accumulate(dP, dot(dO, Vn.T()));
    accumulate(dQs, dot(dO, S.T()));
    accumulate(VdS, dot(Vn, dS1.T()));
    accumulate(dW, dot(dVn, S.T()) * -1.0f);
    if (cfg.gated) accumulate(sSdS, sum(sum(dS1.to(f32) * S.to(f32), 1), 0));
  };
  std::vector<StepSum> sums = {{&dP, {BT, BT}}, {&dQs, {BT, CK}}, {&VdS, {BT, CK}}, {&dW, {BT, CK}}};
  if (cfg.gated) sums.push_back({&sSdS, {}});
  over_value_steps(steps, CV, sums, value_step);

  Tile dPm = dP * scale;
  dQs = dQs * scale;
  Tile to_end_VdS = VdS;
  if (cfg.gated) {
    const ChunkGate gate = chunk_gate(gates, global_chunk, i_h, BT, causal);
    dPm = dPm * gate.Gam;
    dQs = dQs * expand_dims(gate.from_start, 1);
    to_end_VdS = VdS * expand_dims(gate.to_end, 1);
  }
  dPm = where(causal, dPm, 0.0f);
  store(dq, {b, t0, i_h, k0}, {kIndex, BT, kIndex, CK}, (dQs + dot(dPm.to(dt), K)).to(dt), in_seq);
  store(dk_out, {b, t0, i_h, k0}, {kIndex, BT, kIndex, CK}, dot(dPm.T().to(dt), Q) + to_end_VdS, in_seq);
  store(dw, {b, t0, i_h, k0}, {kIndex, BT, kIndex, CK}, dW.to(dt), in_seq);
  if (cfg.gated) {
    store(dqs_q, {i_k, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, sum(dQs * Q.to(f32), 1), in_parts);
    store(vds_k, {i_k, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, sum(VdS * K.to(f32), 1), in_parts);
    store(ssds, {i_k, global_chunk, i_h}, {kIndex, kIndex, kIndex}, sSdS);
  }
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_delta_bwd_chunk_ut(const DeltaChunkedBwdConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, CV = cfg.chunk_v;
  const int64_t steps = cfg.full_v / CV, key_blocks = cfg.block_k / cfg.chunk_k;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_bwd_chunk_ut" : "delta_rule_bwd_chunk_ut");
  kb.set_num_warps(cfg.num_warps);
  kb.set_min_ctas_per_sm(1);
  kb.set_num_stages(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor beta = kb.tensor("beta", f32, 3);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  Tensor dout = cfg.gated ? kb.tensor("do", dt, 4) : Tensor();
  Tensor vn = cfg.gated ? kb.tensor("v_new", dt, 4) : Tensor();
  Tensor dvn = kb.tensor("dv_new", dt, 4);
  Tensor t_mat = kb.tensor("t_mat", dt, 4);
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, cfg.varlen);
  Tensor dk_out = kb.tensor("dk_out", f32, 4);
  Tensor dw = kb.tensor("dw", dt, 4);
  Tensor dqs_q = cfg.gated ? kb.tensor("dqs_q", f32, 4) : Tensor();
  Tensor vds_k = cfg.gated ? kb.tensor("vds_k", f32, 4) : Tensor();
  Tensor ssds = cfg.gated ? kb.tensor("ssds", f32, 3) : Tensor();
  Tensor dk = kb.tensor("dk", dt, 4);
  Tensor dv = kb.tensor("dv", dt, 4);
  Tensor dbeta = kb.tensor("dbeta", f32, 3);
  Tensor dg = cfg.gated ? kb.tensor("dg", f32, 3) : Tensor();
  Tile scale = kb.scalar("scale", f32);

  Tile i_c = program_id(0), i_x = program_id(1);
  const ChunkBounds cb = index_tables.bounds(q, i_c, i_x, BT);
  const Tile b = cb.b, i_h = cb.i_h, global_chunk = cb.global_chunk, t0 = cb.t0;
  const AccessOptions& in_seq = cb.in_seq;
  const AccessOptions in_parts{.limits = {{2, cb.eos}}};
  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile causal = row >= col, strict = row > col;

  Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile beta_c = load(beta, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq);
  Tile beta_r = expand_dims(beta_c, 1);
  Tile Tt = load(t_mat, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BT}, in_seq).T();

  // The value sums the UT adjoint needs (dTv, dBv; the gate's dP), dv stored per step.
  ValueSums vs;
  auto value_step = [&](const Tile& v0) {
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
    Tile dVn = load(dvn, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
    Tile Vb = (V.to(f32) * beta_r).to(dt);
    accumulate(vs.dTv, dot(dVn, Vb.T()));
    Tile dVb = dot(Tt, dVn);
    accumulate(vs.dBv, sum(dVb * V.to(f32), 1));
    if (cfg.gated) {
      Tile dO = load(dout, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
      Tile Vn = load(vn, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, in_seq);
      accumulate(vs.dP, dot(dO, Vn.T()));
    }
    store(dv, {b, t0, i_h, v0}, {kIndex, BT, kIndex, CV}, (dVb * beta_r).to(dt), in_seq);
  };
  std::vector<StepSum> sums = {{&vs.dTv, {BT, BT}}, {&vs.dBv, {BT}}};
  if (cfg.gated) sums.push_back({&vs.dP, {BT, BT}});
  over_value_steps(steps, CV, sums, value_step);

  ChunkGate gate;
  if (cfg.gated) gate = chunk_gate(gates, global_chunk, i_h, BT, causal);
  const Tile& Gam = gate.Gam;
  Tile G = dot(K, K.T());
  Tile dW = load(dw, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile dK_out = load(dk_out, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile k_factor = cfg.gated ? beta_r * expand_dims(gate.from_start, 1) : beta_r;
  Tile Kb32 = K.to(f32) * k_factor;
  Tile Kb = Kb32.to(dt);
  auto form_dT = [&] { return dot(dW, Kb.T()) + vs.dTv; };  // on copies: see ut_adjoint
  const UtAdjoint ut = ut_adjoint(Tt, dW, form_dT, vs.dBv, K, G, beta_r, k_factor, Gam, gate.from_start, dK_out,
                                  strict, dt);

  if (cfg.gated) {
    // As build_delta_bwd_chunk's db, with the key-block sums of the first kernel added in block order.
    Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile dPm = where(causal, vs.dP * scale * Gam, 0.0f);
    Tile Z1 = dPm * dot(Q, K.T());
    Tile Z2 = ut.dA * where(strict, G * beta_r * Gam, 0.0f);
    Tile dqsq, vdsk, sds;
    for (int64_t c = 0; c < key_blocks; ++c) {
      accumulate(dqsq, load(dqs_q, {c, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, in_parts));
      accumulate(vdsk, load(vds_k, {c, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, in_parts));
      accumulate(sds, load(ssds, {c, global_chunk, i_h}, {kIndex, kIndex, kIndex}));
    }
    Tile Y = vdsk * gate.to_end;
    Tile db = sum(Z1, 1) - sum(Z1, 0) + sum(Z2, 1) - sum(Z2, 0) + dqsq + sum(ut.dKb * Kb32, 1) - Y;
    Tile db_C = sum(Y, 0) + gate.end_decay * sds;
    store(dg, {b, t0, i_h}, {kIndex, BT, kIndex}, cumsum(db, 0, true) + db_C, in_seq);
  }
  store(dk, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, ut.dK.to(dt), in_seq);
  store(dbeta, {b, t0, i_h}, {kIndex, BT, kIndex}, ut.dBeta, in_seq);
  return kb.finish();
}

}  // namespace linac
