#include "kernels/poly/fwd.h"

#include "kernels/common/prologue.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {

/// First row of state2 holding the entries (d, e >= d): sum_{j<d} (K - j).
Tile state2_row(const Tile& d, const Tile& K) { return d * (2 * K - d + 1) / 2; }

/// Width of the tiles of the normalizer state (a value of 1 per token): the narrowest dot operand.
constexpr int64_t kOnes = 16;

/// Weights of the symmetric part along e - d = 0, 1, ...: the diagonal counts once, the other
/// entries stand for both (d, e) and (e, d).
Tile symmetric_weights(int64_t BK) {
  return where(iota(BK) == 0, full({BK}, 1.0, DType::f32), full({BK}, 2.0, DType::f32));
}

}  // namespace

// Both chunked kernels run one program per (V block, sequence x head) that walks the chunks of its
// sequence in order. With x = scale Q K^T and F = f(x) .* M (M the causal mask), per chunk:
//   num = F V + a s0 + b scale Q S1 + O2,      O2 = c scale^2 sum_d (q_d Q_{:,d:} .* w) S2[d]
//   den = rowsum(F) + a n + b scale Q z1 + D2,  D2 = c scale^2 sum_d (q_d Q_{:,d:} .* w) Z2[d]
// where n counts the earlier tokens, s0 = sum v, S1 = sum k^T v and z1 = sum k (registers of
// poly_fwd), and S2[d] = sum (k_d K_{:,d:})^T v, Z2[d] = sum k_d K_{:,d:} are row d of the symmetric
// parts (e >= d, weights w) of the degree-2 states (state2, norm2). poly_fwd_deg2 computes O2 and D2
// into o2 and den2, one d at a time (one [BK, BV] slice of S2 live); poly_fwd does the rest. Fused,
// the kernel spills at every configuration tried; split, neither does. Both kernels must use the
// same chunks. Chunk 0 reads no scratch (the state is empty), so the scratch needs no zeroing and
// repeated launches are independent.

std::shared_ptr<ir::Kernel> build_poly_fwd_deg2(const PolyConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_fwd_deg2");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor s2 = kb.tensor("state2", f32, 3);
  Tensor o2 = kb.tensor("o2", f32, 4);
  Tensor n2 = cfg.normalize ? kb.tensor("norm2", f32, 3) : Tensor();
  Tensor d2 = cfg.normalize ? kb.tensor("den2", f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", f32);
  Tile cc = kb.scalar("c", f32);

  Tile i_v = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2), Kdim = q.dim(3);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(q, cu, cfg.varlen, i_n);
  Tile b = seq.b, bos = seq.bos, eos = seq.eos;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;
  Tile c2 = cc * scale * scale;
  Tile sym_w = symmetric_weights(BK);
  AccessOptions in_seq{.limits = {{1, eos}}};
  // The normalizer state Z2 goes through the same loop as S2, as the state of a value that is 1 on
  // every token (`ones`): norm2 [grid[0]*N*H, K(K+1)/2, 1], a slab per program. Its tiles are kOnes
  // columns wide (the narrowest dot): loads read column 0 (the others are masked to 0), stores and
  // den2 [B,T,H,1] take column 0.
  Tile n2_slab = i_nh * num_programs(0) + i_v;
  // Every V block computes the denominator; the first one stores it (the others' stores mask all).
  Tile den_end = eos * (1 - minimum(i_v, 1));
  Tile row = expand_dims(iota(BT), 1);

  auto chunk = [&](Tile i) {
    Tile t0 = bos + i * BT;
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile in_chunk = broadcast_to(row < eos - t0, {BT, kOnes});
    Tile ones = where(in_chunk, full({BT, kOnes}, 1.0, dt), full({BT, kOnes}, 0.0, dt));
    Tile O = zeros({BT, BV}, f32);
    Tile D = zeros({BT, kOnes}, f32);
    auto step = [&](Tile d) {
      Tile row0 = state2_row(d, Kdim), rows = Kdim - d;
      // Columns d of Q and K, and Q, K shifted left by d (columns e = d, d+1, ... masked past K).
      // Rows past the sequence end need no mask here: V and `ones` are zero there, and those output
      // rows are never stored.
      Tile qd = load(q, {b, t0, i_h, d}, {kIndex, BT, kIndex, kIndex}).to(f32);
      Tile kd = load(k, {b, t0, i_h, d}, {kIndex, BT, kIndex, kIndex}).to(f32);
      Tile Qs = load(q, {b, t0, i_h, d}, {kIndex, BT, kIndex, BK});
      Tile Ks = load(k, {b, t0, i_h, d}, {kIndex, BT, kIndex, BK});
      // Before chunk 1 the state is empty: read nothing (the limit masks every row).
      AccessOptions before{.limits = {{1, row0 + rows * minimum(i, 1)}}};
      Tile S2 = load(s2, {i_nh, row0, v0}, {kIndex, BK, BV}, before);
      Tile Qw = (Qs.to(f32) * expand_dims(qd * c2, 1) * expand_dims(sym_w, 0)).to(dt);
      O = O + dot(Qw, S2.to(dt));
      Tile Kw = (Ks.to(f32) * expand_dims(kd, 1)).to(dt);
      S2 = S2 + dot(Kw.T(), V);
      store(s2, {i_nh, row0, v0}, {kIndex, BK, BV}, S2, {.limits = {{1, row0 + rows}}});
      if (cfg.normalize) {
        Tile Z2 = load(n2, {n2_slab, row0, 0}, {kIndex, BK, kOnes}, before);
        D = D + dot(Qw, Z2.to(dt));
        store(n2, {n2_slab, row0, 0}, {kIndex, BK, kOnes}, Z2 + dot(Kw.T(), ones), {.limits = {{1, row0 + rows}}});
      }
    };
    if (cfg.normalize)
      for_range(0, Kdim, step, O, D);
    else
      for_range(0, Kdim, step, O);
    store(o2, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O, in_seq);
    if (cfg.normalize) store(d2, {b, t0, i_h, 0}, {kIndex, BT, kIndex, kOnes}, D, {.limits = {{1, den_end}}});
  };
  for_range(0, num_chunks, chunk);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_poly_fwd(const PolyConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_fwd");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor o2 = cfg.quadratic ? kb.tensor("o2", f32, 4) : Tensor();
  Tensor d2 = cfg.quadratic && cfg.normalize ? kb.tensor("den2", f32, 4) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);
  Tile ca = kb.scalar("a", f32);
  Tile cb = kb.scalar("b", f32);
  Tile cc = cfg.quadratic ? kb.scalar("c", f32) : Tile();

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 1);
  auto [b, bos, eos] = seq;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;

  Tile s0 = zeros({BV}, f32);
  Tile S1 = zeros({BK, BV}, f32);
  Tile z1 = zeros({BK}, f32);
  Tile causal = expand_dims(iota(BT), 1) >= expand_dims(iota(BT), 0);
  AccessOptions in_seq{.limits = {{1, eos}}};

  auto chunk = [&](Tile i) {
    Tile t0 = bos + i * BT;
    Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile X = dot(Q, K.T()) * scale;
    Tile fx = cfg.quadratic ? ca + X * (cb + cc * X) : ca + cb * X;
    Tile F = where(causal, fx, 0.0f);
    Tile O = dot(F.to(dt), V) + expand_dims(s0 * ca, 0) + dot(Q, S1.to(dt)) * (cb * scale);
    if (cfg.quadratic) O = O + load(o2, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    if (cfg.normalize) {
      Tile n_before = (i * BT).to(f32);
      Tile den = sum(F, 1) + sum(Q.to(f32) * expand_dims(z1 * (cb * scale), 0), 1) + (n_before * ca + kPolyEps);
      if (cfg.quadratic) den = den + load(d2, {b, t0, i_h, 0}, {kIndex, BT, kIndex, kIndex}, in_seq);
      O = O / expand_dims(den, 1);
      z1 = z1 + sum(K.to(f32), 0);
    }
    s0 = s0 + sum(V.to(f32), 0);
    S1 = S1 + dot(K.T(), V);
    store(o, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt), in_seq);
  };
  // Only the state the configuration uses is loop-carried.
  if (cfg.normalize)
    for_range(0, num_chunks, chunk, s0, S1, z1);
  else
    for_range(0, num_chunks, chunk, s0, S1);
  return kb.finish();
}

// One program per (V block, sequence x head) walks the tokens of its sequence: the state takes the
// token, then the output reads it (s <= t inclusive). The same states as the chunked form; the
// degree-2 parts go through state2 and norm2 one row d (a [BK, BV] slice of S2) at a time.
std::shared_ptr<ir::Kernel> build_poly_recurrent(const PolyConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_recurrent");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor s2 = cfg.quadratic ? kb.tensor("state2", f32, 3) : Tensor();
  Tensor n2 = cfg.quadratic && cfg.normalize ? kb.tensor("norm2", f32, 3) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);
  Tile ca = kb.scalar("a", f32);
  Tile cb = kb.scalar("b", f32);
  Tile cc = cfg.quadratic ? kb.scalar("c", f32) : Tile();

  Tile i_v = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2), Kdim = q.dim(3);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(q, cu, cfg.varlen, i_n);
  Tile b = seq.b, bos = seq.bos, eos = seq.eos;
  Tile v0 = i_v * BV;
  Tile n2_slab = i_nh * num_programs(0) + i_v;

  Tile s0 = zeros({BV}, f32);
  Tile S1 = zeros({BK, BV}, f32);
  Tile z1 = zeros({BK}, f32);
  Tile sym_w = symmetric_weights(BK);

  auto token = [&](Tile t) {
    Tile qt = load(q, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32) * scale;
    Tile kt = load(k, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile vt = load(v, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    s0 = s0 + vt;
    S1 = S1 + expand_dims(kt, 1) * expand_dims(vt, 0);
    Tile ot = s0 * ca + sum(expand_dims(qt, 1) * S1, 0) * cb;
    Tile den;
    if (cfg.normalize) {
      z1 = z1 + kt;
      den = (t - bos + 1).to(f32) * ca + sum(qt * z1, 0) * cb + kPolyEps;
    }

    if (cfg.quadratic) {
      Tile o2 = zeros({BV}, f32);
      Tile den2 = constant(0, f32);
      auto step = [&](Tile d) {
        Tile row0 = state2_row(d, Kdim), rows = Kdim - d;
        Tile qd = load(q, {b, t, i_h, d}, {kIndex, kIndex, kIndex, kIndex}).to(f32) * scale;
        Tile kd = load(k, {b, t, i_h, d}, {kIndex, kIndex, kIndex, kIndex}).to(f32);
        Tile qs = load(q, {b, t, i_h, d}, {kIndex, kIndex, kIndex, BK}).to(f32) * scale;
        Tile ks = load(k, {b, t, i_h, d}, {kIndex, kIndex, kIndex, BK}).to(f32) * kd;
        Tile qw = qs * sym_w * qd;
        // Before the sequence's second token the state is empty: read nothing.
        AccessOptions before{.limits = {{1, row0 + rows * minimum(t - bos, 1)}}};
        AccessOptions rows_d{.limits = {{1, row0 + rows}}};
        Tile S2 = load(s2, {i_nh, row0, v0}, {kIndex, BK, BV}, before) + expand_dims(ks, 1) * expand_dims(vt, 0);
        store(s2, {i_nh, row0, v0}, {kIndex, BK, BV}, S2, rows_d);
        o2 = o2 + sum(expand_dims(qw, 1) * S2, 0);
        if (cfg.normalize) {
          // Row d of the symmetric part of Z2 = sum k^T k (norm2, one column), as S2 for v = 1.
          Tile z2 = load(n2, {n2_slab, row0, 0}, {kIndex, BK, kIndex}, before) + ks;
          store(n2, {n2_slab, row0, 0}, {kIndex, BK, kIndex}, z2, rows_d);
          den2 = den2 + sum(qw * z2, 0);
        }
      };
      if (cfg.normalize)
        for_range(0, Kdim, step, o2, den2);
      else
        for_range(0, Kdim, step, o2);
      ot = ot + o2 * cc;
      if (cfg.normalize) den = den + den2 * cc;
    }
    if (cfg.normalize) ot = ot / den;
    store(o, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}, ot.to(dt));
  };
  if (cfg.normalize)
    for_range(bos, eos, token, s0, S1, z1);
  else
    for_range(bos, eos, token, s0, S1);
  return kb.finish();
}

}  // namespace linac
