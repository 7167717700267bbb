// Software pipelining of the loads of a chunk loop (num_stages >= 2).
//
// A load directly in a for body whose offsets and limits are pure scalar functions of the induction
// variable and of values defined before the loop can be issued one iteration early: the lowering
// copies the block for iteration i+1 into shared memory with cp.async (16-byte vectors, zero-filled
// past the bounds) while iteration i computes on the block copied during iteration i-1. The loaded
// tile then lives only in shared memory ("stage" i % 2 of its buffer); consumers read it there
// (dot operands through ldmatrix, everything else through shared-memory reads).
#pragma once
#include <set>

#include "compiler/ir/ir.h"

namespace linac::passes {

struct PipelinePlan {
  int stages = 1;
  std::set<const ir::Op*> loads;  // the pipelined loads
  bool contains(const ir::Value* v) const { return v->def && loads.count(v->def); }
};

/// Chooses the loads to pipeline: loads directly in a for body, with predictable offsets, from a
/// tensor the kernel never stores to, whose tile splits into 16-byte vectors (cp.async's unit) over
/// the kernel's threads.
PipelinePlan plan_pipelining(const ir::Kernel& k);

/// Whether `v` is computed from the block's induction variable and values defined outside `body`
/// by pure scalar ops only (what the lowering can re-evaluate for the next iteration).
bool is_predictable_scalar(const ir::Value* v, const ir::Block& body);

}  // namespace linac::passes
