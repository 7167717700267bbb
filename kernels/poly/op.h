// The op "poly" (docs/ops/poly.md): its registry entry and what its files share. op.cpp holds the
// registry entry and the forward's plans and defaults, op_bwd.cpp the backward's; the kernels they
// launch are in fwd.h and bwd.h (the math alone).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/op.h"

namespace linac {

/// The op "poly" for the registry.
OpDef poly_op();

/// Finite coefficients, and with `normalize` a positive f (c > 0 with b^2 < 4ac, or b = c = 0 < a):
/// UserError naming the coefficients otherwise.
void check_poly_coefficients(double a, double b, double c, bool normalize);

/// The plan of `linac run poly --backward` (the pairwise form) for coefficients a, b, c.
OpPlan plan_poly_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted, double a,
                     double b, double c);
/// The backward's kernels at head dim 64, for dump/compile and the ptxas check.
std::vector<std::shared_ptr<ir::Kernel>> poly_bwd_kernels(const OpOptions& opts);

}  // namespace linac
