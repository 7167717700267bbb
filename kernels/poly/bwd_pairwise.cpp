#include "kernels/poly/bwd_pairwise.h"

#include "kernels/common/prologue.h"
#include "kernels/poly/fwd.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {

/// Rows of the inner (pair) loops.
constexpr int64_t kPairRows = 16;

struct Coefficients {
  Tile a, b, c, scale;
};

Coefficients declare_coefficients(KernelBuilder& kb) {
  return {kb.scalar("a", DType::f32), kb.scalar("b", DType::f32), kb.scalar("c", DType::f32),
          kb.scalar("scale", DType::f32)};
}

/// Both kernels' launch shape: 4 warps, no pipeline. One program per (sequence, head): blocks per SM buy
/// nothing here, and ptxas, left to size the registers for as many as fit (.maxntid alone), spilled a
/// few bytes (poly_bwd_kv 4 at 40 registers, poly_bwd_q in fp32 at K = 128 8 at 80, on sm_90a): asked
/// for 4 per SM, it has 128.
void configure_pairwise(KernelBuilder& kb) {
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  kb.set_min_ctas_per_sm(4);
}

}  // namespace

/// One program per (sequence, head) walks its queries t: N_t and D_t over the keys s <= t (blocks of
/// 16 rows, masked to s <= t), then dN_t, dD_t (stored for the key walk) and dq_t.
std::shared_ptr<ir::Kernel> build_poly_bwd_q(const PolyBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v, R = kPairRows;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_bwd_q");
  configure_pairwise(kb);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor d_o = kb.tensor("do", dt, 4);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dn = kb.tensor("dn", f32, 4), dd = kb.tensor("dd", f32, 3), dq = kb.tensor("dq", dt, 4);
  Coefficients co = declare_coefficients(kb);
  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 0);
  Tile rows = iota(R);
  for_range(seq.bos, seq.eos, [&](Tile t) {
    Tile qt = load(q, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile blocks = (t - seq.bos) / R + 1;
    // Keys s in [bos, t]: block j covers bos + jR .. bos + jR + R - 1, masked past t.
    auto pairs = [&](const Tile& j, auto&& body) {
      Tile s0 = seq.bos + j * R;
      AccessOptions upto_t{.limits = {{1, t + 1}}};
      Tile Kb = load(k, {seq.b, s0, i_h, 0}, {kIndex, R, kIndex, BK}, upto_t).to(f32);
      Tile Vb = load(v, {seq.b, s0, i_h, 0}, {kIndex, R, kIndex, BV}, upto_t).to(f32);
      Tile valid = (s0 + rows) <= t;
      Tile x = sum(Kb * expand_dims(qt, 0), 1) * co.scale;
      Tile f = where(valid, co.a + x * co.b + x * x * co.c, 0.0f);
      body(Kb, Vb, valid, x, f);
    };
    Tile N = zeros({BV}, f32), D = constant(0.0, f32);
    for_range(0, blocks, [&](Tile j) {
      pairs(j, [&](const Tile&, const Tile& Vb, const Tile&, const Tile&, const Tile& f) {
        N = N + sum(expand_dims(f, 1) * Vb, 0);
        D = D + sum(f, 0);
      });
    }, N, D);
    Tile dot_ = load(d_o, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile dN = dot_, dD = constant(0.0, f32);
    if (cfg.normalize) {
      Tile inv = 1.0f / (D + kPolyEps);
      dN = dot_ * inv;
      dD = -(sum(dot_ * (N * inv), 0) * inv);
    }
    store(dn, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BV}, dN);
    store(dd, {seq.b, t, i_h}, {kIndex, kIndex, kIndex}, dD);
    Tile dqt = zeros({BK}, f32);
    for_range(0, blocks, [&](Tile j) {
      pairs(j, [&](const Tile& Kb, const Tile& Vb, const Tile& valid, const Tile& x, const Tile&) {
        Tile g = where(valid, (sum(Vb * expand_dims(dN, 0), 1) + dD) * (co.b + x * (co.c * 2.0f)), 0.0f);
        dqt = dqt + sum(expand_dims(g, 1) * Kb, 0);
      });
    }, dqt);
    store(dq, {seq.b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}, (dqt * co.scale).to(dt));
  });
  return kb.finish();
}

/// One program per (sequence, head) walks its keys s: the queries t >= s in blocks of 16 rows.
std::shared_ptr<ir::Kernel> build_poly_bwd_kv(const PolyBwdConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v, R = kPairRows;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_bwd_kv");
  configure_pairwise(kb);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dn = kb.tensor("dn", f32, 4), dd = kb.tensor("dd", f32, 3);
  Tensor dk = kb.tensor("dk", dt, 4), dv = kb.tensor("dv", dt, 4);
  Coefficients co = declare_coefficients(kb);
  const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, 0);
  Tile rows = iota(R);
  AccessOptions in_seq{.limits = {{1, seq.eos}}};
  for_range(seq.bos, seq.eos, [&](Tile s) {
    Tile ks = load(k, {seq.b, s, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile vs = load(v, {seq.b, s, i_h, 0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile dks = zeros({BK}, f32), dvs = zeros({BV}, f32);
    Tile blocks = (seq.eos - s + (R - 1)) / R;
    for_range(0, blocks, [&](Tile j) {
      Tile t0 = s + j * R;  // queries t0 .. t0 + R - 1, masked past the sequence end
      Tile Qb = load(q, {seq.b, t0, i_h, 0}, {kIndex, R, kIndex, BK}, in_seq).to(f32);
      Tile dNb = load(dn, {seq.b, t0, i_h, 0}, {kIndex, R, kIndex, BV}, in_seq);
      Tile dDb = load(dd, {seq.b, t0, i_h}, {kIndex, R, kIndex}, in_seq);
      Tile valid = (t0 + rows) < seq.eos;
      Tile x = sum(Qb * expand_dims(ks, 0), 1) * co.scale;
      Tile f = where(valid, co.a + x * co.b + x * x * co.c, 0.0f);
      Tile g = where(valid, (sum(dNb * expand_dims(vs, 0), 1) + dDb) * (co.b + x * (co.c * 2.0f)), 0.0f);
      dks = dks + sum(expand_dims(g, 1) * Qb, 0);
      dvs = dvs + sum(expand_dims(f, 1) * dNb, 0);
    }, dks, dvs);
    store(dk, {seq.b, s, i_h, 0}, {kIndex, kIndex, kIndex, BK}, (dks * co.scale).to(dt));
    store(dv, {seq.b, s, i_h, 0}, {kIndex, kIndex, kIndex, BV}, dvs.to(dt));
  });
  return kb.finish();
}

}  // namespace linac
