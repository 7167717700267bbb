#include "kernels/gla/fwd.h"

#include <fmt/format.h>
#include <vector>

#include "kernels/common/log_decay.h"
#include "kernels/common/prologue.h"
#include "linac/blocks.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

// One program per (16-row sub-chunk, sequence x head), all independent: the diagonal block
//   A_ii[r, c] = scale sum_d q_rd k_cd exp(L_rd - L_cd)  (r >= c; 0 above the diagonal)
// with L the cumulative sum of the sub-chunk's gates from its first row, in fp32, written to a_diag
// [B, T, H, 16] (fp32): blocks::gated_scores_diagonal, factored with a reference gate where the gates'
// spread allows (2 x 16 exps per channel instead of 16 x 16), elementwise otherwise (steep gates, e.g.
// -5 per token or -1e4).
std::shared_ptr<ir::Kernel> build_gla_intra(const GlaConfig& cfg) {
  const int64_t BK = cfg.block_k, BC = kGlaSubChunk;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_intra");
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor a_diag = kb.tensor("a_diag", f32, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_s = program_id(0);
  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 1);
  Tile b = seq.b;
  Tile ti = seq.bos + i_s * BC;  // at or past eos for the sub-chunks of the longest sequence only
  AccessOptions in_seq{.limits = {{1, seq.eos}}};

  Tile Qf = load(q, {b, ti, i_h, 0}, {kIndex, BC, kIndex, BK}, in_seq).to(f32);
  Tile Kf = load(k, {b, ti, i_h, 0}, {kIndex, BC, kIndex, BK}, in_seq).to(f32);
  // Gates floored (kernels/common/log_decay.h), here and in the elementwise form's rows: the spread and
  // L_r - L_c of -inf gates are NaN.
  Tile L = cumsum(floor_log_decay(load(g, {b, ti, i_h, 0}, {kIndex, BC, kIndex, BK}, in_seq)), 0);
  // The elementwise form's rows of k and g, read from memory one step ahead of use so that their
  // latency overlaps a step (docs/ops/gla.md, "Measured"); row 16, read at the last step, is unused.
  auto row_of = [&](const Tensor& t, const Operand& r) {
    return load(t, {b, ti + r, i_h, 0}, {kIndex, kIndex, kIndex, BK}, in_seq);
  };
  blocks::ScoreRows rows{[&](const Operand& r) { return row_of(k, r); },
                         [&](const Operand& r) { return floor_log_decay(row_of(g, r)); }};
  Tile A = blocks::gated_scores_diagonal(Qf, Kf, L, rows);
  store(a_diag, {b, ti, i_h, 0}, {kIndex, BC, kIndex, BC}, A * scale, in_seq);
  return kb.finish();
}

namespace {

/// Where a chunk is: batch row, head, first row, first value column, and the sequence-end mask.
struct GlaChunk {
  Tile b, i_h, t0, v0;
  AccessOptions in_seq;
};

/// The diagonal block A_ii (from gla_intra) of sub-chunk i of the chunk at rows t0.., [16, 16].
Tile load_diagonal_block(const Tensor& a_diag, const Tile& b, const Tile& i_h, const Tile& t0, int64_t i,
                         const AccessOptions& in_seq) {
  return load(a_diag, {b, t0 + i * kGlaSubChunk, i_h, 0}, {kIndex, kGlaSubChunk, kIndex, kGlaSubChunk}, in_seq);
}

/// All the chunk's diagonal blocks, one per sub-chunk.
std::vector<Tile> load_diagonal_blocks(const GlaConfig& cfg, const Tensor& a_diag, const Tile& b, const Tile& i_h,
                                       const Tile& t0, const AccessOptions& in_seq) {
  std::vector<Tile> A;
  for (int64_t i = 0; i < cfg.chunk / kGlaSubChunk; ++i) A.push_back(load_diagonal_block(a_diag, b, i_h, t0, i, in_seq));
  return A;
}

/// The outputs of the chunk at rows t0.. (NC sub-chunks of 16 rows) from Sd, the state before the
/// chunk in the input dtype; stores o. Returns, per sub-chunk, V_i, Kr_i = K_i .* exp(R_i) and tot_i
/// (see build_gla_fwd) for a state update.
struct GlaChunkTerms {
  std::vector<Tile> V, Kr, tot;
  Tile P;  // tot_0 + ... + tot_{NC-1}: G_C
};

GlaChunkTerms gla_chunk_outputs(const GlaConfig& cfg, const GlaChunk& c, const Tile& Sd, const Tensor& q,
                                const Tensor& k, const Tensor& v, const Tensor& g,
                                const std::function<Tile(int)>& diagonal_block, const Tensor& o, const Tile& scale) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v, BC = kGlaSubChunk;
  const int NC = static_cast<int>(cfg.chunk / BC);
  const DType dt = cfg.dtype, f32 = DType::f32;
  GlaChunkTerms r;
  r.V.resize(NC), r.Kr.resize(NC), r.tot.resize(NC);
  for (int i = 0; i < NC; ++i) {
    Tile ti = c.t0 + i * BC;
    Tile Qf = load(q, {c.b, ti, c.i_h, 0}, {kIndex, BC, kIndex, BK}, c.in_seq).to(f32);
    Tile Kf = load(k, {c.b, ti, c.i_h, 0}, {kIndex, BC, kIndex, BK}, c.in_seq).to(f32);
    r.V[i] = load(v, {c.b, ti, c.i_h, c.v0}, {kIndex, BC, kIndex, BV}, c.in_seq);
    Tile gi = floor_log_decay(load(g, {c.b, ti, c.i_h, 0}, {kIndex, BC, kIndex, BK}, c.in_seq));
    Tile L = cumsum(gi, 0);
    r.tot[i] = sum(gi, 0);  // the cumsum's last row, summed in the same order
    Tile g0 = floor_log_decay(load(g, {c.b, ti, c.i_h, 0}, {kIndex, kIndex, kIndex, BK}, c.in_seq));
    Tile A = diagonal_block(i);  // A_ii

    // Q_i .* exp(G_i - G_n) and K_i .* exp(R_i); the other decays multiply these (factors <= 1).
    Tile Qn = Qf * exp(L - expand_dims(g0, 0));
    r.Kr[i] = Kf * exp(expand_dims(r.tot[i], 0) - L);
    Tile Gn = i == 0 ? g0 : g0 + r.P;
    Tile O = dot((Qn * expand_dims(exp(Gn), 0)).to(dt), Sd) * scale;
    O = O + dot(A.to(dt), r.V[i]);
    Tile Qnd = Qn.to(dt);
    Tile decay = g0;  // from the end of sub-chunk j to the first row of sub-chunk i
    for (int j = i - 1; j >= 0; --j) {
      Tile Kn = (r.Kr[j] * expand_dims(exp(decay), 0)).to(dt);
      O = O + dot((dot(Qnd, Kn.T()) * scale).to(dt), r.V[j]);
      if (j > 0) decay = decay + r.tot[j];
    }
    store(o, {c.b, ti, c.i_h, c.v0}, {kIndex, BC, kIndex, BV}, O.to(dt), c.in_seq);
    r.P = i == 0 ? r.tot[0] : r.P + r.tot[i];
  }
  return r;
}

/// The state after a chunk from the state before it and the chunk's terms:
///   S = diag(exp(G_C)) S + sum_i (Kr_i .* exp(tot_{i+1} + ... + tot_{NC-1}))^T V_i    (t.P is G_C)
Tile gla_state_update(const Tile& S, const GlaChunkTerms& t) {
  const int NC = static_cast<int>(t.V.size());
  Tile S_next = S;
  Tile after;  // tot_{i+1} + ... + tot_{NC-1}
  for (int i = NC - 1; i >= 0; --i) {
    // The last sub-chunk's term also decays the state, its product accumulating into it in place.
    if (i == NC - 1) S_next = blocks::state_update(S, t.Kr[i], t.V[i], t.P, /*in_place=*/true);
    else S_next = blocks::state_update(S_next, t.Kr[i] * expand_dims(exp(after), 0), t.V[i]);
    after = i == NC - 1 ? t.tot[i] : after + t.tot[i];
  }
  return S_next;
}

}  // namespace

// One program per (V block, sequence x head) walks the chunks of its sequence in order, carrying the
// state S [BK, BV] in registers (the "fused chunk" schedule). A chunk is NC sub-chunks of 16 rows.
// For sub-chunk i: L_i is the cumulative sum of its gates from its first row (inclusive), tot_i its
// total, g0_i its first row, R_i = tot_i - L_i (the decay from a row to the sub-chunk's end) and
// P_i = tot_0 + ... + tot_{i-1}, so that G = P_i + L_i is the chunk-local cumulative gate and
// G_n = P_i + g0_i its value at the first row of sub-chunk i (the reference gate). Then
//   O_i  = scale (Q_i .* exp(G_i)) S + A_ii V_i + sum_{j<i} A_ij V_j
//   A_ij = scale (Q_i .* exp(L_i - g0_i)) (K_j .* exp(R_j + g0_i + tot_{j+1} + ... + tot_{i-1}))^T
//        = scale (Q_i .* exp(G_i - G_n)) (K_j .* exp(G_n - G_j))^T
//   S    = diag(exp(G_C)) S + sum_i (K_i .* exp(R_i + tot_{i+1} + ... + tot_{NC-1}))^T V_i
// with A_ii from gla_intra. Every exponent is a sum of gates, so <= 0. The decays between rows are
// sums over the rows in between rather than differences of G, so a sub-chunk of very negative gates
// (say -1e4) does not wipe out the precision of the sub-chunks after it in the same chunk. Rows past
// the sequence end load q = k = v = g = 0.
std::shared_ptr<ir::Kernel> build_gla_fwd(const GlaConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v, BC = kGlaSubChunk;
  if (BT % BC != 0) throw InternalError(fmt::format("gla: chunk {} is not a multiple of {}", BT, BC));
  const int NC = static_cast<int>(BT / BC);
  const DType dt = cfg.dtype, f32 = DType::f32;
  const bool states_only = cfg.walk == GlaWalk::segment_states;
  const bool from_segment = cfg.walk == GlaWalk::segment_outputs;
  const bool h0_in = cfg.initial_state && cfg.walk == GlaWalk::sequence;
  const bool ht_out = cfg.final_state && cfg.walk == GlaWalk::sequence;
  KernelBuilder kb(states_only ? "gla_segment_states" : "gla_fwd");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  // The segment walks run about one program per SM (kernels/common/segments.h): ptxas need not keep
  // registers for more (left to itself it held the outputs walk at 80 and spilled).
  if (cfg.walk != GlaWalk::sequence) kb.set_min_ctas_per_sm(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor a_diag = states_only ? Tensor() : kb.tensor("a_diag", f32, 4);
  Tensor h0 = h0_in ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor ht = ht_out ? kb.tensor("final_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor seg_states = states_only ? kb.tensor("segment_states", f32, 5) : Tensor();
  Tensor seg_decays = states_only ? kb.tensor("segment_decays", f32, 4) : Tensor();
  Tensor seg_inputs = from_segment ? kb.tensor("segment_inputs", f32, 5) : Tensor();
  Tensor o = states_only ? Tensor() : kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, cu, cfg.varlen, 1);
  Tile i_s = cfg.walk == GlaWalk::sequence ? Tile() : program_id(2);
  const SequenceBounds seq = i_s.valid() ? segment_bounds(seq_rows, i_s, cfg.segment) : seq_rows;
  Tile num_chunks = (seq.eos - seq.bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;

  Tile S = zeros({BK, BV}, f32);
  if (h0_in) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});
  if (from_segment) S = load(seg_inputs, {i_n, i_s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
  AccessOptions in_seq{.limits = {{1, seq.eos}}};

  if (states_only) {
    // The state update alone (gla_state_update, as below), and the segment's log-decay per channel, the
    // sum of its chunks' G_C.
    Tile decays = zeros({BK}, f32);
    for_range(0, num_chunks, [&](Tile ic) {
      Tile t0 = seq.bos + ic * BT;
      std::vector<Tile> V(NC), Kr(NC), tot(NC);
      for (int i = 0; i < NC; ++i) {
        Tile ti = t0 + i * BC;
        Tile Kf = load(k, {seq.b, ti, i_h, 0}, {kIndex, BC, kIndex, BK}, in_seq).to(f32);
        V[i] = load(v, {seq.b, ti, i_h, v0}, {kIndex, BC, kIndex, BV}, in_seq);
        Tile gi = floor_log_decay(load(g, {seq.b, ti, i_h, 0}, {kIndex, BC, kIndex, BK}, in_seq));
        tot[i] = sum(gi, 0);
        Kr[i] = Kf * exp(expand_dims(tot[i], 0) - cumsum(gi, 0));  // K_i .* exp(R_i)
      }
      GlaChunkTerms t{V, Kr, tot, Tile()};
      for (int i = 0; i < NC; ++i) t.P = i == 0 ? tot[0] : t.P + tot[i];
      S = gla_state_update(S, t);
      decays = decays + t.P;
    }, S, decays);
    store(seg_states, {i_n, i_s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV}, S);
    // One row per (sequence, segment, head): the first V block stores it, the others are masked.
    AccessOptions first_block{.limits = {{2, i_h + 1 - minimum(i_v, 1)}}};
    store(seg_decays, {i_n, i_s, i_h, 0}, {kIndex, kIndex, kIndex, BK}, decays, first_block);
    return kb.finish();
  }

  // The diagonal blocks are loaded one chunk ahead (carried), so that their latency overlaps a step:
  // [16, 16] fp32 tiles are too small for cp.async pipelining, and waiting on them was the walk's top
  // stall (docs/ops/gla.md, "Measured"). Past the last chunk the loads are masked (zeros, unused).
  std::vector<Tile> A = load_diagonal_blocks(cfg, a_diag, seq.b, i_h, seq.bos, in_seq);
  std::vector<Tile*> carried = {&S};
  for (Tile& a : A) carried.push_back(&a);
  dsl::detail::for_range(0, num_chunks, [&](Tile ic) {
    GlaChunk c{seq.b, i_h, seq.bos + ic * BT, v0, in_seq};
    std::vector<Tile> A_ahead = load_diagonal_blocks(cfg, a_diag, seq.b, i_h, c.t0 + BT, in_seq);
    GlaChunkTerms t = gla_chunk_outputs(cfg, c, S.to(dt), q, k, v, g, [&](int i) { return A[i]; }, o, scale);
    S = gla_state_update(S, t);
    A = A_ahead;
  }, carried);

  if (ht_out) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

// The split schedule (dense inputs), for parallelism where the fused one has too few programs to
// fill the GPU: gla_bwd_gates decays every chunk's keys in parallel (K .* exp(R), exp(tot)), the state
// pass gla_bwd_states walks the chunks of each (V block, sequence x head, K block) storing the state
// before every chunk into h [B, NT, H, K, V] (input dtype, as the fused kernel rounds it for the
// product), then gla_out computes every chunk's outputs in parallel from h. The first two are the
// backward's split schedule's (kernels/gla/split_bwd.h).

std::shared_ptr<ir::Kernel> build_gla_out(const GlaConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v, BC = kGlaSubChunk;
  if (BT % BC != 0) throw InternalError(fmt::format("gla: chunk {} is not a multiple of {}", BT, BC));
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_out");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor a_diag = kb.tensor("a_diag", f32, 4);
  Tensor h = kb.tensor("h", dt, 5);
  Tensor o = kb.tensor("o", dt, 4);
  // (BK is the padded key dim: h's load masks past K.)
  Tile scale = kb.scalar("scale", f32);

  Tile ic = program_id(0);
  Tile i_nh = program_id(1);
  Tile i_v = program_id(2);
  Tile H = q.dim(2), T = q.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile v0 = i_v * BV;
  Tile Sd = load(h, {b, ic, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
  GlaChunk c{b, i_h, ic * BT, v0, AccessOptions{.limits = {{1, T}}}};
  // Each A_ii loaded where it is used (loaded together up front, gla_out spilled 4 bytes in fp16).
  auto diagonal_block = [&](int i) { return load_diagonal_block(a_diag, c.b, c.i_h, c.t0, i, c.in_seq); };
  gla_chunk_outputs(cfg, c, Sd, q, k, v, g, diagonal_block, o, scale);
  return kb.finish();
}

}  // namespace linac
