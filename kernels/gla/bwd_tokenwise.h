// Backward of gla (`linac run gla ... do=do.npy [dfinal_state=..] --backward`). By default in chunks
// (bwd.h); with --config tokenwise=1 token by token, as here: the slow-but-correct
// reference form (a sequential walk per sequence and head, like --recurrent), with memory
// O(T*D): states are recomputed, never stored per token. With S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t
// and o_t = scale q_t S_t:
//   gla_bwd_tokenwise_dq  (forward walk)   dq_t = scale S_t do_t;  also c = rowsum(dfinal .* S_T) per channel
//   gla_bwd_tokenwise_dkv (reverse walk)   dH = dfinal; per t from the end: dH += scale q_t^T do_t,
//                                dk_t = dH v_t, dv_t = k_t dH, dH = diag(exp(g_t)) dH;  dinitial = dH
//                                dg_t = c + sum_{s >= t} (q_s .* dq_s - k_s .* dk_s)
// (the log-gate identity: dL/dG_s = q_s .* dq_s - k_s .* dk_s for the cumulative gate G, plus the
// final state's term at the last token).
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// Compile-time configuration of the token-by-token backward kernels.
struct GlaBwdConfig {
  DType dtype = DType::f32;
  int block_k = 64, block_v = 64;  // the whole head: dq and dk sum over V, dv over K
  bool initial_state = false, final_state_grad = false, initial_state_grad = false, varlen = false;
  int num_warps = 8;
};

/// The forward walk. Parameters: q k v g do [initial_state] [dfinal_state] [cu_seqlens] dq [dg_final] scale.
std::shared_ptr<ir::Kernel> build_gla_bwd_tokenwise_dq(const GlaBwdConfig& cfg);
/// The reverse walk. Parameters: q k v g do dq [dfinal_state dg_final] [cu_seqlens] dk dv dg
/// [dinitial_state] scale.
std::shared_ptr<ir::Kernel> build_gla_bwd_tokenwise_dkv(const GlaBwdConfig& cfg);

}  // namespace linac
