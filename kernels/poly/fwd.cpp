#include "kernels/poly/fwd.h"

#include "kernels/common/prologue.h"
#include "kernels/poly/features.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {

/// First row of state2 holding the entries (d, e >= d): sum_{j<d} (K - j).
Tile state2_row(const Tile& d, const Tile& K) { return d * (2 * K - d + 1) / 2; }

/// Weights of the symmetric part along e - d = 0, 1, ...: the diagonal counts once, the other
/// entries stand for both (d, e) and (e, d).
Tile symmetric_weights(int64_t BK) {
  return where(iota(BK) == 0, full({BK}, 1.0, DType::f32), full({BK}, 2.0, DType::f32));
}

/// What the backward needs of a chunk's outputs through the normalizer, from dO and O (fp32) and the
/// denominators den: dn = dO / den (input dtype) and dd = -rowsum(dO .* O) / den.
void store_normalizer_grads(const Tensor& dn, const Tensor& dd, const ChunkBounds& ch, const Tile& dO, const Tile& O,
                            const Tile& den, int64_t BT, int64_t BV, DType dt) {
  store(dn, {ch.b, ch.t0, ch.i_h, 0}, {kIndex, BT, kIndex, BV}, (dO / expand_dims(den, 1)).to(dt), ch.in_seq);
  store(dd, {ch.b, ch.t0, ch.i_h}, {kIndex, BT, kIndex}, -sum(dO * O, 1) / den, ch.in_seq);
}

/// The chunk that program x of n computes when the programs take the chunks by their position in
/// their segment of `per_segment` chunks, last position first, segment by segment within a position:
/// positions per_segment - 1 .. rem (rem = n % per_segment) hold the `full` whole segments' chunks,
/// positions rem - 1 .. 0 one more (the partial segment's).
Tile longest_first(const Tile& x, const Tile& n, int64_t per_segment) {
  const Tile full = n / per_segment, rem = n % per_segment;
  const Tile first = (per_segment - rem) * full;  // programs at the positions of whole segments only
  const Tile f = maximum(full, 1);
  const Tile late = (x % f) * per_segment + (per_segment - 1 - x / f);
  const Tile x2 = x - first;
  const Tile early = (x2 % (full + 1)) * per_segment + (rem - 1 - x2 / (full + 1));
  return where(x < first, late, early);
}

}  // namespace

int poly_feature_blocks(const PolyConfig& cfg) { return poly_degree2_blocks(cfg) + 2; }

int poly_degree2_blocks(const PolyConfig& cfg) { return cfg.quadratic ? cfg.block_k / 2 + 1 : 0; }

int poly_z_rows(const PolyConfig& cfg) { return (cfg.quadratic ? cfg.block_k : 0) + 2; }

// poly_*_sums: grid axis 0 runs over (feature block, V block), then with normalize one program for the
// normalizer's tables. Degree-2 block m sums phi_m(x)^T y; the last feature block's programs sum the
// degrees 1 and 0 (x^T y into block deg2; sum y into row 0 of block deg2 + 1). Forward: x = k, y = v,
// w = 1 on the sequence's rows; backward: x = q, y = dn, w = dd.
std::shared_ptr<ir::Kernel> build_poly_sums(const PolyConfig& cfg, bool backward) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v, CPS = cfg.segment_chunks;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(backward ? "poly_bwd_sums" : "poly_fwd_sums");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  kb.set_min_ctas_per_sm(cfg.min_ctas);
  Tensor x = kb.tensor(backward ? "q" : "k", dt, 4);
  Tensor y = kb.tensor(backward ? "dn" : "v", dt, 4);
  Tensor w = backward && cfg.normalize ? kb.tensor("dd", f32, 3) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor seg_indices = cfg.varlen ? kb.tensor("segment_indices", DType::i32, 2) : Tensor();
  Tensor sums = kb.tensor("sums", f32, 5);
  Tensor zsums = cfg.normalize ? kb.tensor("zsums", f32, 4) : Tensor();

  Tile v_blocks = (y.dim(3) + (BV - 1)) / BV;
  Tile i_f = program_id(0) / v_blocks;
  Tile i_v = program_id(0) % v_blocks;
  // A segment is a chunk of L rows to chunk_bounds: its sequence, first row t0 and table row.
  const ChunkBounds seg = chunk_bounds(x, cu, seg_indices, cfg.varlen, program_id(1), program_id(2), BT * CPS);
  Tile b = seg.b, i_h = seg.i_h, row = seg.global_chunk;
  Tile v0 = i_v * BV;
  const int64_t deg2 = poly_degree2_blocks(cfg);
  auto chunk_of = [&](const Tensor& t, const Tile& t0, const Operand& col0, int64_t cols) {
    return load(t, {b, t0, i_h, col0}, {kIndex, BT, kIndex, cols}, seg.in_seq);
  };
  // w on the chunk's rows, 0 past the sequence.
  auto weights = [&](const Tile& t0) {
    if (backward) return load(w, {b, t0, i_h}, {kIndex, BT, kIndex}, seg.in_seq);
    return where(iota(BT) < seg.eos - t0, full({BT}, 1.0, f32), 0.0f);
  };
  auto over_chunks = [&](const std::function<void(Tile)>& update, const std::vector<Tile*>& carried) {
    Tile first = seg.t0, last = minimum(seg.t0 + BT * CPS, seg.eos);
    for_range_carrying(0, (last - first + (BT - 1)) / BT, [&](Tile i) { update(first + i * BT); }, carried);
  };

  auto degree2 = [&] {
    // X rolled by m: with K == BK a slice of [X X] (reads of X's shared copy), else a product with the
    // roll matrix.
    Tile roll = cfg.exact_k ? Tile() : roll_matrix(BK, x.dim(3), i_f, dt);
    // phi_m(X)^T [BK, BT]: x_sj x_s,(j+m) in the input dtype (two 16-bit values multiplied and rounded
    // once). With K == BK math on views of X's shared copy, which the product evaluates at its A
    // operand's coordinates (smem_plan.h dot_a_in_registers).
    auto features_t = [&](const Tile& X) {
      if (!cfg.exact_k) return (X.to(f32) * dot(X, roll)).to(dt).T();
      Tile XT = X.T();
      return XT * slice(concat({XT, XT}, 0), 0, i_f, BK);
    };
    Tile S = zeros({BK, BV}, f32);
    over_chunks(
        [&](Tile t0) {
          Tile X = chunk_of(x, t0, 0, BK);
          Tile phi_t = features_t(X);
          S = S + dot(phi_t, chunk_of(y, t0, v0, BV));
        },
        {&S});
    store(sums, {row, i_h, i_f, 0, v0}, {kIndex, kIndex, kIndex, BK, BV}, S);
  };
  auto low_degrees = [&] {
    Tile S1 = zeros({BK, BV}, f32);
    Tile Y0 = zeros({BT, BV}, f32);  // y summed row by row
    over_chunks(
        [&](Tile t0) {
          Tile X = chunk_of(x, t0, 0, BK);
          Tile Y = chunk_of(y, t0, v0, BV);
          S1 = S1 + dot(X.T(), Y);
          Y0 = Y0 + Y.to(f32);
        },
        {&S1, &Y0});
    Tile first_row = expand_dims(iota(BK), 1) == 0;
    store(sums, {row, i_h, deg2, 0, v0}, {kIndex, kIndex, kIndex, BK, BV}, S1);
    store(sums, {row, i_h, deg2 + 1, 0, v0}, {kIndex, kIndex, kIndex, BK, BV},
          where(first_row, expand_dims(sum(Y0, 0), 0), 0.0f));
  };
  // The normalizer's tables (poly_z_rows): the quadratic form x^T diag(w) x on the tensor cores, the
  // row sums elementwise and reduced once.
  auto normalizer = [&] {
    Tile Z2 = zeros({BK, BK}, f32);  // sum w x x^T (quadratic)
    Tile Z1 = zeros({BT, BK}, f32);  // x w summed row by row
    Tile Z0 = zeros({BT}, f32);      // w summed
    std::vector<Tile*> carried = {&Z1, &Z0};
    if (cfg.quadratic) carried.push_back(&Z2);
    over_chunks(
        [&](Tile t0) {
          Tile X = chunk_of(x, t0, 0, BK);
          Tile wt = weights(t0);
          // Forward: w is 1 on the sequence's rows and x is 0 past them, so x w = x.
          Tile Xw = backward ? X.to(f32) * expand_dims(wt, 1) : X.to(f32);
          Z1 = Z1 + Xw;
          Z0 = Z0 + wt;
          if (cfg.quadratic) Z2 = Z2 + dot(X.T(), backward ? Xw.to(dt) : X);
        },
        carried);
    const int64_t z1 = poly_z_rows(cfg) - 2;
    if (cfg.quadratic) store(zsums, {row, i_h, 0, 0}, {kIndex, kIndex, BK, BK}, Z2);
    store(zsums, {row, i_h, z1, 0}, {kIndex, kIndex, kIndex, BK}, sum(Z1, 0));
    store(zsums, {row, i_h, z1 + 1, 0}, {kIndex, kIndex, kIndex, BK},
          where(iota(BK) == 0, full({BK}, 1.0, f32) * sum(Z0, 0), 0.0f));
  };
  auto states = [&] {
    if (deg2 > 0)
      if_then_else(i_f < deg2, degree2, low_degrees);
    else
      low_degrees();
  };
  auto tables = [&] {
    if (cfg.normalize)
      if_then_else(program_id(0) < (deg2 + 1) * v_blocks, states, normalizer);
    else
      states();
  };
  // The sums reach a state only from a segment with others after it (forward) or before it (backward).
  if_then(has_segments(cfg, seg.t0, seg.bos, seg.eos, /*after=*/!backward), tables);
  return kb.finish();
}

// poly_*_scan: one program per (feature block x V block, sequence x head) walks the segments, storing
// the running sum before adding each segment's (forward), or from the last segment, after (backward);
// with normalize one more program per sequence x head walks the normalizer's tables.
std::shared_ptr<ir::Kernel> build_poly_scan(const PolyConfig& cfg, bool reverse) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v, L = int64_t{cfg.chunk} * cfg.segment_chunks;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(reverse ? "poly_bwd_scan" : "poly_fwd_scan");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  kb.set_min_ctas_per_sm(cfg.min_ctas);
  Tensor x = kb.tensor(reverse ? "q" : "k", dt, 4);  // for the sequences' bounds
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor seg_offsets = cfg.varlen ? kb.tensor("segment_offsets", DType::i32, 1) : Tensor();
  Tensor sums = kb.tensor("sums", f32, 5);
  Tensor zsums = cfg.normalize ? kb.tensor("zsums", f32, 4) : Tensor();
  Tensor states = kb.tensor(reverse ? "rstates" : "states", dt, 5);
  Tensor zstates = cfg.normalize ? kb.tensor(reverse ? "rzstates" : "zstates", f32, 4) : Tensor();

  Tile v_blocks = (sums.dim(4) + (BV - 1)) / BV;
  Tile state_programs = poly_feature_blocks(cfg) * v_blocks;
  Tile i_f = program_id(0) / v_blocks;
  Tile i_v = program_id(0) % v_blocks;
  const auto [i_nh, i_n, i_h, seq] = sequence_program(x, cu, cfg.varlen, 1);
  Tile row0 = first_segment(cfg, x, seg_offsets, i_n);
  Tile segments = (seq.eos - seq.bos + (L - 1)) / L;
  auto segment_row = [&](const Tile& s) { return row0 + (reverse ? segments - 1 - s : s); };

  // The walks store the state of every segment and add the sums of all but the last segment walked (the
  // sums kernel skips that one: no state takes it).
  Tile last = segments - 1;
  auto state_walk = [&] {
    Tile v0 = i_v * BV;
    Tile S = zeros({BK, BV}, f32);
    for_range(0, last, [&](Tile s) {
      Tile row = segment_row(s);
      store(states, {row, i_h, i_f, 0, v0}, {kIndex, kIndex, kIndex, BK, BV}, S.to(dt));
      S = S + load(sums, {row, i_h, i_f, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
    }, S);
    if_then(segments > 0, [&] {
      store(states, {segment_row(last), i_h, i_f, 0, v0}, {kIndex, kIndex, kIndex, BK, BV}, S.to(dt));
    });
  };
  // The normalizer's tables: the quadratic form (rows 0 .. BK-1, quadratic) and the two low rows.
  auto z_walk = [&] {
    const int64_t low = poly_z_rows(cfg) - 2;
    Tile Z2 = zeros({BK, BK}, f32);
    Tile Z = zeros({2, BK}, f32);
    std::vector<Tile*> carried = {&Z};
    if (cfg.quadratic) carried.push_back(&Z2);
    for_range_carrying(0, last, [&](Tile s) {
      Tile row = segment_row(s);
      if (cfg.quadratic) {
        store(zstates, {row, i_h, 0, 0}, {kIndex, kIndex, BK, BK}, Z2);
        Z2 = Z2 + load(zsums, {row, i_h, 0, 0}, {kIndex, kIndex, BK, BK});
      }
      store(zstates, {row, i_h, low, 0}, {kIndex, kIndex, 2, BK}, Z);
      Z = Z + load(zsums, {row, i_h, low, 0}, {kIndex, kIndex, 2, BK});
    }, carried);
    if_then(segments > 0, [&] {
      if (cfg.quadratic) store(zstates, {segment_row(last), i_h, 0, 0}, {kIndex, kIndex, BK, BK}, Z2);
      store(zstates, {segment_row(last), i_h, low, 0}, {kIndex, kIndex, 2, BK}, Z);
    });
  };
  if (cfg.normalize)
    if_then_else(program_id(0) < state_programs, state_walk, z_walk);
  else
    state_walk();
  return kb.finish();
}

// poly_fwd_out: the degree-2 blocks in order m = 0, 1, ... with Q rolled by m (a slice of [Q Q], or
// one more column each time by a product with the roll by 1), then degrees 1 and 0 and the
// denominator from the normalizer's tables; the segment's own chunks last. With `grad` (the
// backward's first step) it stores what the backward needs of o instead of o: dn = do / den and
// dd = -(do . o) / den (one V block: the whole row of o).
std::shared_ptr<ir::Kernel> build_poly_fwd_out(const PolyConfig& cfg, bool grad) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v, CPS = cfg.segment_chunks;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(grad ? "poly_bwd_prepare" : "poly_fwd_out");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  kb.set_min_ctas_per_sm(cfg.min_ctas);
  kb.set_tensor_core_f32(cfg.dtype != f32);  // times_quadratic_form
  auto [q, k, v] = declare_qkv(kb, dt);
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, cfg.varlen);
  Tensor seg_offsets = cfg.varlen ? kb.tensor("segment_offsets", DType::i32, 1) : Tensor();
  Tensor states = kb.tensor("states", dt, 5);
  Tensor zstates = cfg.normalize ? kb.tensor("zstates", f32, 4) : Tensor();
  Tensor d_o = grad ? kb.tensor("do", dt, 4) : Tensor();
  Tensor o = grad ? Tensor() : kb.tensor("o", dt, 4);
  Tensor dn = grad ? kb.tensor("dn", dt, 4) : Tensor();
  Tensor dd = grad ? kb.tensor("dd", f32, 3) : Tensor();
  Tensor den_out = !grad && cfg.store_den && cfg.normalize ? kb.tensor("den", f32, 3) : Tensor();
  Tile scale = kb.scalar("scale", f32);
  Tile ca = kb.scalar("a", f32);
  Tile cb = kb.scalar("b", f32);
  Tile cc = cfg.quadratic ? kb.scalar("c", f32) : constant(0, f32);

  Tile i_v = program_id(1);
  // Programs longest first (cfg.longest_first, without varlen): a chunk late in its segment sums more of
  // the segment's chunks directly, and the GPU starts programs in grid order, so the last wave holds the
  // short ones; in grid order the programs running at once share their segments' states and keys in L2.
  Tile i_c = cfg.longest_first && !cfg.varlen ? longest_first(program_id(0), num_programs(0), CPS) : program_id(0);
  const ChunkBounds ch = index_tables.bounds(q, i_c, program_id(2), BT);
  Tile v0 = i_v * BV;
  Tile segment = ch.chunk / CPS;
  Tile row = first_segment(cfg, q, seg_offsets, ch.i_n) + segment;
  Tile Kdim = q.dim(3);
  const int64_t deg2 = poly_degree2_blocks(cfg);
  Tile Q = load(q, {ch.b, ch.t0, ch.i_h, 0}, {kIndex, BT, kIndex, BK}, ch.in_seq);
  // f(x) = a + b x + c x^2 at x = scale q.k: the coefficients of q.k's powers.
  Tile b1 = cb * scale, c2 = cc * scale * scale;
  auto state = [&](const Operand& block) {
    return load(states, {row, ch.i_h, block, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
  };

  // Everything before the segment, from its stored states (has_segments: none before the first).
  Tile O = zeros({BT, BV}, f32);
  Tile den = cfg.normalize ? zeros({BT}, f32) : Tile();
  auto from_states = [&] {
    if (deg2 > 0) {
      // sum_m w_m phi_m(Q) S_m, then times c scale^2: phi_m(Q) = Q .* (Q rolled by m) in the input dtype
      // (two 16-bit values multiplied and rounded once, the tensor cores' operand), the weight w_m = 2 of
      // the blocks 0 < m < K/2 taken by 2Q (exact), m = 0 and m = K/2 (weight 1) apart. Q rolled by m:
      // with K == BK a slice of [Q Q] at column m (reads of Q's shared copy), else rolled one more
      // column each time by a product with the roll by 1.
      const bool by_slice = cfg.exact_k;
      Tile QQ = by_slice ? concat({Q, Q}, 1) : Tile();
      Tile roll1 = by_slice ? Tile() : roll_matrix(BK, Kdim, constant(1, DType::i32), dt);
      Tile Q2 = Q + Q;
      Tile Qr = Q;  // !by_slice: Q rolled by the block before
      auto rolled = [&](const Tile& m) {
        if (by_slice) return slice(QQ, 1, m, BK);
        Qr = roll_by_one(cfg, Qr, roll1, /*right=*/false);
        return Qr;
      };
      O = dot(Q * Q, state(constant(0, DType::i32)));
      std::vector<Tile*> carried = {&O};
      if (!by_slice) carried.push_back(&Qr);
      for_range_carrying(1, (Kdim + 1) / 2, [&](Tile m) { O = O + dot(Q2 * rolled(m), state(m)); }, carried);
      // m = K/2 when K is even (with K odd the loop took floor(K/2); the block's state reads as 0; K ==
      // BK is even).
      Tile half = Kdim / 2;
      AccessOptions if_even = cfg.exact_k ? AccessOptions{} : AccessOptions{.limits = {{3, BK * (1 - Kdim % 2)}}};
      O = O + dot(Q * rolled(half),
                  load(states, {row, ch.i_h, half, 0, v0}, {kIndex, kIndex, kIndex, BK, BV}, if_even));
      O = O * c2;
    }
    O = O + dot(Q, state(deg2)) * b1;
    Tile s0 = load(states, {row, ch.i_h, deg2 + 1, 0, v0}, {kIndex, kIndex, kIndex, kIndex, BV});
    O = O + expand_dims(s0.to(f32) * ca, 0);
    // The denominator before the segment: c scale^2 q^T Z2 q + b scale q . z1 + a n (load_z_tables).
    if (cfg.normalize) {
      const ZTables z = load_z_tables(cfg, zstates, row, ch.i_h);
      Tile Qf = Q.to(f32);
      Tile terms = Qf * slice(z.low, 0, 0, 1) * b1;
      if (cfg.quadratic) terms = terms + Qf * times_quadratic_form(Q, z.quadratic) * c2;
      den = sum(terms, 1) + take(take(z.low, 1, 0), 0, 0) * ca;
    }
  };
  Tile has_states = has_segments(cfg, ch.bos + segment * (BT * CPS), ch.bos, ch.eos, /*after=*/false);
  if (cfg.normalize)
    if_then(has_states, from_states, O, den);
  else
    if_then(has_states, from_states, O);

  // The segment's own chunks up to this one, directly: f on the scores x = q.k (the scale taken by the
  // coefficients), causal inside this chunk only. The denominator's share, F's row sums, on the tensor
  // cores beside the numerator: F times a column of ones (F as the numerator's product takes it).
  Tile causal = expand_dims(iota(BT), 1) >= expand_dims(iota(BT), 0);
  Tile ones = full({BT, kSumColumns}, 1.0, dt);
  Tile row_sums = zeros({BT, kSumColumns}, f32);  // column j: sum of F's rows (normalize)
  auto pairs = [&](const Tile& c, bool diagonal) {
    Tile t0 = ch.bos + c * BT;
    Tile Kc = load(k, {ch.b, t0, ch.i_h, 0}, {kIndex, BT, kIndex, BK}, ch.in_seq);
    Tile V = load(v, {ch.b, t0, ch.i_h, v0}, {kIndex, BT, kIndex, BV}, ch.in_seq);
    Tile X = dot(Q, Kc.T());
    Tile fx = cfg.quadratic ? ca + X * (b1 + c2 * X) : ca + b1 * X;
    Tile F = (diagonal ? where(causal, fx, 0.0f) : fx).to(dt);
    O = O + dot(F, V);
    if (cfg.normalize) row_sums = row_sums + dot(F, ones);
  };
  std::vector<Tile*> carried = {&O};
  if (cfg.normalize) carried.push_back(&row_sums);
  for_range_carrying(segment * CPS, ch.chunk, [&](Tile c) { pairs(c, false); }, carried);
  pairs(ch.chunk, true);
  if (cfg.normalize) {
    den = den + take(row_sums, 0, 1) + kPolyEps;
    O = O / expand_dims(den, 1);
  }
  if (!grad) {
    store(o, {ch.b, ch.t0, ch.i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt), ch.in_seq);
    if (den_out.value() != nullptr) {
      // The first V block stores it (the others' stores mask every row).
      AccessOptions first_block{.limits = {{1, ch.eos * (1 - minimum(i_v, 1))}}};
      store(den_out, {ch.b, ch.t0, ch.i_h}, {kIndex, BT, kIndex}, den, first_block);
    }
    return kb.finish();
  }
  Tile dO = load(d_o, {ch.b, ch.t0, ch.i_h, 0}, {kIndex, BT, kIndex, BV}, ch.in_seq).to(f32);
  store_normalizer_grads(dn, dd, ch, dO, O, den, BT, BV, dt);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_poly_bwd_from_saved(const PolyConfig& cfg) {
  const int64_t BT = cfg.chunk, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_bwd_from_saved");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  Tensor d_o = kb.tensor("do", dt, 4);
  Tensor o = kb.tensor("o", dt, 4);
  Tensor den = kb.tensor("den", f32, 3);
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, cfg.varlen);
  Tensor dn = kb.tensor("dn", dt, 4);
  Tensor dd = kb.tensor("dd", f32, 3);
  const ChunkBounds ch = index_tables.bounds(d_o, program_id(0), program_id(1), BT);
  Tile dO = load(d_o, {ch.b, ch.t0, ch.i_h, 0}, {kIndex, BT, kIndex, BV}, ch.in_seq).to(f32);
  Tile O = load(o, {ch.b, ch.t0, ch.i_h, 0}, {kIndex, BT, kIndex, BV}, ch.in_seq).to(f32);
  // Rows past the sequence read den = 0 and are not stored.
  Tile D = load(den, {ch.b, ch.t0, ch.i_h}, {kIndex, BT, kIndex}, ch.in_seq);
  store_normalizer_grads(dn, dd, ch, dO, O, D, BT, BV, dt);
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
