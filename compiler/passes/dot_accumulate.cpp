#include "compiler/passes/dot_accumulate.h"

#include <algorithm>

namespace linac::passes {

using ir::OpCode;

namespace {

/// Whether `v` is available at `op`: a block argument of op's block or of one enclosing it, or the
/// result of an op before `op` in its block or before the op enclosing it in an enclosing block.
bool available_at(const ir::Value* v, const ir::Op& op) {
  for (const ir::Op* at = &op; at; at = at->parent ? at->parent->parent : nullptr) {
    const ir::Block& b = *at->parent;
    if (!v->def && v->owner == &b) return true;
    if (v->def && v->def->parent == &b) {
      for (const auto& o : b.ops) {
        if (o.get() == v->def) return true;
        if (o.get() == at) return false;
      }
    }
  }
  return false;
}

}  // namespace

DotAccumulators find_dot_accumulators(const ir::Kernel& k, const LayoutMap& layouts) {
  // Uses of every value, by their ops' positions in program order.
  std::map<const ir::Op*, int> position;
  std::map<const ir::Value*, std::vector<const ir::Op*>> users;
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    position[&op] = static_cast<int>(position.size());
    for (const ir::Value* o : op.operands) users[o].push_back(&op);
  });
  auto used_once = [&](const ir::Value* v) { return users[v].size() == 1; };
  // acc's other readers all come before the dot: it dies at the add, and its registers become the
  // dot's (else both would stay live, and the dot's copy of acc would cost what the fusion saves).
  auto dies_at = [&](const ir::Value* acc, const ir::Op& dot, const ir::Op& add) {
    for (const ir::Op* u : users[acc])
      if (u != &add && position[u] > position[&dot]) return false;
    return true;
  };
  DotAccumulators found;
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    if (op.code != OpCode::Add || op.result()->type.is_scalar()) return;
    for (int i = 0; i < 2; ++i) {
      const ir::Value* d = op.operands[i];
      const ir::Value* acc = op.operands[1 - i];
      if (!d->def || d->def->code != OpCode::Dot || !used_once(d) || acc == d) continue;
      const ir::Op& dot = *d->def;
      if (found.acc_of_dot.count(&dot) || dot.parent != op.parent) continue;
      if (k.tensor_core_f32 && dot.operands[0]->type.dtype == DType::f32) continue;
      const auto l = layouts.find(d), la = layouts.find(acc), lr = layouts.find(op.result());
      if (l == layouts.end() || la == layouts.end() || lr == layouts.end()) continue;
      if (!(l->second == la->second && l->second == lr->second)) continue;
      if (!available_at(acc, dot) || !dies_at(acc, dot, op)) continue;
      found.acc_of_dot[&dot] = acc;
      found.dot_of_add[&op] = &dot;
      return;
    }
  });
  return found;
}

}  // namespace linac::passes
