// Reductions and scans. The operand is in shared memory (the plan puts it there); each thread
// computes the result elements its layout gives it by walking the reduced axis. Sums accumulate in
// f32 (f64 for f64). Two faster forms: 1-D tiles no longer than the program reduce with warp shuffles
// (1-D tiles of up to 32 elements within every warp at once, with no barrier: the gates of a chunk);
// 2-D tiles whose layout splits the thread index into row and column bits (mma accumulators, most
// blocked tiles: passes::register_reduction) reduce in registers, then across lanes with shuffles,
// then across warps through the scratch area.
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

namespace {

llvm::Value* identity(llvm::IRBuilder<>& b, ir::ReduceKind kind, llvm::Type* ty) {
  if (ty->isFloatingPointTy()) {
    if (kind == ir::ReduceKind::sum) return llvm::ConstantFP::get(ty, 0.0);
    return llvm::ConstantFP::getInfinity(ty, kind == ir::ReduceKind::max);
  }
  unsigned bits = ty->getIntegerBitWidth();
  if (kind == ir::ReduceKind::sum) return llvm::ConstantInt::get(ty, 0);
  return b.getInt(kind == ir::ReduceKind::max ? llvm::APInt::getSignedMinValue(bits) : llvm::APInt::getSignedMaxValue(bits));
}

}  // namespace

llvm::Value* KernelLowering::scratch_addr(llvm::Value* byte_offset) {
  llvm::Value* base = b_.CreateConstGEP1_64(b_.getInt8Ty(), smem_ptr_, smem_.scratch_offset);
  return b_.CreateGEP(b_.getInt8Ty(), base, byte_offset);
}

bool KernelLowering::lower_reduce_1d(const ir::Op& op) {
  const ir::Value* x = op.operands[0];
  const DType t = x->type.dtype, at = acc_dtype(t);
  const int threads = k_.num_warps * 32;
  if (x->type.rank() != 1 || !op.result()->type.is_scalar() || (at != DType::f32 && at != DType::i32) ||
      x->type.shape[0] > threads)
    return false;
  const int64_t n = x->type.shape[0];
  llvm::Type* aty = llvm_type(at);
  before_smem_read(x);
  // Up to 32 elements, every warp reduces the whole tile (lane l takes element l) and holds the result:
  // no per-warp partials, no barrier. Longer tiles: thread t takes element t, then the warps' partials.
  const bool warp_local = n <= 32;
  llvm::Value* pos = warp_local ? b_.CreateURem(tid_, i32(32)) : tid_;
  llvm::Value* valid = b_.CreateICmpULT(pos, i32(n));
  llvm::Value* v = convert(smem_read(x, {b_.CreateSelect(valid, pos, i32(0))}), t, at);
  v = b_.CreateSelect(valid, v, identity(b_, op.attrs.reduce, aty));
  auto shfl = at == DType::f32 ? llvm::Intrinsic::nvvm_shfl_sync_bfly_f32 : llvm::Intrinsic::nvvm_shfl_sync_bfly_i32;
  for (int off = 16; off >= 1; off /= 2)
    v = combine(b_, op.attrs.reduce, at, v, b_.CreateIntrinsic(shfl, {}, {i32(-1), v, i32(off), i32(31)}));
  if (!warp_local && k_.num_warps > 1) {
    // One partial per warp through scratch; every thread folds them in the same order.
    std::pair<int64_t, int64_t> range{smem_.scratch_offset, smem_.scratch_offset + 32 * 8};
    before_smem_write(range);
    llvm::Value* warp = b_.CreateUDiv(tid_, i32(32));
    llvm::BasicBlock* st = llvm::BasicBlock::Create(ctx_, "red.partial", fn_);
    llvm::BasicBlock* cont = llvm::BasicBlock::Create(ctx_, "red.cont", fn_);
    b_.CreateCondBr(b_.CreateICmpEQ(b_.CreateURem(tid_, i32(32)), i32(0)), st, cont);
    b_.SetInsertPoint(st);
    b_.CreateStore(v, scratch_addr(b_.CreateMul(warp, i32(4))));
    b_.CreateBr(cont);
    b_.SetInsertPoint(cont);
    before_smem_read(range);
    v = b_.CreateLoad(aty, scratch_addr(i32(0)));
    for (int w = 1; w < k_.num_warps; ++w) v = combine(b_, op.attrs.reduce, at, v, b_.CreateLoad(aty, scratch_addr(i32(4 * w))));
  }
  regs_[op.result()] = {convert(v, at, t)};
  return true;
}

bool KernelLowering::lower_scan_1d(const ir::Op& op) {
  const ir::Value* x = op.operands[0];
  const DType t = x->type.dtype, at = acc_dtype(t);
  const int threads = k_.num_warps * 32;
  if (x->type.rank() != 1 || op.attrs.reduce != ir::ReduceKind::sum || (at != DType::f32 && at != DType::i32) ||
      x->type.shape[0] > threads)
    return false;
  const int64_t n = x->type.shape[0];
  llvm::Type* aty = llvm_type(at);
  before_smem_read(x);
  // Up to 32 elements, every warp scans the whole tile (lane l takes the l-th element in scan order)
  // and hands each thread its result elements with shfl.idx: no scratch, no barrier. Longer tiles:
  // thread t takes the t-th element, then the totals of earlier warps and the results go through
  // scratch.
  const bool warp_local = n <= 32;
  llvm::Value* lane = b_.CreateURem(tid_, i32(32));
  llvm::Value* pos = warp_local ? lane : tid_;
  llvm::Value* valid = b_.CreateICmpULT(pos, i32(n));
  llvm::Value* idx = op.attrs.reverse ? b_.CreateSub(i32(n - 1), pos) : pos;
  idx = b_.CreateSelect(valid, idx, i32(0));
  llvm::Value* v = b_.CreateSelect(valid, convert(smem_read(x, {idx}), t, at), identity(b_, ir::ReduceKind::sum, aty));
  // Inclusive scan in each warp (Kogge-Stone with shfl.up), then the totals of earlier warps.
  auto shfl = at == DType::f32 ? llvm::Intrinsic::nvvm_shfl_sync_up_f32 : llvm::Intrinsic::nvvm_shfl_sync_up_i32;
  for (int d = 1; d < 32; d *= 2) {
    llvm::Value* y = b_.CreateIntrinsic(shfl, {}, {i32(-1), v, i32(d), i32(0)});
    v = b_.CreateSelect(b_.CreateICmpUGE(lane, i32(d)), combine(b_, ir::ReduceKind::sum, at, v, y), v);
  }
  if (warp_local) {
    // Element e of the result sits in lane e (lane n-1-e for a reverse scan) of every warp.
    const Layout& l = layout(op.result());
    auto idx_shfl = at == DType::f32 ? llvm::Intrinsic::nvvm_shfl_sync_idx_f32 : llvm::Intrinsic::nvvm_shfl_sync_idx_i32;
    Regs out(l.regs_per_thread());
    for (int r = 0; r < l.regs_per_thread(); ++r) {
      llvm::Value* e = coords_of(l, r)[0];
      llvm::Value* src = op.attrs.reverse ? b_.CreateSub(i32(n - 1), e) : e;
      out[r] = convert(b_.CreateIntrinsic(idx_shfl, {}, {i32(-1), v, src, i32(31)}), at, t);
    }
    regs_[op.result()] = out;
    return true;
  }
  llvm::Value* warp = b_.CreateUDiv(tid_, i32(32));
  const int64_t partials = smem_.scratch_offset, results = smem_.scratch_offset + 32 * 8;
  if (k_.num_warps > 1) {
    std::pair<int64_t, int64_t> range{partials, partials + 32 * 8};
    before_smem_write(range);
    llvm::BasicBlock* st = llvm::BasicBlock::Create(ctx_, "scan.total", fn_);
    llvm::BasicBlock* cont = llvm::BasicBlock::Create(ctx_, "scan.cont", fn_);
    b_.CreateCondBr(b_.CreateICmpEQ(lane, i32(31)), st, cont);
    b_.SetInsertPoint(st);
    b_.CreateStore(v, scratch_addr(b_.CreateMul(warp, i32(4))));
    b_.CreateBr(cont);
    b_.SetInsertPoint(cont);
    before_smem_read(range);
    for (int w = 0; w + 1 < k_.num_warps; ++w) {
      llvm::Value* total = b_.CreateLoad(aty, scratch_addr(i32(4 * w)));
      v = b_.CreateSelect(b_.CreateICmpUGT(warp, i32(w)), combine(b_, ir::ReduceKind::sum, at, v, total), v);
    }
  }
  // Element idx of the result, then read back in the result's layout.
  std::pair<int64_t, int64_t> out_range{results, results + n * 4};
  before_smem_write(out_range);
  llvm::BasicBlock* st = llvm::BasicBlock::Create(ctx_, "scan.out", fn_);
  llvm::BasicBlock* cont = llvm::BasicBlock::Create(ctx_, "scan.out.cont", fn_);
  b_.CreateCondBr(valid, st, cont);
  b_.SetInsertPoint(st);
  b_.CreateStore(v, scratch_addr(b_.CreateAdd(i32(32 * 8), b_.CreateMul(idx, i32(4)))));
  b_.CreateBr(cont);
  b_.SetInsertPoint(cont);
  before_smem_read(out_range);
  regs_[op.result()] = read_scratch_in_layout(op.result(), at, [&](const Coords& c) {
    return b_.CreateAdd(i32(32 * 8), b_.CreateMul(c[0], i32(4)));
  });
  return true;
}

bool KernelLowering::lower_reduce_registers(const ir::Op& op) {
  const ir::Value* x = op.operands[0];
  const Layout& l = layout(x);
  const bool data = cls(x) == passes::ValueClass::Data, held = data && !pipelined(x);
  const auto plan = passes::register_reduction(op, l, data);
  if (!plan) return false;
  const DType t = x->type.dtype, at = acc_dtype(t);
  const ir::ReduceKind kind = op.attrs.reduce;
  const int kept_axis = 1 - static_cast<int>(op.attrs.axis);
  llvm::Type* aty = llvm_type(at);
  // The thread's registers of each kept coordinate, folded in register order (an operand not held is
  // evaluated one group at a time, so that only a group's elements are live); then the lanes along the
  // reduced axis with butterfly shuffles (every lane of a group ends with the same sum).
  const Regs held_regs = held ? get_in_layout(x, l) : Regs();
  auto element = [&](int r) { return convert(held ? held_regs[r] : eval_at(x, coords_of(l, r)), t, at); };
  std::vector<llvm::Value*> part;
  for (const std::vector<int>& group : plan->groups) {
    llvm::Value* v = element(group[0]);
    for (size_t i = 1; i < group.size(); ++i) v = combine(b_, kind, at, v, element(group[i]));
    part.push_back(v);
  }
  auto shfl = at == DType::f32 ? llvm::Intrinsic::nvvm_shfl_sync_bfly_f32 : llvm::Intrinsic::nvvm_shfl_sync_bfly_i32;
  for (int off : plan->lane_xors)
    for (auto& v : part) v = combine(b_, kind, at, v, b_.CreateIntrinsic(shfl, {}, {i32(-1), v, i32(off), i32(31)}));
  // One lane per group and warp (its reduced-axis lane bits clear; no replica warp) writes the warp's
  // partials to its slot: the value of the warp's reduced-axis bits.
  int lane_mask = 0;
  for (int off : plan->lane_xors) lane_mask |= off;
  llvm::Value* lane = b_.CreateURem(tid_, i32(32));
  llvm::Value* warp = b_.CreateUDiv(tid_, i32(32));
  llvm::Value* slot = i32(0);
  for (size_t i = 0; i < plan->slot_bits.size(); ++i) {
    llvm::Value* bit = b_.CreateAnd(b_.CreateLShr(warp, i32(plan->slot_bits[i])), i32(1));
    slot = b_.CreateOr(slot, b_.CreateShl(bit, i32(static_cast<int64_t>(i))));
  }
  const ByteRange range{smem_.scratch_offset, smem_.scratch_offset + plan->scratch_bytes()};
  before_smem_write(range);
  llvm::Value* writes = b_.CreateICmpEQ(b_.CreateAnd(lane, i32(lane_mask)), i32(0));
  if (plan->replica_warps)
    writes = b_.CreateAnd(writes, b_.CreateICmpEQ(b_.CreateAnd(warp, i32(plan->replica_warps)), i32(0)));
  llvm::BasicBlock* st = llvm::BasicBlock::Create(ctx_, "red.regs.out", fn_);
  llvm::BasicBlock* cont = llvm::BasicBlock::Create(ctx_, "red.regs.cont", fn_);
  b_.CreateCondBr(writes, st, cont);
  b_.SetInsertPoint(st);
  llvm::Value* slot_base = b_.CreateMul(slot, i32(plan->kept));
  for (size_t g = 0; g < plan->groups.size(); ++g) {
    llvm::Value* c = coords_of(l, plan->groups[g][0])[kept_axis];
    b_.CreateStore(part[g], scratch_addr(b_.CreateMul(b_.CreateAdd(slot_base, c), i32(4))));
  }
  b_.CreateBr(cont);
  b_.SetInsertPoint(cont);
  before_smem_read(range);
  // Each result element: its slots' partials in slot order.
  const Layout& out_l = layout(op.result());
  Regs out(out_l.regs_per_thread());
  for (int r = 0; r < out_l.regs_per_thread(); ++r) {
    llvm::Value* c = coords_of(out_l, r)[0];
    llvm::Value* v = nullptr;
    for (int64_t s = 0; s < plan->slots(); ++s) {
      llvm::Value* e = b_.CreateLoad(aty, scratch_addr(b_.CreateMul(b_.CreateAdd(c, i32(s * plan->kept)), i32(4))));
      v = v ? combine(b_, kind, at, v, e) : e;
    }
    out[r] = convert(v, at, t);
  }
  regs_[op.result()] = out;
  return true;
}

void KernelLowering::lower_reduce(const ir::Op& op) {
  if (lower_reduce_1d(op) || lower_reduce_registers(op)) return;
  const ir::Value* x = op.operands[0];
  const auto& shape = x->type.shape;
  const int axis = static_cast<int>(op.attrs.axis);
  const DType t = x->type.dtype, at = acc_dtype(t);
  const ir::ReduceKind kind = op.attrs.reduce;
  const Layout out_l = op.result()->type.is_scalar() ? Layout::uniform() : layout(op.result());
  // The operand is read element by element: from its buffer, or (a rank-3 tile fused into this
  // reduction) evaluated from the buffers of its data leaves, here and nowhere else.
  const bool fused = layout(x).kind == Layout::Kind::Fused;
  std::vector<ByteRange> reads;
  if (fused) {
    std::function<void(const ir::Value*)> leaves = [&](const ir::Value* v) {
      if (smem_.buffers.count(v)) {
        reads.push_back(smem_range(v));
      } else if (v->def && !v->type.is_scalar()) {
        for (const ir::Value* o : v->def->operands) leaves(o);
      }
    };
    leaves(x);
  } else {
    reads.push_back(smem_range(x));
  }
  before_smem_access(reads, {});  // any barrier must come before the per-thread loops, never inside them
  auto element = [&](const Coords& c) { return convert(fused ? eval_at(x, c) : smem_read(x, c), t, at); };
  Regs out(out_l.regs_per_thread());
  for (int r = 0; r < out_l.regs_per_thread(); ++r) {
    Coords rc = coords_of(out_l, r);
    llvm::Value* first = element([&] {
      Coords c = rc;
      c.insert(c.begin() + axis, i32(0));
      return c;
    }());
    auto res = emit_counted_loop(i32(1), i32(shape[axis]), {first}, [&](llvm::Value* j, const std::vector<llvm::Value*>& acc) {
      Coords c = rc;
      c.insert(c.begin() + axis, j);
      return std::vector<llvm::Value*>{combine(b_, kind, at, acc[0], element(c))};
    });
    out[r] = convert(res[0], at, t);
  }
  regs_[op.result()] = out;
}

Regs KernelLowering::read_scratch_in_layout(const ir::Value* result, DType at,
                                            const std::function<llvm::Value*(const Coords&)>& byte_offset) {
  const Layout& l = layout(result);
  Regs out(l.regs_per_thread());
  for (int r = 0; r < l.regs_per_thread(); ++r) {
    llvm::Value* e = b_.CreateLoad(llvm_type(at), scratch_addr(byte_offset(coords_of(l, r))));
    out[r] = convert(e, at, result->type.dtype);
  }
  return out;
}

bool KernelLowering::lower_scan_2d(const ir::Op& op) {
  const ir::Value* x = op.operands[0];
  const DType t = x->type.dtype, at = acc_dtype(t);
  if (!smem_.line_scans || passes::scan_2d_scratch_bytes(op) == 0) return false;
  const int axis = static_cast<int>(op.attrs.axis);
  const int64_t n = x->type.shape[axis], m = x->type.shape[1 - axis];
  const int threads = k_.num_warps * 32;
  // Each of the first m threads scans one line (column for axis 0) from end to end, in order, and
  // writes every prefix to scratch; then each thread reads its elements in the result's layout. The
  // line's loads do not depend on each other, so they issue back to back; only the adds chain. (The
  // general form below walks up to n elements per result element, one shared-memory round trip per
  // step: 4 us per call at 32 x 32, which made the gated delta rule's forward twice as slow.)
  before_smem_read(x);
  const ByteRange range{smem_.scratch_offset, smem_.scratch_offset + n * m * 4};
  before_smem_write(range);
  for (int64_t first = 0; first < m; first += threads) {
    llvm::Value* line = b_.CreateAdd(tid_, i32(first));
    llvm::BasicBlock* body = llvm::BasicBlock::Create(ctx_, "scan2d.line", fn_);
    llvm::BasicBlock* cont = llvm::BasicBlock::Create(ctx_, "scan2d.cont", fn_);
    b_.CreateCondBr(b_.CreateICmpULT(line, i32(m)), body, cont);
    b_.SetInsertPoint(body);
    auto coords = [&](llvm::Value* j) { return axis == 0 ? Coords{j, line} : Coords{line, j}; };
    auto slot = [&](llvm::Value* j) {
      return scratch_addr(b_.CreateMul(b_.CreateAdd(b_.CreateMul(j, i32(m)), line), i32(4)));
    };
    // Folds element s of the line (in scan order) into acc (nullptr: it starts the accumulator, as an
    // identity would not for max/min) and stores the prefix.
    auto fold = [&](llvm::Value* s, llvm::Value* acc) {
      llvm::Value* j = op.attrs.reverse ? b_.CreateSub(i32(n - 1), s) : s;
      llvm::Value* e = convert(smem_read(x, coords(j)), t, at);
      acc = acc ? combine(b_, op.attrs.reduce, at, acc, e) : e;
      b_.CreateStore(acc, slot(j));
      return acc;
    };
    // Steps of `unroll` elements keep loads in flight without holding a whole line in registers. The
    // first step is straight-line.
    const int64_t unroll = n % 8 == 0 ? 8 : n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1;
    llvm::Value* acc = nullptr;
    for (int64_t s = 0; s < unroll; ++s) acc = fold(i32(s), acc);
    emit_counted_loop(i32(1), i32(n / unroll), {acc}, [&](llvm::Value* i, const std::vector<llvm::Value*>& a) {
      llvm::Value* r = a[0];
      for (int64_t u = 0; u < unroll; ++u) r = fold(b_.CreateAdd(b_.CreateMul(i, i32(unroll)), i32(u)), r);
      return std::vector<llvm::Value*>{r};
    });
    b_.CreateBr(cont);
    b_.SetInsertPoint(cont);
  }
  before_smem_read(range);
  regs_[op.result()] = read_scratch_in_layout(op.result(), at, [&](const Coords& c) {
    return b_.CreateMul(b_.CreateAdd(b_.CreateMul(c[axis], i32(m)), c[1 - axis]), i32(4));
  });
  return true;
}

void KernelLowering::lower_scan(const ir::Op& op) {
  if (lower_scan_1d(op) || lower_scan_2d(op)) return;
  const ir::Value* x = op.operands[0];
  const auto& shape = x->type.shape;
  const int axis = static_cast<int>(op.attrs.axis);
  const DType t = x->type.dtype, at = acc_dtype(t);
  const Layout& l = layout(op.result());
  before_smem_read(x);  // any barrier must come before the per-thread loops, never inside them
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
