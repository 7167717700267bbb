// L2 normalization of the last axis of [B, T, H, D] tensors, and its backward: what --l2norm-qk means
// for the delta rules (kDeltaL2NormEps, fla's l2norm), as plan launches. The forward kernels normalize
// q and k inside; their backward runs on normalized copies (l2norm_rows) and takes the gradients back
// through the normalization (l2norm_rows_bwd):
//   y = x / sqrt(|x|^2 + eps)   =>   dx = (dy - y (y . dy)) / sqrt(|x|^2 + eps)
#pragma once
#include <string>

#include "kernels/op.h"

namespace linac {

/// The launch that writes plan tensor `y` = l2-normalized rows of plan tensor `x` (same shape).
KernelLaunch l2norm_rows_launch(const OpPlan& plan, const std::string& x, const std::string& y, double eps);
/// The launch that turns plan tensor `dy`, the gradient w.r.t. the normalized rows of `x`, into the
/// gradient w.r.t. `x`, in place.
KernelLaunch l2norm_rows_bwd_launch(const OpPlan& plan, const std::string& x, const std::string& dy, double eps);

}  // namespace linac
