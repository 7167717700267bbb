// Kimi Delta Attention (KDA, Kimi Linear 2025): the gated delta rule with a per-channel gate g_t [K]
// (log space, g <= 0) instead of a per-head scalar. With q_t, k_t L2-normalized (as fla's
// use_qk_l2norm_in_kernel) and S_t [K, V]:
//   S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,   o_t = scale S_t^T q_t
#pragma once
#include <memory>

#include "linac/dsl.h"

/// --l2norm's epsilon: q and k are divided by sqrt(sum x^2 + kKdaNormEps) (fla's l2norm).
inline constexpr double kKdaNormEps = 1e-6;

/// Compile-time parameters: each value gives a different kernel (the runtime shapes B, T, H do not).
struct KdaConfig {
  int chunk = 32;      // rows per chunk (BT, a power of two >= 16; the chunked kernel only)
  int block_k = 64;    // key dim tile (>= K, a power of two; columns past K load as 0)
  int block_v = 64;    // value columns per program
  linac::DType dtype = linac::DType::f32;  // dtype of q, k, v and o (g, beta and the states are f32)
  bool initial_state = false;              // initial_state [B,H,K,V] given
};

/// The chunked forward kernel. Parameters: q k [B,T,H,K], v [B,T,H,V], g [B,T,H,K], beta [B,T,H],
/// [initial_state], o [B,T,H,V], final_state [B,H,K,V], scale. Grid: (ceil(V / block_v), B * H).
std::shared_ptr<linac::ir::Kernel> build_kda_chunked(const KdaConfig& cfg);

/// The token-by-token kernel: the recurrence as written. Same parameters and grid.
std::shared_ptr<linac::ir::Kernel> build_kda_recurrent(const KdaConfig& cfg);
