// Backward of delta_rule and gated_delta_rule (`--backward`), token by token with checkpoints: the
// slow-but-correct form. With a_t = exp(g_t) (1 without a gate), w_t = S_{t-1}^T k_t, u_t = v_t - a_t w_t:
//   S_t = a_t S_{t-1} + beta_t k_t u_t^T,   o_t = scale q_t S_t
// Reverse mode, dS = dL/dS_t (starting from dfinal_state), per token from the end:
//   dS += scale q_t do_t^T;   x = dS^T k_t;   du = beta_t x
//   dq_t = scale S_t do_t (forward walk)      dv_t = du
//   dk_t = beta_t dS u_t - a_t S_{t-1} du     dbeta_t = x . u_t
//   da_t = <dS, S_{t-1}> - beta_t x . w_t     dg_t = a_t da_t
//   dS <- a_t (dS - k_t du^T)                 (after the first token: dinitial_state)
// S_{t-1} is needed walking backwards: the forward walk stores the state every 16 tokens
// (checkpoints, [N, H, ceil(T/16), K, V]: T*K*V/16 elements), and the reverse walk recomputes each
// 16-token block's states into a per-program scratch [N*H, 16, K, V] before walking it backwards.
// Memory O(T*K*V/16 + N*H*16*K*V) - linear in T. With --l2norm-qk, q and k are normalized into
// scratch first and dq, dk taken back through the normalization after (kernels/common/l2norm.h).
#pragma once
#include <cstdint>
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// Tokens between checkpoints.
inline constexpr int64_t kDeltaBwdCheckpointTokens = 16;

/// Compile-time configuration of the token-by-token backward kernels.
struct DeltaBwdConfig {
  DType dtype = DType::f32;
  int block_k = 64, block_v = 64;  // the whole head (dk sums over V, dv and dbeta over K)
  bool gated = false, initial_state = false, final_state_grad = false, initial_state_grad = false, varlen = false;
};

/// The forward walk: dq_t = scale S_t do_t, and the state before every kDeltaBwdCheckpointTokens tokens.
/// Parameters: q k v beta [g] do [initial_state] [cu_seqlens] checkpoints dq scale.
std::shared_ptr<ir::Kernel> build_delta_bwd_forward(const DeltaBwdConfig& cfg);
/// The reverse walk. Parameters: q k v beta [g] do [dfinal_state] [cu_seqlens] checkpoints scratch dk dv
/// dbeta [dg] [dinitial_state] scale.
std::shared_ptr<ir::Kernel> build_delta_bwd_reverse(const DeltaBwdConfig& cfg);

}  // namespace linac
