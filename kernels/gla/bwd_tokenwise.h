// Backward of gla (`linac run gla ... do=do.npy [dfinal_state=..] --backward`). By default in chunks
// (gla_chunked_bwd.h); with --config tokenwise=1 token by token, as here: the slow-but-correct
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
#include <string>
#include <vector>

#include "kernels/op.h"

namespace linac {

/// The plan of gla's backward. Inputs q k v g [initial_state] [cu_seqlens] do [dfinal_state];
/// outputs dq dk dv dg [dinitial_state].
OpPlan plan_gla_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted);
/// Its kernels at head dim 64 with every option (for the ptxas check).
std::vector<std::shared_ptr<ir::Kernel>> gla_bwd_kernels(const OpOptions& opts);

}  // namespace linac
