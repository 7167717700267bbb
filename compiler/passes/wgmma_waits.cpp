#include "compiler/passes/wgmma_waits.h"

#include <map>

namespace linac::passes {

using ir::OpCode;

namespace {

/// Whether tile `v` is zeros: a constant 0, or a splat of one.
bool is_zeros(const ir::Value* v) {
  if (!v->def) return false;
  if (v->def->code == OpCode::Splat) return is_zeros(v->def->operands[0]);
  return v->def->code == OpCode::Constant && v->def->attrs.fvalue == 0 && v->def->attrs.ivalue == 0;
}

}  // namespace

std::map<const ir::Op*, DeferredWait> deferred_wgmma_waits(const ir::Kernel& k, const SmemPlan& plan,
                                                           const DotAccumulators& accumulators) {
  std::map<const ir::Op*, DeferredWait> deferred;
  if (!plan.pipeline.slack() || plan.wgmma_dots.empty()) return deferred;
  std::map<const ir::Value*, std::vector<const ir::Op*>> users;
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    for (const ir::Value* o : op.operands) users[o].push_back(&op);
  });
  std::map<const ir::Op*, const ir::Op*> add_of_dot;
  for (const auto& [add, dot] : accumulators.dot_of_add) add_of_dot[dot] = add;

  for (const auto& [dot, operands] : plan.wgmma_dots) {
    const ir::Block& body = *dot->parent;
    const ir::Op* loop = body.parent;
    if (!loop || loop->code != OpCode::For) continue;
    bool pipelined = false;
    for (const auto& op : body.ops) pipelined = pipelined || plan.pipeline.loads.count(op.get()) > 0;
    if (!pipelined) continue;
    // S = S + dot(..) on a carried S, the sum read by the yield alone.
    const auto add = add_of_dot.find(dot);
    if (add == add_of_dot.end()) continue;
    const ir::Value* acc = accumulators.acc_of_dot.at(dot);
    if (acc->def || acc->owner != &body || acc == body.args[0]) continue;
    const auto& readers = users[add->second->result()];
    if (readers.size() != 1 || readers[0] != body.ops.back().get() || readers[0]->code != OpCode::Yield) continue;
    // Shared-memory operands: this loop's ring stages, or buffers not written while it runs.
    auto stays = [&](const WgmmaOperand& o) {
      if (!o.buf) return true;
      if (o.buf->def && o.buf->def->parent == &body && plan.pipeline.loads.count(o.buf->def)) return true;
      return !ir::defined_in(o.buf, body);
    };
    if (!stays(operands.a) || !stays(operands.b)) continue;
    // The loop's operands: lo, hi, step, then the carried values' initial values (body.args[1..]).
    size_t carried = 0;
    while (body.args[carried] != acc) ++carried;
    deferred[dot] = DeferredWait{.zero_start = is_zeros(loop->operands[2 + carried])};
  }
  return deferred;
}

std::set<const ir::Op*> first_use_wgmma_waits(const SmemPlan& plan) {
  std::set<const ir::Op*> out;
  for (const auto& [dot, operands] : plan.wgmma_dots)
    if (!plan.deferred_waits.count(dot)) out.insert(dot);
  return out;
}

}  // namespace linac::passes
