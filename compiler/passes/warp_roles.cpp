#include "compiler/passes/warp_roles.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string>

#include "compiler/passes/pipeline.h"
#include "linac/error.h"

namespace linac::passes {

using ir::OpCode;

namespace {

[[noreturn]] void refuse(const ir::Kernel& k, const SourceLoc& loc, const std::string& why) {
  throw UserError(loc.known() ? loc : k.loc,
                  fmt::format("kernel {}: producer warps (producer_warps = {}) need {}", k.name, k.producer_warps, why));
}

/// Adds to `needed` the top-level ops that value v comes from (through the loop body's scalar ops, which
/// the producer evaluates per iteration as the computing warps do).
void collect_sources(const ir::Kernel& k, const ir::Block& body, const ir::Value* v, const std::set<const ir::Value*>& stored,
                     std::set<const ir::Op*>& needed) {
  if (!v->def) {
    if (v->owner == &k.body || v == body.args[0]) return;  // a parameter, the induction variable
    refuse(k, k.loc, "the copies' coordinates to come from the induction variable, not from values the loop carries");
  }
  const ir::Op& op = *v->def;
  if (op.parent == &body) {  // a predictable scalar of the body (pipeline.h): its operands
    for (const ir::Value* o : op.operands) collect_sources(k, body, o, stored, needed);
    return;
  }
  if (op.parent != &k.body)
    refuse(k, op.loc, fmt::format("the copies' coordinates to come from the kernel's top level, not from inside {}",
                                  ir::dsl_spelling(*op.parent->parent)));
  if (needed.count(&op)) return;
  const bool scalar_result = op.results.size() == 1 && op.result()->type.is_scalar();
  const bool effect = op.code == OpCode::Store || op.code == OpCode::Signal || op.code == OpCode::Wait || !op.regions.empty();
  if (!scalar_result || effect)
    refuse(k, op.loc, fmt::format("the copies' coordinates to be computed from scalars alone; {} is not one",
                                  ir::dsl_spelling(op)));
  for (size_t i = 0; i < op.operands.size(); ++i) {
    const ir::Value* o = op.operands[i];
    if (o->type.is_tensor()) {
      if (op.code == OpCode::Load && i == 0 && stored.count(o))
        refuse(k, op.loc, "the scalars the copies' coordinates come from to be loaded from tensors the kernel never writes");
      continue;
    }
    if (!o->type.is_scalar())
      refuse(k, op.loc, fmt::format("the copies' coordinates to be computed from scalars alone; {} reads a tile",
                                    ir::dsl_spelling(op)));
    collect_sources(k, body, o, stored, needed);
  }
  needed.insert(&op);
}

}  // namespace

ProducerPlan plan_producer(const ir::Kernel& k, const PipelinePlan& pipeline) {
  ProducerPlan plan;
  if (k.producer_warps == 0 || pipeline.tma.empty()) return plan;
  // The loops with pipelined loads: one, at the top level, all of its loads by TMA.
  std::vector<const ir::Op*> rings;
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    if (op.code != OpCode::For) return;
    for (const auto& inner : op.regions[0]->ops)
      if (pipeline.loads.count(inner.get())) {
        rings.push_back(&op);
        return;
      }
  });
  if (rings.size() != 1)
    refuse(k, k.loc, fmt::format("one chunk loop with pipelined loads; this kernel has {}", rings.size()));
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    // A wait holds the copies of later iterations back until its flag is up (ir.h, Wait); the
    // producer, which runs ahead, does not wait.
    if (op.code == OpCode::Wait) refuse(k, op.loc, "a kernel without wait_for");
  });
  const ir::Op& loop = *rings[0];
  if (loop.parent != &k.body) refuse(k, loop.loc, "the chunk loop at the kernel's top level, not nested");
  const ir::Block& body = *loop.regions[0];
  std::vector<const ir::Op*> loads;
  for (const auto& inner : body.ops) {
    if (!pipeline.loads.count(inner.get())) continue;
    if (!pipeline.tma.count(inner.get()))
      refuse(k, inner->loc, "every pipelined load of the loop copied by TMA (a box of its tensor); this one is not");
    loads.push_back(inner.get());
  }
  const std::set<const ir::Value*> stored = stored_tensors(k);
  std::set<const ir::Op*> needed;
  for (int i = 0; i < 3; ++i) collect_sources(k, body, loop.operands[i], stored, needed);
  for (const ir::Op* load : loads)
    for (size_t i = 1; i < load->operands.size(); ++i) collect_sources(k, body, load->operands[i], stored, needed);
  plan.loop = &loop;
  for (const auto& op : k.body.ops)
    if (needed.count(op.get())) plan.prologue.push_back(op.get());
  return plan;
}

int block_threads(const ir::Kernel& k, const ProducerPlan& producer) {
  return (k.num_warps + (producer.loop ? k.producer_warps : 0)) * 32;
}

RoleRegisters role_registers(const ir::Kernel& k, const PipelinePlan& pipeline) {
  constexpr int kRegisterFile = 64 * 1024, kMaxRegisters = 248;
  const int producer = k.producer_warps * 32, consumer = k.num_warps * 32;
  const int blocks = std::max(1, k.min_ctas_per_sm);
  RoleRegisters r;
  r.launch = std::min(kMaxRegisters, kRegisterFile / ((producer + consumer) * blocks) / 8 * 8);
  // The producer computes addresses and bounds of one iteration's copies: 40 registers (CUTLASS's
  // Hopper kernels keep 24 to 40) for up to 7 loads per iteration; 48 above, where what each load keeps
  // live across the producer's loop no longer fits 40 (gla_bwd_dkdv, 8 loads: 8 bytes spilled at 40).
  constexpr size_t kLoadsAt40 = 7;
  r.producer = std::min(pipeline.tma.size() > kLoadsAt40 ? 48 : 40, r.launch);
  r.consumer = std::min(kMaxRegisters, (r.launch * (producer + consumer) - r.producer * producer) / consumer / 8 * 8);
  return r;
}

}  // namespace linac::passes
