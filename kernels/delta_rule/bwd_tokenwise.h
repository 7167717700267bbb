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
#include <memory>
#include <string>
#include <vector>

#include "kernels/op.h"

namespace linac {

OpPlan plan_delta_rule_bwd(bool gated, const TensorMap& inputs, const OpOptions& opts,
                           const std::vector<std::string>& wanted);
std::vector<std::shared_ptr<ir::Kernel>> delta_rule_bwd_kernels(bool gated, const OpOptions& opts);

}  // namespace linac
