// Normalized polynomial-kernel attention (docs/ops/poly.md, seed 000):
//   o_t = sum_{s<=t} f(x_ts) v_s / sum_{s<=t} f(x_ts),  f(x) = a + b x + c x^2,  x_ts = scale q_t . k_s
// computed chunk by chunk with the factorized state of seed 000 (degrees 0, 1, 2), never the T x T
// score matrix and never a feature map phi(k) per token. The kernels in the DSL and the op.
//
// The degree-2 numerator state sum_s (k_s (x) k_s)^T v_s is K^2 x V per head: too big for registers,
// so it lives in a scratch tensor the op allocates, state2 [N*H, K(K+1)/2, V] fp32, holding only the
// symmetric part (entries (d, e) with e >= d, row d*K - d(d-1)/2 + (e - d)), updated in place chunk
// by chunk (token by token in the recurrent form). The degree-2 normalizer sum_s k_s (x) k_s goes the
// same way: norm2 [grid[0]*N*H, K(K+1)/2, 1] fp32. Every program owns the V columns of its block of
// its (sequence, head) slab of state2 and its own slab of norm2, so programs never share scratch.
// The chunked form is two kernels (poly_fwd_deg2, then poly_fwd) that pass the inter-chunk degree-2
// terms through o2 [B,T,H,V] and den2 [B,T,H,1] fp32. Memory: O(T*D) for inputs, outputs, o2 and
// den2, plus O(K^2 V) per (sequence, head).
//
// No gate and no initial/final state: the op starts every sequence from an empty state.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// Added to the denominator (fp32) of the normalized output.
inline constexpr double kPolyEps = 1e-6;

/// Compile-time configuration of the poly kernels. Every field specializes the kernel; the
/// coefficients a, b, c and the scale are runtime scalars.
struct PolyConfig {
  DType dtype = DType::f32;  // q, k, v and o
  int chunk = 64;            // BT: rows per chunk (chunked form only; both chunked kernels alike)
  int block_k = 64;          // BK >= K (the whole key dim lives in one program; masked past K)
  int block_v = 64;          // BV: value columns per program
  bool normalize = true;     // divide by the kernel sum (+ kPolyEps); false: the plain numerator
  bool quadratic = true;     // c != 0: the degree-2 terms and their scratch (all skipped when c == 0)
  bool varlen = false;       // cu_seqlens [N+1] present, B == 1
  int num_warps = 4;
  int num_stages = 2;
};

/// Records the first chunked kernel (cfg.quadratic only): the inter-chunk degree-2 terms of every
/// token, numerator c scale^2 sum_{d,e} q_d q_e S2[d,e] into o2 and (cfg.normalize) denominator
/// c scale^2 sum_{d,e} q_d q_e Z2[d,e] into den2, updating state2 and norm2.
/// Parameters: q k v [cu_seqlens] state2 o2 [norm2 den2] scale c.
std::shared_ptr<ir::Kernel> build_poly_fwd_deg2(const PolyConfig& cfg);
/// Records the second chunked kernel: the intra-chunk terms and degrees 0 and 1, plus o2 and den2,
/// into o. Parameters: q k v [cu_seqlens] [o2] [den2] o scale a b [c].
std::shared_ptr<ir::Kernel> build_poly_fwd(const PolyConfig& cfg);
/// Records the token-by-token forward kernel: one kernel, the same states (cfg.chunk is unused).
/// Parameters: q k v [cu_seqlens] [state2] [norm2] o scale a b [c].
std::shared_ptr<ir::Kernel> build_poly_recurrent(const PolyConfig& cfg);

}  // namespace linac
