#include "compiler/passes/pipeline.h"

#include <algorithm>

#include "compiler/passes/layout.h"

namespace linac::passes {

using ir::OpCode;

namespace {

void collect(const ir::Kernel& k, const ir::Block& b, const std::set<const ir::Value*>& stored, PipelinePlan& plan) {
  for (const auto& op : b.ops) {
    for (const auto& r : op->regions) collect(k, *r, stored, plan);
    if (op->code != OpCode::For) continue;
    const ir::Block& body = *op->regions[0];
    for (const auto& inner : body.ops) {
      if (inner->code != OpCode::Load || inner->result()->type.is_scalar()) continue;
      // A tensor the kernel also writes may be written by this very loop: reading it an iteration
      // early would read stale data (e.g. a state kept in global memory and updated in place).
      if (stored.count(inner->operands[0])) continue;
      if (!splits_into_16_byte_copies(inner->result()->type, k.num_warps * 32)) continue;
      bool predictable = true;
      for (size_t i = 1; i < inner->operands.size(); ++i) predictable &= is_predictable_scalar(inner->operands[i], body);
      if (predictable) plan.loads.insert(inner.get());
    }
  }
}

}  // namespace

std::set<const ir::Value*> stored_tensors(const ir::Kernel& k) {
  std::set<const ir::Value*> stored;
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    if (op.code == OpCode::Store) stored.insert(op.operands[0]);
  });
  return stored;
}

bool splits_into_16_byte_copies(const ir::Type& t, int num_threads) {
  if (t.is_scalar()) return false;
  int elem = dtype_bytes(t.dtype);
  if (elem != 2 && elem != 4) return false;
  // cp.async moves 16 bytes: the tile must split into 16-byte runs over all the threads.
  Layout l = Layout::blocked(t.shape, num_threads, elem);
  return l.vec * elem == 16;
}

bool is_predictable_scalar(const ir::Value* v, const ir::Block& body) {
  if (!v->type.is_scalar()) return false;
  if (!ir::defined_in(v, body)) return true;  // loop-invariant
  if (!v->def) return v == body.args[0];  // the induction variable (carried values are not)
  switch (v->def->code) {
    case OpCode::Constant: case OpCode::Dim: case OpCode::ProgramId: case OpCode::NumPrograms:
      return true;
    case OpCode::Add: case OpCode::Sub: case OpCode::Mul: case OpCode::Div: case OpCode::Rem:
    case OpCode::Max: case OpCode::Min: case OpCode::Cast:
      for (const ir::Value* o : v->def->operands)
        if (!is_predictable_scalar(o, body)) return false;
      return true;
    default: return false;
  }
}

PipelinePlan plan_pipelining(const ir::Kernel& k) {
  PipelinePlan plan;
  plan.stages = std::clamp(k.num_stages, 1, ir::kMaxNumStages);
  if (plan.stages < 2) return plan;
  collect(k, k.body, stored_tensors(k), plan);
  return plan;
}

}  // namespace linac::passes
