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

// One program per (chunk, sequence x head), all in parallel: what the walk needs of a chunk, so that it
// carries nothing but the state's chain. For sub-chunk i of the chunk's NC: L_i is the cumulative sum
// of its gates from its first row (inclusive), tot_i its total, g0_i its first row, R_i = tot_i - L_i
// (the decay from a row to the sub-chunk's end) and P_i = tot_0 + ... + tot_{i-1}, so that
// G = P_i + L_i is the chunk-local cumulative gate and G_n = P_i + g0_i its value at the first row of
// sub-chunk i (the reference gate). The program loops over the sub-chunks, storing for each its rows of
//   qg  = Q .* exp(G)                   = (Q_i .* exp(L_i - g0_i)) .* exp(G_n)
//   kg  = K .* exp(G_C - G)             = K_i .* exp(R_i + tot_{i+1} + ... + tot_{NC-1})
//   a   = the chunk's attention [BT, BT], scaled: the diagonal block A_ii at fp32 accuracy (factored with a
//         reference gate where the gates' spread allows, elementwise otherwise:
//         blocks::gated_scores_diagonal), those left of it as products of decayed sub-chunks,
//           A_ij = scale (Q_i .* exp(G_i - G_n)) (K_j .* exp(G_n - G_j))^T       (j < i)
//         and zeros right of it; rounded to the input dtype as the walk's tensor cores take it
// and then the chunk's log-decay per key channel, chunk_decay = G_C. Every exponent is a sum of gates,
// so <= 0; the decays between sub-chunks are sums over the rows in between rather than differences of
// G, so a sub-chunk of very negative gates (say -1e4) does not wipe out the precision of the
// sub-chunks after it. Rows past the sequence end load q = k = g = 0. The sub-chunks are a loop, not
// unrolled, and read the chunk's tiles loaded once: unrolled, the kernel took 255 registers and
// stalled on fetching its instructions; one program per sub-chunk waited on every load
// (docs/ops/gla.md, "Measured", session 26).
std::shared_ptr<ir::Kernel> build_gla_chunk(const GlaConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BC = kGlaSubChunk;
  if (BT % BC != 0) throw InternalError(fmt::format("gla: chunk {} is not a multiple of {}", BT, BC));
  const int64_t NC = BT / BC;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_chunk");
  // 4 warps, at least two programs per SM: left to choose, ptxas held 4 warps to 128 registers and
  // spilled; 8 warps were slower (docs/ops/gla.md, "Measured"). Above head dim 128 a program's tiles
  // take most of an SM's shared memory in 16 bits (chunks of 64): one program per SM, so 8 warps in it
  // (faster: docs/ops/gla.md, "Measured", session 37; fp32 follows the rule, not timed).
  const bool one_per_sm = BK > 128;
  kb.set_num_warps(one_per_sm ? 8 : 4);
  kb.set_min_ctas_per_sm(one_per_sm ? 1 : 2);
  kb.set_num_stages(1);
  // The factored diagonal products on the tensor cores as three tf32 products (fp32-level accuracy,
  // compiler/nvptx/lower_dot.cpp) for 16-bit inputs, whose attention is rounded to 16 bits anyway; fp32
  // inputs keep the exact FMA loops.
  kb.set_tensor_core_f32(dt != f32);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor g = kb.tensor("g", f32, 4);
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, cfg.varlen);
  Tensor qg = kb.tensor("qg", dt, 4);
  Tensor kg = kb.tensor("kg", dt, 4);
  Tensor a = kb.tensor("a", dt, 4);
  Tensor chunk_decay = kb.tensor("chunk_decay", f32, 3);
  Tile scale = kb.scalar("scale", f32);

  const ChunkBounds c = index_tables.bounds(q, program_id(0), program_id(1), BT);
  auto chunk_rows = [&](const Tensor& t) {
    return load(t, {c.b, c.t0, c.i_h, 0}, {kIndex, BT, kIndex, BK}, c.in_seq);
  };
  // Gates floored (kernels/common/log_decay.h), here and in the elementwise form's rows: the spread and
  // L_r - L_c of -inf gates are NaN. Floored where a sub-chunk's rows are read, not at the load, so that
  // the chunk's gates stay in shared memory as copied (a cp.async copy issued with the others).
  Tile Q_chunk = chunk_rows(q), K_chunk = chunk_rows(k), g_chunk = chunk_rows(g);
  auto sub_chunk = [&](const Tile& x, const Tile& j) { return slice(x, 0, j * BC, BC); };
  auto sub_chunk_gates = [&](const Tile& j) { return floor_log_decay(sub_chunk(g_chunk, j)); };
  // tot_j, every sub-chunk's total gate per key channel [NC, BK], summed once: the loops below take its
  // rows (each pair of sub-chunks had summed them again).
  std::vector<Tile> sub_chunk_totals;
  for (int64_t j = 0; j < NC; ++j)
    sub_chunk_totals.push_back(expand_dims(sum(floor_log_decay(slice(g_chunk, 0, j * BC, BC)), 0), 0));
  const Tile totals = concat(sub_chunk_totals, 0);
  auto total_of = [&](const Tile& j) { return take(totals, j, 0); };

  // `total` enters sub-chunk i's step as P_i and leaves it as P_{i+1} (G_C after the last).
  auto prepare_sub_chunk = [&](const Tile& i, Tile& total) {
    Tile ti = c.t0 + i * BC;
    auto store_rows = [&](const Tensor& t, const Tile& x) {
      store(t, {c.b, ti, c.i_h, 0}, {kIndex, BC, kIndex, BK}, x.to(dt), c.in_seq);
    };
    auto store_block = [&](const Tile& j, const Tile& x) {
      store(a, {c.b, ti, c.i_h, j * BC}, {kIndex, BC, kIndex, BC}, x.to(dt), c.in_seq);
    };
    Tile Qf = sub_chunk(Q_chunk, i).to(f32);
    Tile Kf = sub_chunk(K_chunk, i).to(f32);
    Tile gi = sub_chunk_gates(i);
    Tile L = cumsum(gi, 0);
    Tile tot = total_of(i);
    Tile g0 = floor_log_decay(take(g_chunk, i * BC, 0));  // from the chunk's copy in shared memory
    // The elementwise form's rows of k and g, read from memory one step ahead of use so that their
    // latency overlaps a step (docs/ops/gla.md, "Measured"); row 16, read at the last step, is unused.
    auto row_of = [&](const Tensor& t, const Operand& r) {
      return load(t, {c.b, ti + r, c.i_h, 0}, {kIndex, kIndex, kIndex, BK}, c.in_seq);
    };
    blocks::ScoreRows rows{[&](const Operand& r) { return row_of(k, r); },
                           [&](const Operand& r) { return floor_log_decay(row_of(g, r)); }};
    store_block(i, blocks::gated_scores_diagonal(Qf, Kf, L, rows) * scale);

    // Q_i .* exp(G_i - G_n); the blocks left of the diagonal from j = i - 1 down to 0, each K_j decayed
    // to the end of its sub-chunk and then to row g0_i by the sum of the gates in between (factors <= 1).
    Tile Qn = Qf * exp(L - expand_dims(g0, 0));
    Tile Qnd = Qn.to(dt);
    const Tile before = total;  // P_i
    Tile decay = g0;            // from the end of sub-chunk j to the first row of sub-chunk i
    for_range(0, i, [&](Tile step) {
      Tile j = i - 1 - step;
      Tile tot_j = total_of(j);
      Tile Kn = (sub_chunk(K_chunk, j).to(f32) * exp(expand_dims(tot_j + decay, 0) - cumsum(sub_chunk_gates(j), 0))).to(dt);
      store_block(j, dot(Qnd, Kn.T()) * scale);
      decay = decay + tot_j;
    }, decay);
    for_range(i + 1, NC, [&](Tile j) { store_block(j, zeros({BC, BC}, f32)); });
    store_rows(qg, Qn * expand_dims(exp(g0 + before), 0));

    // K_i .* exp(R_i + tot_{i+1} + ... + tot_{NC-1}).
    Tile after = zeros({BK}, f32);
    for_range(i + 1, NC, [&](Tile j) { after = after + total_of(j); }, after);
    store_rows(kg, Kf * exp(expand_dims(tot + after, 0) - L));
    total = before + tot;
  };
  Tile total = zeros({BK}, f32);
  for_range(0, NC, [&](Tile i) { prepare_sub_chunk(i, total); }, total);
  store(chunk_decay, {c.global_chunk, c.i_h, 0}, {kIndex, kIndex, BK}, total);
  return kb.finish();
}

// One program per (V block, sequence x head) walks the chunks of its sequence in order, carrying the
// state S [BK, BV] in registers, on the operands gla_chunk prepared:
//   O = scale qg S + a V                    S = diag(exp(chunk_decay)) S + kg^T V
// A segment_states walk keeps the state update alone and sums the chunks' decays (the segment's
// log-decay per key channel); a segment_outputs walk starts from the state entering its segment.
std::shared_ptr<ir::Kernel> build_gla_fwd(const GlaConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  const bool states_only = cfg.walk == GlaWalk::segment_states;
  const bool from_segment = cfg.walk == GlaWalk::segment_outputs;
  const bool h0_in = cfg.initial_state && cfg.walk == GlaWalk::sequence;
  const bool ht_out = cfg.final_state && cfg.walk == GlaWalk::sequence;
  KernelBuilder kb(states_only ? "gla_segment_states" : "gla_fwd");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  kb.set_producer_warps(cfg.producer_warps);
  // About one program per SM (the walks are few): ptxas need not keep registers for more.
  kb.set_min_ctas_per_sm(1);
  Tensor qg = states_only ? Tensor() : kb.tensor("qg", dt, 4);
  Tensor kg = kb.tensor("kg", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor a = states_only ? Tensor() : kb.tensor("a", dt, 4);
  Tensor chunk_decay = kb.tensor("chunk_decay", f32, 3);
  Tensor chunk_offsets = kb.tensor("chunk_offsets", DType::i32, 1);
  Tensor h0 = h0_in ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor ht = ht_out ? kb.tensor("final_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor seg_states = states_only ? kb.tensor("segment_states", f32, 5) : Tensor();
  Tensor seg_decays = states_only ? kb.tensor("segment_decays", f32, 4) : Tensor();
  Tensor seg_inputs = from_segment ? kb.tensor("segment_inputs", f32, 5) : Tensor();
  Tensor o = states_only ? Tensor() : kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(kg, cu, cfg.varlen, 1);
  Tile i_s = cfg.walk == GlaWalk::sequence ? Tile() : program_id(2);
  const SequenceBounds seq = i_s.valid() ? segment_bounds(seq_rows, i_s, cfg.segment) : seq_rows;
  Tile num_chunks = (seq.eos - seq.bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;
  // The chunk table's row of the walk's first chunk (segments are whole chunks).
  Tile first_chunk = load(chunk_offsets, {i_n}, {kIndex});
  if (i_s.valid()) first_chunk = first_chunk + i_s * (cfg.segment / BT);

  Tile S = zeros({BK, BV}, f32);
  if (h0_in) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});
  if (from_segment) S = load(seg_inputs, {i_n, i_s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
  Tile decays = zeros({BK}, f32);  // the segment's log-decay (segment_states)
  AccessOptions in_seq{.limits = {{1, seq.eos}}};

  auto body = [&](Tile i) {
    Tile t0 = seq.bos + i * BT;
    Tile Kg = load(kg, {seq.b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile V = load(v, {seq.b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile d = load(chunk_decay, {first_chunk + i, i_h, 0}, {kIndex, kIndex, BK});
    if (!states_only) {
      Tile Qg = load(qg, {seq.b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
      Tile A = load(a, {seq.b, t0, i_h, 0}, {kIndex, BT, kIndex, BT}, in_seq);
      // Q S first (its operand, the carried state, converted before any product is in flight: after
      // A V was issued, ptxas waited for it there, C7517), then A V, each waited for at its first use.
      Tile O = dot(Qg, S.to(dt)) * scale;
      O = O + dot(A, V);
      store(o, {seq.b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt), in_seq);
    }
    S = blocks::state_update(S, Kg, V, d, /*in_place=*/true);
    if (states_only) decays = decays + d;
  };
  if (states_only) {
    for_range(0, num_chunks, body, S, decays);
    store(seg_states, {i_n, i_s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV}, S);
    // One row per (sequence, segment, head): the first V block stores it, the others are masked.
    AccessOptions first_block{.limits = {{2, i_h + 1 - minimum(i_v, 1)}}};
    store(seg_decays, {i_n, i_s, i_h, 0}, {kIndex, kIndex, kIndex, BK}, decays, first_block);
    return kb.finish();
  }
  for_range(0, num_chunks, body, S);
  if (ht_out) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

// The split schedule's outputs (dense inputs), for parallelism where the walks have too few programs
// to fill the GPU: gla_bwd_gates decays every chunk's keys in parallel (K .* exp(R), exp(tot)), the state
// pass gla_bwd_states walks the chunks of each (V block, sequence x head, K block) storing the state
// before every chunk into h [B, NT, H, K, V] (input dtype, as the walk rounds it for the product),
// then gla_out computes every chunk's outputs in parallel from h and gla_chunk's operands. The first
// two are the backward's split schedule's (kernels/gla/split_bwd.h).
std::shared_ptr<ir::Kernel> build_gla_out(const GlaConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype;
  KernelBuilder kb("gla_out");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  Tensor qg = kb.tensor("qg", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor a = kb.tensor("a", dt, 4);
  Tensor h = kb.tensor("h", dt, 5);
  Tensor o = kb.tensor("o", dt, 4);
  // (BK is the padded key dim: h's load masks past K.)
  Tile scale = kb.scalar("scale", DType::f32);

  Tile ic = program_id(0);
  Tile i_nh = program_id(1);
  Tile i_v = program_id(2);
  Tile H = qg.dim(2), T = qg.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile v0 = i_v * BV, t0 = ic * BT;
  AccessOptions in_seq{.limits = {{1, T}}};
  Tile Sd = load(h, {b, ic, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
  Tile Qg = load(qg, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
  Tile A = load(a, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BT}, in_seq);
  Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
  Tile O = dot(Qg, Sd) * scale + dot(A, V);
  store(o, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt), in_seq);
  return kb.finish();
}

}  // namespace linac
