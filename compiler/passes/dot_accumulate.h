// Dots that accumulate in place: `acc + dot(a, b)` (either order) lowers to one dot whose accumulators
// start at acc (mma.sync's C operand; wgmma with scale-d = 1 from its first step) instead of a dot from
// zero followed by an add. That saves the add per element and, more often what matters, the second
// fragment of registers the dot's result would take beside acc: a chunk loop's `S = S + dot(..)`
// keeps one [M, N] accumulator alive, not two.
//
// The rule: the dot's result is used by that add alone; acc, the dot's result and the add's result
// share one layout (acc's registers are the accumulators as they are); acc is available where the dot
// stands (a block argument of an enclosing block, or defined before the dot in its block or in an
// enclosing one) and read by nothing after the dot but the add (else acc and the accumulators would
// both stay live: no register saved, and ptxas spilled linear_attn_fwd on sm_80); the dot is not one
// of the tf32x3 products of tensor_core_f32 kernels (their small terms go first so that a large
// accumulator does not swallow them).
#pragma once
#include <map>

#include "compiler/ir/ir.h"
#include "compiler/passes/layout.h"

namespace linac::passes {

struct DotAccumulators {
  std::map<const ir::Op*, const ir::Value*> acc_of_dot;  // dot -> the value its accumulators start at
  std::map<const ir::Op*, const ir::Op*> dot_of_add;     // the add a dot absorbs -> that dot
};

DotAccumulators find_dot_accumulators(const ir::Kernel& k, const LayoutMap& layouts);

}  // namespace linac::passes
