// Backward of poly (`linac run poly ... do=do.npy --backward`), the analytic form of seed 000 on the
// factorized state, in the segmented schedule of the forward (fwd.h). With f(x_ts) = sum_j w_j
// phi_j(q_t) . phi_j(k_s) (features.h), o_t = N_t / D_t, N_t = sum_{s<=t} f_ts v_s, D_t = sum_s f_ts + eps:
//   dn_t = do_t / D_t,  dd_t = -do_t . o_t / D_t          (dn = do, dd = 0 with --no-normalize)
//   g_ts = dn_t . v_s + dd_t
//   dq_t = sum_j w_j J_j(q_t)^T (S_j dn_t + z_j dd_t),   S_j = sum_{s<=t} phi_j(k_s) v_s^T, z_j = sum phi_j(k_s)
//   dk_s = sum_j w_j J_j(k_s)^T (R_j v_s + r_j),        R_j = sum_{t>=s} phi_j(q_t) dn_t^T, r_j = sum phi_j(q_t) dd_t
//   dv_s = sum_j w_j R_j^T phi_j(k_s)
// J_j the Jacobian of phi_j: for the degree-2 block m, J_m(x)^T u = u .* roll(x, m) + roll(u .* x, -m)
// (roll left by m, then right), for degree 1 the identity. The degree-2 blocks' normalizer terms add
// up to the gradient of a quadratic form (fwd.h, poly_z_rows): sum_m w_m J_m(q)^T z_m = 2 Z2 q with
// Z2 = sum_s k_s k_s^T, and likewise 2 R2 k with R2 = sum_t dd_t q_t q_t^T, one product per chunk.
// The states S, z are the forward's (states, zstates: before each segment); R, r come from the same
// sums and a reverse scan over the segments (rstates, rzstates: after each segment). Inside a segment the pairs (t, s) are taken directly:
// dq_t += scale sum_s g_ts f'(x_ts) k_s, dk_s += scale sum_t g_ts f'(x_ts) q_t, dv_s += sum_t f_ts dn_t,
// f' = b + 2 c x. O(T (L + K^2) D) work and O(T D) + O(T/L K^2 V) memory, like the forward.
#pragma once
#include <memory>

#include "kernels/poly/fwd.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// Records dq: one program per (chunk, sequence x head) (one V block: cfg.block_v covers V).
/// Parameters: q k v dn [dd] [cu_seqlens chunk_indices segment_offsets] states [zstates] dq
/// [coef_partials: [programs, 16] fp32, row program_id(0) * num_programs(1) + program_id(1)] scale a b [c].
std::shared_ptr<ir::Kernel> build_poly_bwd_dq(const PolyConfig& cfg);
/// Records the sum of poly_bwd_dq's per-program partial gradients of a, b, c (cfg.coefficient_grads):
/// one program. Parameters: coef_partials [programs, 16] fp32 (columns 0, 1, 2) da db dc ([1] fp32).
std::shared_ptr<ir::Kernel> build_poly_bwd_coefficients(const PolyConfig& cfg);
/// Records dk and dv: one program per (chunk, sequence x head). Parameters: q k v dn [dd] [cu_seqlens
/// chunk_indices segment_offsets] rstates [rzstates] dk dv scale a b [c].
std::shared_ptr<ir::Kernel> build_poly_bwd_dkv(const PolyConfig& cfg);

}  // namespace linac
