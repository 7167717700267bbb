// Backward of normalized linear attention (`linac run linear_attn --normalize --backward`), composed
// from plain linear attention's kernels: with N = LA(q, k, v) and D = LA(q, k, 1) (scale applied to
// both), o = N / (D + eps), so
//   dN = do / (D + eps),  dD = -rowsum(do .* o) / (D + eps)
//   (dq, dk, dg) = LA_bwd(q, k, v; dN) + LA_bwd(q, k, 1; dD),  dv = LA_bwd(q, k, v; dN).dv
// Launches: the two forwards (recomputed), an elementwise kernel for dN and dD, the two backwards
// (each O(T*D) memory, states recomputed), and the sums. No initial or final state (as the forward).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/op.h"

namespace linac {

/// The plan of the normalized backward. Inputs q k v [g] [cu_seqlens] do; outputs dq dk dv [dg].
OpPlan plan_linear_attn_normalized_bwd(const TensorMap& inputs, const OpOptions& opts,
                                       const std::vector<std::string>& wanted);
/// Its own kernels (the elementwise ones) at head dim 64, for the ptxas check.
std::vector<std::shared_ptr<ir::Kernel>> linear_attn_normalized_bwd_kernels(const OpOptions& opts);

}  // namespace linac
