// In-place elementwise updates between the kernels of an op's plan: acc = acc + x or acc = acc * x
// over [B, T, H, D] (rank 4) or [B, T, H] (rank 3) tensors, computed in fp32 and stored in acc's dtype.
// Used to sum the partial gradients of composed backwards and to apply noise-dropout multipliers. Also
// the flat dtype conversion op calls put before an op's launches.
#pragma once
#include <memory>
#include <string>

#include "kernels/op.h"

namespace linac {

enum class ElementwiseUpdate { add, mul };

/// The kernel (memoized) for acc of dtype `acc_t` and x of dtype `x_t`; D <= block_d (rank 4).
/// Parameters: acc x. Launch with elementwise_update_launch.
std::shared_ptr<ir::Kernel> elementwise_update_kernel(ElementwiseUpdate kind, DType acc_t, DType x_t, int rank,
                                                      int64_t block_d);

/// The launch that updates plan tensor `acc` with plan tensor `x` (same shape, [B, T, H(, D)]).
KernelLaunch elementwise_update_launch(const OpPlan& plan, ElementwiseUpdate kind, const std::string& acc,
                                       const std::string& x);

/// The kernel (memoized) that converts a flat tensor x of dtype `from` into o of dtype `to`
/// (o = x when they are equal): how an op call takes an input in another dtype than its kernels read.
/// Parameters: x o, both rank 1 of one length. Launch on convert_grid(length).
std::shared_ptr<ir::Kernel> convert_kernel(DType from, DType to);
std::array<int64_t, 3> convert_grid(int64_t length);

}  // namespace linac
