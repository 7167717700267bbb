// Backward of normalized linear attention (`linac run linear_attn --normalize --backward`), composed
// from plain linear attention's kernels: with N = LA(q, k, v) and D = LA(q, k, 1) (scale applied to
// both), o = N / (D + eps), so
//   dN = do / (D + eps),  dD = -rowsum(do .* o) / (D + eps)
//   (dq, dk, dg) = LA_bwd(q, k, v; dN) + LA_bwd(q, k, 1; dD),  dv = LA_bwd(q, k, v; dN).dv
// Launches: the two forwards (recomputed), an elementwise kernel for dN and dD, the two backwards
// (each O(T*D) memory, states recomputed), and the sums. No initial or final state (as the forward).
// This file: the prep kernel (dN and dD); the plan that composes it with the others is in op_bwd.cpp.
#pragma once
#include <cstdint>
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// Rows per program of the prep kernel. (At 64 it held three [64, V] f32 tiles in 224 registers per
/// thread and ran at a quarter of HBM speed: docs/ops/linear_attn.md, "Measured".)
inline constexpr int64_t kNormalizedBwdPrepRows = 16;

/// One program per (kNormalizedBwdPrepRows tokens, batch x head): from do, the numerator N and the
/// denominator D (without eps) of the forward, o = N / (D + eps) and
///   dN = do / (D + eps),   dD = -rowsum(do .* o) / (D + eps)      (fp32; stored in the input dtype)
/// Per token, so varlen needs nothing here (packed sequences are rows of B = 1). `block_v`: V padded.
/// Parameters: do num den dnum dden.
std::shared_ptr<ir::Kernel> build_linear_attn_normalized_bwd_prep(DType dt, int64_t block_v);

}  // namespace linac
