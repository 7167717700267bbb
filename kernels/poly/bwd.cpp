#include "kernels/poly/bwd.h"

#include "kernels/common/prologue.h"
#include "kernels/poly/features.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {

/// What dq and dkv share: the parameters, the program's chunk and segment, the chunk's rows of the
/// inputs, and the loop over the degree-2 blocks of the per-segment states.
struct BwdProgram {
  const PolyConfig& cfg;
  Tensor q, k, v, dn, dd, cu, chunk_indices, seg_offsets, states, zstates;
  Tile scale, a, b, c;
  Tile c2;  // c scale^2: the coefficient of (q.k)^2 in f(scale q.k) (declare_scalars)
  ChunkBounds ch;
  Tile segment, row, Kdim;
  int64_t deg2;

  BwdProgram(KernelBuilder& kb, const PolyConfig& cfg_, bool reverse) : cfg(cfg_) {
    const DType dt = cfg.dtype, f32 = DType::f32;
    auto qkv = declare_qkv(kb, dt);
    q = qkv.q, k = qkv.k, v = qkv.v;
    dn = kb.tensor("dn", dt, 4);
    if (cfg.normalize) dd = kb.tensor("dd", f32, 3);
    if (cfg.varlen) {
      cu = kb.tensor("cu_seqlens", DType::i32, 1);
      chunk_indices = kb.tensor("chunk_indices", DType::i32, 2);
      seg_offsets = kb.tensor("segment_offsets", DType::i32, 1);
    }
    states = kb.tensor(reverse ? "rstates" : "states", dt, 5);
    if (cfg.normalize) zstates = kb.tensor(reverse ? "rzstates" : "zstates", f32, 4);
    ch = chunk_bounds(q, cu, chunk_indices, cfg.varlen, program_id(0), program_id(1), cfg.chunk);
    segment = ch.chunk / cfg.segment_chunks;
    row = first_segment(cfg, q, seg_offsets, ch.i_n) + segment;
    Kdim = q.dim(3);
    deg2 = poly_degree2_blocks(cfg);
  }
  void declare_scalars(KernelBuilder& kb) {
    scale = kb.scalar("scale", DType::f32);
    a = kb.scalar("a", DType::f32);
    b = kb.scalar("b", DType::f32);
    c = cfg.quadratic ? kb.scalar("c", DType::f32) : constant(0, DType::f32);
    c2 = c * scale * scale;
  }

  /// Rows t0 .. t0 + BT of x (cols columns), zero past the sequence.
  Tile chunk(const Tensor& x, const Tile& t0, int64_t cols) const {
    return load(x, {ch.b, t0, ch.i_h, 0}, {kIndex, cfg.chunk, kIndex, cols}, ch.in_seq);
  }
  Tile dd_rows(const Tile& t0) const { return load(dd, {ch.b, t0, ch.i_h}, {kIndex, cfg.chunk, kIndex}, ch.in_seq); }
  /// The first row of the program's segment.
  Tile segment_t0() const { return ch.bos + segment * (int64_t{cfg.chunk} * cfg.segment_chunks); }
  Tile state(const Operand& block) const {
    return load(states, {row, ch.i_h, block, 0, 0}, {kIndex, kIndex, kIndex, cfg.block_k, cfg.block_v});
  }
  ZTables z_tables() const { return load_z_tables(cfg, zstates, row, ch.i_h); }

  /// For m = 0 .. K/2: body(m, w_m, X rolled left by m, X rolled right by m, [BT, BK] in the input dtype)
  /// with w_m the block's weight; the rolls are products with the roll by one, carried from block to block.
  void for_degree2(const Tile& X, const std::function<void(Tile, Tile, Tile, Tile)>& body, std::vector<Tile*> carried) {
    if (deg2 == 0) return;
    Tile left1 = roll_by_one_matrix();
    Tile right1 = left1.T();  // the inverse permutation
    Tile Xl = X, Xr = X;
    carried.push_back(&Xl);
    carried.push_back(&Xr);
    for_range_carrying(0, Kdim / 2 + 1, [&](Tile m) {
      body(m, degree2_weight(m, Kdim) * c2, Xl, Xr);
      // Products, not roll_by_one's slices: those took dq and dk/dv slower (docs/ops/poly.md, "Measured").
      Xl = dot(Xl, left1).to(cfg.dtype);
      Xr = dot(Xr, right1).to(cfg.dtype);
    }, carried);
  }
  /// for_degree2 with one of the rolls: body(m, w_m, X rolled left (or right) by m). Two such loops
  /// carry one rolled copy each, where one loop with both holds two copies and two rolls' products at
  /// once (poly_bwd_dkv spilled so at chunks of 128 rows).
  void for_degree2_rolled(const Tile& X, bool left, const std::function<void(Tile, Tile, Tile)>& body,
                          std::vector<Tile*> carried) {
    if (deg2 == 0) return;
    Tile roll = left ? roll_by_one_matrix() : roll_by_one_matrix().T();
    Tile Xm = X;
    carried.push_back(&Xm);
    for_range_carrying(0, Kdim / 2 + 1, [&](Tile m) {
      body(m, degree2_weight(m, Kdim) * c2, Xm);
      Xm = dot(Xm, roll).to(cfg.dtype);
    }, carried);
  }
  Tile roll_by_one_matrix() const { return roll_matrix(cfg.block_k, Kdim, constant(1, DType::i32), cfg.dtype); }

  /// Block m's state with its rows rolled right by m, S': u' = dn S'^T is u = dn S^T rolled right by
  /// m, so the Jacobian's J_m(x)^T u = u .* roll(x, m) + roll(u .* x, -m) is u .* Xl + u' .* Xr
  /// without rolling u.
  Tile rolled_rows_state(const Tile& m) const {
    return rolled_rows(states, row, ch.i_h, m, Kdim, cfg.block_k, cfg.block_v);
  }
};

}  // namespace

// With cfg.coefficient_grads it also sums, over its rows, the gradients of a, b and c: with
// N_t = a N0 + b N1 + c N2 and D_t likewise, dL/da = sum_t dn_t . N0_t + dd_t D0_t (and b, c alike):
// sum_{s<=t} g_ts (1, x_ts, x_ts^2), from the states (the degree-0, -1 and -2 blocks' shares of u) and
// directly inside the segment.
std::shared_ptr<ir::Kernel> build_poly_bwd_dq(const PolyConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v, CPS = cfg.segment_chunks;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_bwd_dq");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  kb.set_min_ctas_per_sm(cfg.min_ctas);
  kb.set_tensor_core_f32(cfg.dtype != f32);  // times_quadratic_form
  BwdProgram p(kb, cfg, /*reverse=*/false);
  Tensor dq = kb.tensor("dq", dt, 4);
  Tensor coef = cfg.coefficient_grads ? kb.tensor("coef_partials", f32, 2) : Tensor();
  p.declare_scalars(kb);
  const bool coefs = cfg.coefficient_grads;

  const ChunkBounds& ch = p.ch;
  Tile Q = p.chunk(p.q, ch.t0, BK);
  Tile Qf = coefs ? Q.to(f32) : Tile();
  Tile dN = p.chunk(p.dn, ch.t0, BV);
  Tile dD = cfg.normalize ? p.dd_rows(ch.t0) : Tile();

  // The states' share, block by block: J_m(q)^T S_m dn (the normalizer's share of the degree-2 blocks
  // is dd times the gradient of q^T Z2 q, 2 Z2 q, taken once after them).
  Tile dQ = zeros({BT, BK}, f32);
  Tile dA = zeros({BT}, f32), dB = zeros({BT}, f32), dC = zeros({BT}, f32);  // per row (coefs)
  Tile s2 = p.scale * p.scale;
  // None before a sequence's first segment (has_segments).
  auto from_states = [&] {
    std::vector<Tile*> carried = {&dQ};
    if (coefs) carried.push_back(&dC);
    p.for_degree2(Q, [&](Tile m, Tile w, Tile Q_left, Tile Q_right) {
      Tile Ql = Q_left.to(f32), Qr = Q_right.to(f32);
      Tile u = dot(dN, p.state(m).T());
      Tile u_rolled = dot(dN, p.rolled_rows_state(m).T());
      dQ = dQ + (u * Ql + u_rolled * Qr) * w;
      if (coefs) dC = dC + sum(Qf * Ql * u, 1) * (degree2_weight(m, p.Kdim) * s2);
    }, carried);
    // Loaded after the blocks' loop, so that its buffer may take the place of the loop's.
    const ZTables z = cfg.normalize ? p.z_tables() : ZTables{};
    if (cfg.normalize && cfg.quadratic) {
      Tile Zq = times_quadratic_form(Q, z.quadratic);  // rows (Z2 q_t)^T
      dQ = dQ + expand_dims(dD, 1) * Zq * (2.0f * p.c2);
      if (coefs) dC = dC + dD * sum(Qf * Zq, 1) * s2;
    }
    Tile u1 = dot(dN, p.state(p.deg2).T());
    if (cfg.normalize) u1 = u1 + expand_dims(dD, 1) * slice(z.low, 0, 0, 1);
    dQ = dQ + u1 * (p.b * p.scale);
    if (coefs) {
      dB = sum(Qf * u1, 1) * p.scale;
      Tile s0 = load(p.states, {p.row, ch.i_h, p.deg2 + 1, 0, 0}, {kIndex, kIndex, kIndex, kIndex, BV}).to(f32);
      dA = sum(dN.to(f32) * expand_dims(s0, 0), 1);
      if (cfg.normalize) dA = dA + dD * take(take(z.low, 1, 0), 0, 0);
    }
  };
  Tile has_states = has_segments(cfg, p.segment_t0(), ch.bos, ch.eos, /*after=*/false);
  if (coefs)
    if_then(has_states, from_states, dQ, dA, dB, dC);
  else
    if_then(has_states, from_states, dQ);

  // The segment's own keys up to this chunk: dq_t += scale sum_s g_ts f'(x_ts) k_s.
  Tile causal = expand_dims(iota(BT), 1) >= expand_dims(iota(BT), 0);
  std::vector<Tile*> intra_carried = {&dQ};
  if (coefs) {
    intra_carried.push_back(&dA);
    intra_carried.push_back(&dB);
    intra_carried.push_back(&dC);
  }
  for_range_carrying(p.segment * CPS, ch.chunk + 1, [&](Tile c) {
    Tile t0 = ch.bos + c * BT;
    Tile Kc = p.chunk(p.k, t0, BK);
    Tile G = dot(dN, p.chunk(p.v, t0, BV).T());
    if (cfg.normalize) G = G + expand_dims(dD, 1);
    Tile X = dot(Q, Kc.T()) * p.scale;
    Tile mask = causal | (c < ch.chunk);
    Tile df = where(mask, p.b + 2.0f * p.c * X, 0.0f);
    dQ = dQ + dot((G * df).to(dt), Kc) * p.scale;
    if (coefs) {
      Tile Gm = where(mask, G, 0.0f);
      dA = dA + sum(Gm, 1);
      dB = dB + sum(Gm * X, 1);
      dC = dC + sum(Gm * X * X, 1);
    }
  }, intra_carried);
  store(dq, {ch.b, ch.t0, ch.i_h, 0}, {kIndex, BT, kIndex, BK}, dQ.to(dt), ch.in_seq);
  if (coefs) {
    // Rows past the sequence have dn = dd = 0: they add nothing.
    Tile col = iota(kSumColumns);
    Tile part = where(col == 0, full({kSumColumns}, 1.0, f32) * sum(dA, 0),
                      where(col == 1, full({kSumColumns}, 1.0, f32) * sum(dB, 0),
                            where(col == 2, full({kSumColumns}, 1.0, f32) * sum(dC, 0), 0.0f)));
    store(coef, {program_id(0) * num_programs(1) + program_id(1), 0}, {kIndex, kSumColumns}, part);
  }
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_poly_bwd_coefficients(const PolyConfig& cfg) {
  constexpr int64_t kRows = 128;
  const DType f32 = DType::f32;
  KernelBuilder kb("poly_bwd_coefficients");
  kb.set_num_warps(4);
  kb.set_num_stages(cfg.num_stages);
  Tensor coef = kb.tensor("coef_partials", f32, 2);
  Tensor da = kb.tensor("da", f32, 1);
  Tensor db = kb.tensor("db", f32, 1);
  Tensor dc = kb.tensor("dc", f32, 1);
  Tile total = zeros({kSumColumns}, f32);
  for_range(0, (coef.dim(0) + (kRows - 1)) / kRows, [&](Tile i) {
    total = total + sum(load(coef, {i * kRows, 0}, {kRows, kSumColumns}), 0);
  }, total);
  store(da, {0}, {kIndex}, take(total, 0, 0));
  store(db, {0}, {kIndex}, take(total, 1, 0));
  store(dc, {0}, {kIndex}, take(total, 2, 0));
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_poly_bwd_dkv(const PolyConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v, CPS = cfg.segment_chunks;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_bwd_dkv");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  kb.set_min_ctas_per_sm(cfg.min_ctas);
  kb.set_tensor_core_f32(cfg.dtype != f32);  // times_quadratic_form
  BwdProgram p(kb, cfg, /*reverse=*/true);
  Tensor dk = kb.tensor("dk", dt, 4);
  Tensor dv = kb.tensor("dv", dt, 4);
  p.declare_scalars(kb);

  const ChunkBounds& ch = p.ch;
  Tile Kc = p.chunk(p.k, ch.t0, BK);
  Tile V = p.chunk(p.v, ch.t0, BV);

  // The states' share, block by block: J_m(k)^T R_m v (the normalizer's share of the degree-2 blocks
  // is the gradient of k^T R2 k, R2 = sum_t dd_t q_t q_t^T: 2 R2 k, taken once after them).
  Tile dK = zeros({BT, BK}, f32);
  Tile dV = zeros({BT, BV}, f32);  // the degree-2 blocks' share without c scale^2, taken once after them
  // None after a sequence's last segment (has_segments).
  auto from_states = [&] {
    p.for_degree2_rolled(Kc, /*left=*/true, [&](Tile m, Tile w, Tile K_left) {
      Tile R = p.state(m);
      // phi_m(k) in the input dtype (two 16-bit values multiplied and rounded once), the weight 1 or 2
      // exact: no fp32 copy of the chunk stays live through the loop for it.
      dV = dV + dot(Kc * K_left * degree2_weight(m, p.Kdim).to(dt), R);
      dK = dK + dot(V, R.T()) * K_left.to(f32) * w;
    }, {&dK, &dV});
    p.for_degree2_rolled(Kc, /*left=*/false, [&](Tile m, Tile w, Tile K_right) {
      dK = dK + dot(V, p.rolled_rows_state(m).T()) * K_right.to(f32) * w;
    }, {&dK});
    if (p.deg2 > 0) dV = dV * p.c2;
    const ZTables r = cfg.normalize ? p.z_tables() : ZTables{};
    if (cfg.normalize && cfg.quadratic)
      dK = dK + times_quadratic_form(Kc, r.quadratic) * (2.0f * p.c2);
    Tile b1 = p.b * p.scale;
    Tile R1 = p.state(p.deg2);
    dV = dV + dot(Kc, R1) * b1;
    Tile u1 = dot(V, R1.T());
    if (cfg.normalize) u1 = u1 + slice(r.low, 0, 0, 1);
    dK = dK + u1 * b1;
    Tile s0 = load(p.states, {p.row, ch.i_h, p.deg2 + 1, 0, 0}, {kIndex, kIndex, kIndex, kIndex, BV});
    dV = dV + expand_dims(s0.to(f32) * p.a, 0);
  };
  if_then(has_segments(cfg, p.segment_t0(), ch.bos, ch.eos, /*after=*/true), from_states, dK, dV);

  // The segment's own queries from this chunk on: dk_s += scale sum_t g_ts f'(x_ts) q_t, dv_s += sum_t
  // f_ts dn_t (the products transposed: rows t, columns s).
  Tile causal = expand_dims(iota(BT), 1) >= expand_dims(iota(BT), 0);
  Tile chunks = (ch.eos - ch.bos + (BT - 1)) / BT;
  for_range(ch.chunk, minimum((p.segment + 1) * CPS, chunks), [&](Tile c) {
    Tile t0 = ch.bos + c * BT;
    Tile Q = p.chunk(p.q, t0, BK);
    Tile dN = p.chunk(p.dn, t0, BV);
    Tile G = dot(dN, V.T());
    if (cfg.normalize) G = G + expand_dims(p.dd_rows(t0), 1);
    Tile X = dot(Q, Kc.T()) * p.scale;
    Tile mask = causal | (c > ch.chunk);
    Tile F = where(mask, cfg.quadratic ? p.a + X * (p.b + p.c * X) : p.a + p.b * X, 0.0f);
    Tile df = where(mask, p.b + 2.0f * p.c * X, 0.0f);
    dV = dV + dot(F.to(dt).T(), dN);
    dK = dK + dot((G * df).to(dt).T(), Q) * p.scale;
  }, dK, dV);
  store(dk, {ch.b, ch.t0, ch.i_h, 0}, {kIndex, BT, kIndex, BK}, dK.to(dt), ch.in_seq);
  store(dv, {ch.b, ch.t0, ch.i_h, 0}, {kIndex, BT, kIndex, BV}, dV.to(dt), ch.in_seq);
  return kb.finish();
}

}  // namespace linac
