// Reductions and scans. The operand is in shared memory (the plan puts it there); each thread
// computes the result elements its layout gives it by walking the reduced axis. Sums accumulate in
// f32 (f64 for f64). Simple and exact enough; a warp-shuffle path for mma rows is future work.
#include <fmt/format.h>

#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

using ir::OpCode;
using passes::Layout;

namespace {

llvm::Value* combine(llvm::IRBuilder<>& b, ir::ReduceKind kind, DType acc_t, llvm::Value* acc, llvm::Value* x) {
  if (is_float(acc_t)) {
    switch (kind) {
      case ir::ReduceKind::sum: return b.CreateFAdd(acc, x);
      case ir::ReduceKind::max: return b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, acc, x);
      case ir::ReduceKind::min: return b.CreateBinaryIntrinsic(llvm::Intrinsic::minnum, acc, x);
    }
  }
  switch (kind) {
    case ir::ReduceKind::sum: return b.CreateAdd(acc, x);
    case ir::ReduceKind::max: return b.CreateBinaryIntrinsic(llvm::Intrinsic::smax, acc, x);
    case ir::ReduceKind::min: return b.CreateBinaryIntrinsic(llvm::Intrinsic::smin, acc, x);
  }
  throw InternalError("bad reduce kind");
}

/// The accumulator type: 16-bit floats accumulate in f32.
DType acc_dtype(DType t) { return (t == DType::bf16 || t == DType::f16) ? DType::f32 : t; }

}  // namespace

void KernelLowering::lower_reduce(const ir::Op& op) {
  const ir::Value* x = op.operands[0];
  const auto& shape = x->type.shape;
  const int axis = static_cast<int>(op.attrs.axis);
  const DType t = x->type.dtype, at = acc_dtype(t);
  const ir::ReduceKind kind = op.attrs.reduce;
  const Layout out_l = op.result()->type.is_scalar() ? Layout::uniform() : layout(op.result());
  Regs out(out_l.regs_per_thread());
  for (int r = 0; r < out_l.regs_per_thread(); ++r) {
    Coords rc = coords_of(out_l, r);
    llvm::Value* first = convert(smem_read(x, [&] {
                           Coords c = rc;
                           c.insert(c.begin() + axis, i32(0));
                           return c;
                         }()),
                         t, at);
    auto res = emit_counted_loop(i32(1), i32(shape[axis]), {first}, [&](llvm::Value* j, const std::vector<llvm::Value*>& acc) {
      Coords c = rc;
      c.insert(c.begin() + axis, j);
      return std::vector<llvm::Value*>{combine(b_, kind, at, acc[0], convert(smem_read(x, c), t, at))};
    });
    out[r] = convert(res[0], at, t);
  }
  regs_[op.result()] = out;
}

void KernelLowering::lower_scan(const ir::Op& op) {
  const ir::Value* x = op.operands[0];
  const auto& shape = x->type.shape;
  const int axis = static_cast<int>(op.attrs.axis);
  const DType t = x->type.dtype, at = acc_dtype(t);
  const Layout& l = layout(op.result());
  Regs out(l.regs_per_thread());
  for (int r = 0; r < l.regs_per_thread(); ++r) {
    Coords c = coords_of(l, r);
    llvm::Value* i = c[axis];
    // Inclusive: elements 0..i, or i..n-1 when reversed.
    llvm::Value* lo = op.attrs.reverse ? i : i32(0);
    llvm::Value* hi = op.attrs.reverse ? i32(shape[axis]) : b_.CreateAdd(i, i32(1));
    llvm::Value* zero = is_float(at) ? llvm::ConstantFP::get(llvm_type(at), 0.0)
                                     : llvm::ConstantInt::get(llvm_type(at), 0);
    llvm::Value* init = zero;
    if (op.attrs.reduce != ir::ReduceKind::sum) {
      Coords c0 = c;
      c0[axis] = lo;
      init = convert(smem_read(x, c0), t, at);
    }
    auto res = emit_counted_loop(lo, hi, {init}, [&](llvm::Value* j, const std::vector<llvm::Value*>& acc) {
      Coords cj = c;
      cj[axis] = j;
      return std::vector<llvm::Value*>{combine(b_, op.attrs.reduce, at, acc[0], convert(smem_read(x, cj), t, at))};
    });
    out[r] = convert(res[0], at, t);
  }
  regs_[op.result()] = out;
}

}  // namespace linac::nvptx
