// Which wgmma products are waited for one iteration late.
//
// A wgmma dot is issued asynchronously; by default the lowering waits for it at once (the accumulators
// are its result). In a chunk loop whose pipeline has a slack stage (pipeline.h: three stages or more),
// a product that only adds to a value the loop carries, `S = S + dot(a, b)`, need not be waited for
// until the next iteration's end: the next iteration's barrier, copies and the computation of its own
// operands then overlap the tensor cores' work, and the next product accumulates into the same
// registers behind it (wgmma orders products on one accumulator). The lowering waits for all but the
// iteration's own deferred groups at the end of each iteration, and for all of them after the loop.
//
// The rule, for a dot on wgmma (SmemPlan::wgmma_dots) directly in such a loop's body:
//   - it absorbs an add (dot_accumulate.h) whose accumulator is a value the loop carries, and the add's
//     result is read by the body's yield only (nothing reads the accumulators while the product runs);
//   - every shared-memory operand is a pipelined load of this loop (its stage is refilled only once
//     the wait has passed, pipeline.h) or a value defined before the loop (its buffer is not written
//     while the loop runs).
// An operand read from registers may be overwritten by the next iteration only after the product has
// read it; ptxas tracks that (and serializes the products, with a warning, where it cannot).
//
// A carried accumulator that enters the loop as zeros is not zeroed by instructions: ptxas then
// serialized every product of the kernel (C7515, "non wgmma instructions defining accumulator
// registers"), its analysis merging the loop's entry with the back edge. The first iteration's product
// starts from zero itself instead (wgmma's scale-d off), and the loop's result is zero where no
// iteration ran.
#pragma once
#include <map>
#include <set>

#include "compiler/ir/ir.h"
#include "compiler/passes/dot_accumulate.h"
#include "compiler/passes/smem_plan.h"

namespace linac::passes {

/// The dots of `k` whose wait is deferred to the end of the next iteration (the rule above), each with
/// whether its accumulator enters the loop as zeros.
std::map<const ir::Op*, DeferredWait> deferred_wgmma_waits(const ir::Kernel& k, const SmemPlan& plan,
                                                           const DotAccumulators& accumulators);

/// The other wgmma dots (plan.wgmma_dots not in plan.deferred_waits), each waited for where its result is
/// first read rather than at once: products issued back to back run together, and the code between a
/// product and the first read of its result (elementwise math on other values, shared-memory writes that
/// need no barrier) overlaps it. The lowering waits before an op that reads a pending result (through
/// rematerialized values and views too), before any barrier (a later write into an operand's bytes is
/// always behind one: smem hazards), before control flow and flags, and at the end of each block.
std::set<const ir::Op*> first_use_wgmma_waits(const SmemPlan& plan);

}  // namespace linac::passes
