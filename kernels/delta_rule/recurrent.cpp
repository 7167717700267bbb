// The token-by-token (decode) form of the delta rules (docs/ops/README.md, "The token-by-token (decode) form").
#include "kernels/delta_rule/fwd.h"

#include "kernels/common/prologue.h"
#include "linac/blocks.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

// One program per (V block, sequence x head) walks the tokens of its sequence with the state
// S [BK, BV] in fp32 registers. Per token, with alpha = exp(g_t) (1 without a gate):
//   S' = alpha S;   S = S' + k^T (beta (v - k S'));   o = scale q S
// which is alpha (I - beta k^T k) S + beta k^T v. The products k S and q S are reductions over the
// key axis (dot needs 16 rows or more).
std::shared_ptr<ir::Kernel> build_delta_rule_recurrent(const DeltaRuleConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb(cfg.gated ? "gated_delta_rule_recurrent" : "delta_rule_recurrent");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  Tensor beta = kb.tensor("beta", f32, 3);
  Tensor g = cfg.gated ? kb.tensor("g", f32, 3) : Tensor();
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor ht = cfg.final_state ? kb.tensor("final_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, cu, cfg.varlen, 1);
  const auto [b, bos, eos] = seq_rows;
  Tile v0 = i_v * BV;

  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});

  auto normalized = [&](Tile x) { return cfg.l2norm_qk ? blocks::l2normalize(x, 0, kDeltaL2NormEps) : x; };
  for_range(bos, eos, [&](Tile t) {
    Tile qt = normalized(load(q, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32));
    Tile kt = normalized(load(k, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32));
    Tile vt = load(v, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    Tile beta_t = load(beta, {b, t, i_h}, {kIndex, kIndex, kIndex});
    if (cfg.gated) S = S * exp(load(g, {b, t, i_h}, {kIndex, kIndex, kIndex}));
    // expand_dims at each use, not once: the shared-memory planner ends kt's live range at its last
    // direct use, so a view made early and consumed late would read a reused buffer.
    Tile delta = (vt - sum(expand_dims(kt, 1) * S, 0)) * beta_t;
    S = S + expand_dims(kt, 1) * expand_dims(delta, 0);
    Tile ot = sum(expand_dims(qt, 1) * S, 0) * scale;
    store(o, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}, ot.to(dt));
  }, S);

  if (cfg.final_state) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

}  // namespace linac
