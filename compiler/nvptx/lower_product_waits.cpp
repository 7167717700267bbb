// wgmma products waited for at their result's first use (passes::first_use_wgmma_waits): each product
// is committed as its own group and left in flight; before an op that reads its result the lowering
// waits for it (wgmma.wait_group N, N the groups committed after it: groups complete in order), and for
// every product before a barrier, control flow, flags and at the end of a block.
#include "compiler/nvptx/lowering.h"

#include <algorithm>
#include <fmt/format.h>
#include <functional>

namespace linac::nvptx {

using ir::OpCode;

namespace {

/// Opaque copies of `regs` (f32), so that their readers depend on an instruction after the wait: LLVM
/// may otherwise move arithmetic on the accumulators ahead of it (it has no data dependence on it).
Regs opaque_copies(llvm::IRBuilder<>& b, const Regs& regs) {
  constexpr size_t kPerStatement = 32;
  Regs out;
  out.reserve(regs.size());
  for (size_t i = 0; i < regs.size(); i += kPerStatement) {
    const size_t n = std::min(kPerStatement, regs.size() - i);
    std::string constraints;
    for (size_t j = 0; j < n; ++j) constraints += "=f,";
    for (size_t j = 0; j < n; ++j) constraints += fmt::format("{}{}", j ? "," : "", j);
    std::vector<llvm::Type*> types(n, b.getFloatTy());
    auto* fty = llvm::FunctionType::get(n == 1 ? types[0] : llvm::StructType::get(b.getContext(), types), types, false);
    auto* copy = llvm::InlineAsm::get(fty, "", constraints, /*hasSideEffects=*/true);
    llvm::Value* r = b.CreateCall(fty, copy, llvm::ArrayRef<llvm::Value*>(regs.data() + i, n));
    for (size_t j = 0; j < n; ++j) out.push_back(n == 1 ? r : b.CreateExtractValue(r, static_cast<unsigned>(j)));
  }
  return out;
}

}  // namespace

void KernelLowering::await_products(size_t n) {
  n = std::min(n, pending_products_.size());
  if (n == 0) return;
  const int64_t newer = wgmma_groups_ - pending_products_[n - 1].group - 1;
  b_.CreateIntrinsic(llvm::Intrinsic::nvvm_wgmma_wait_group_sync_aligned, {b_.getInt64(newer)});
  for (size_t i = 0; i < n; ++i) {
    const PendingProduct& p = pending_products_[i];
    const Regs copied = opaque_copies(b_, regs_.at(p.values[0]));
    for (const ir::Value* v : p.values) regs_[v] = copied;
  }
  pending_products_.erase(pending_products_.begin(), pending_products_.begin() + static_cast<std::ptrdiff_t>(n));
}

size_t KernelLowering::products_read_by_value(const ir::Value* v) const {
  if (pending_products_.empty()) return 0;
  size_t n = 0;
  std::set<const ir::Value*> seen;
  std::function<void(const ir::Value*)> visit = [&](const ir::Value* x) {
    if (!seen.insert(x).second) return;
    for (size_t i = 0; i < pending_products_.size(); ++i)
      if (std::count(pending_products_[i].values.begin(), pending_products_[i].values.end(), x)) n = std::max(n, i + 1);
    // Rematerialized values and views are evaluated where used, from their sources.
    const auto c = smem_.classes.find(x);
    if (x->def && c != smem_.classes.end() && (c->second == passes::ValueClass::Remat || c->second == passes::ValueClass::View))
      for (const ir::Value* o : x->def->operands) visit(o);
  };
  visit(v);
  return n;
}

size_t KernelLowering::products_read_by(const ir::Op& op) const {
  size_t n = 0;
  for (const ir::Value* o : op.operands) n = std::max(n, products_read_by_value(o));
  if (op.code == OpCode::Dot)  // its accumulators start at an absorbed add's other operand
    if (auto acc = accumulators_.acc_of_dot.find(&op); acc != accumulators_.acc_of_dot.end())
      n = std::max(n, products_read_by_value(acc->second));
  return n;
}

void KernelLowering::await_products_before(const ir::Op& op) {
  if (pending_products_.empty()) return;
  if (!op.regions.empty() || op.code == OpCode::Signal || op.code == OpCode::Wait) return await_products();
  if (accumulators_.dot_of_add.count(&op)) return;  // its dot's accumulators: read by the dot (track_absorbed_add)
  await_products(products_read_by(op));
}

void KernelLowering::track_absorbed_add(const ir::Op& op) {
  const auto absorbed = accumulators_.dot_of_add.find(&op);
  if (absorbed == accumulators_.dot_of_add.end()) return;
  for (PendingProduct& p : pending_products_)
    if (p.values[0] == absorbed->second->result()) p.values.push_back(op.result());
}

}  // namespace linac::nvptx
