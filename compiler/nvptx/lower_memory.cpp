// Global memory (masked, vectorized loads and stores of tensor blocks) and shared memory (spills of
// tiles that are read at other coordinates, and the reads).
#include <fmt/format.h>
#include <algorithm>
#include <optional>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

using ir::OpCode;
using passes::Layout;
using passes::ValueClass;

namespace {

/// Bytes per thread that one fast-path branch of a load brings in (see lower_load).
constexpr int kMaxBytesPerBranch = 32;

/// Addressing of one load/store: the tensor, its offsets and limits, and which tensor dim each tile
/// axis walks.
struct BlockAccess {
  const TensorView* tensor;
  std::vector<llvm::Value*> offsets;  // i32 per tensor dim
  std::vector<llvm::Value*> bounds;   // i32 per tensor dim: min(limit, dim)
  std::vector<int64_t> dims;          // tensor dim of each tile axis
};

}  // namespace

namespace {

BlockAccess make_access(KernelLowering* self, llvm::IRBuilder<>& b, const TensorView& tv, const ir::Op& op,
                        const std::function<llvm::Value*(const ir::Value*)>& scalar) {
  (void)self;
  BlockAccess a;
  a.tensor = &tv;
  int rank = static_cast<int>(tv.dims.size());
  for (int d = 0; d < rank; ++d) {
    llvm::Value* off = scalar(op.operands[1 + d]);
    if (off->getType() != b.getInt32Ty()) off = b.CreateTrunc(off, b.getInt32Ty());
    a.offsets.push_back(off);
  }
  for (int d = 0; d < rank; ++d) {
    llvm::Value* lim = scalar(op.operands[1 + rank + d]);
    // i64 limits saturate into i32 (sizes are i32); the bound is clamped at 0 so that a negative
    // limit masks everything, as in the interpreter (the unsigned compare below would not).
    if (lim->getType() != b.getInt32Ty())
      lim = b.CreateTrunc(b.CreateBinaryIntrinsic(llvm::Intrinsic::smax,
                                                  b.CreateBinaryIntrinsic(llvm::Intrinsic::smin, lim, b.getInt64(INT32_MAX)),
                                                  b.getInt64(0)),
                          b.getInt32Ty());
    llvm::Value* bound = b.CreateBinaryIntrinsic(llvm::Intrinsic::smin, lim, tv.dims[d]);
    a.bounds.push_back(b.CreateBinaryIntrinsic(llvm::Intrinsic::smax, bound, b.getInt32(0)));
  }
  a.dims = op.attrs.dims;
  return a;
}

/// Tensor indices, in-bounds predicate and element offset (i64) of the element at tile coords `c`.
struct ElementAddr {
  llvm::Value* in_bounds;
  llvm::Value* offset;  // elements from the base pointer
};

/// The tensor index along dim `d` of the element at tile coords `c`: the access's offset plus the
/// coordinates of the tile axes that walk d.
llvm::Value* tensor_index(llvm::IRBuilder<>& b, const BlockAccess& a, const Coords& c, int64_t d) {
  llvm::Value* idx = a.offsets[d];
  for (size_t ax = 0; ax < a.dims.size(); ++ax)
    if (a.dims[ax] == d) idx = b.CreateAdd(idx, c[ax]);
  return idx;
}

ElementAddr element_addr(llvm::IRBuilder<>& b, const BlockAccess& a, const Coords& c) {
  llvm::Value* ok = b.getTrue();
  llvm::Value* off = b.getInt64(0);
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    llvm::Value* idx = tensor_index(b, a, c, static_cast<int64_t>(d));
    // 0 <= idx < bound as one unsigned compare (a negative idx wraps to a huge value).
    ok = b.CreateAnd(ok, b.CreateICmpULT(idx, a.bounds[d]));
    off = b.CreateAdd(off, b.CreateMul(b.CreateSExt(idx, b.getInt64Ty()), a.tensor->strides[d]));
  }
  return {ok, off};
}

/// The runs of a blocked tile's access (`vec` elements along the tensor's inner dim each) when one
/// check per access finds them all contiguous, aligned, and each wholly inside or wholly outside the
/// tensor. A run then costs a compare per walked dim and an add (`run_at`), where the general path
/// checks bounds, alignment and cuts per run (about 20 integer instructions per 16-byte vector, an i64
/// multiply per walked dim among them). Offsets, limits and strides are the same for every thread of
/// the program, so a branch on `holds` never diverges.
struct UniformRuns {
  llvm::Value* holds;         // i1: every run is contiguous, aligned and whole or none
  llvm::Value* unwalked_in;   // i1: the indices of the dims no tile axis walks are in bounds
  llvm::Value* thread_first;  // pointer to the thread's first element (not checked)
  Coords first;               // coordinates of the thread's first element
};

/// nullopt where the layout's runs do not follow the tensor's inner dim alone (a tile axis other than
/// the last walks it too, or the rows are not whole runs).
std::optional<UniformRuns> uniform_runs(llvm::IRBuilder<>& b, const BlockAccess& a, const Layout& l, Coords first) {
  const size_t last = a.dims.size() - 1;
  const int64_t inner = a.dims[last];
  if (l.kind != Layout::Kind::Blocked || l.vec < 2 || l.shape.back() % l.vec != 0) return std::nullopt;
  for (size_t ax = 0; ax < last; ++ax)
    if (a.dims[ax] == inner) return std::nullopt;
  const TensorView& tensor = *a.tensor;
  auto multiple_of_vec = [&](llvm::Value* x) {
    return b.CreateICmpEQ(b.CreateAnd(x, llvm::ConstantInt::get(x->getType(), l.vec - 1)),
                          llvm::ConstantInt::get(x->getType(), 0));
  };
  llvm::Value* base = b.getInt64(0);
  llvm::Value* unwalked_in = b.getTrue();
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    base = b.CreateAdd(base, b.CreateMul(b.CreateSExt(a.offsets[d], b.getInt64Ty()), tensor.strides[d]));
    if (std::find(a.dims.begin(), a.dims.end(), static_cast<int64_t>(d)) == a.dims.end())
      unwalked_in = b.CreateAnd(unwalked_in, b.CreateICmpULT(a.offsets[d], a.bounds[d]));
  }
  // Contiguous runs; the first run aligned and every row step a multiple of a run, so every run aligned.
  llvm::Value* holds = b.CreateAnd(b.CreateICmpEQ(tensor.strides[inner], b.getInt64(1)), multiple_of_vec(base));
  for (size_t ax = 0; ax < last; ++ax) holds = b.CreateAnd(holds, multiple_of_vec(tensor.strides[a.dims[ax]]));
  // Runs start at multiples of vec along the inner dim (so a run before 0 is wholly before it), and
  // the bound cuts none: it is a multiple of vec too, or past the tile's last column.
  llvm::Value* off = a.offsets[inner];
  llvm::Value* uncut = b.CreateOr(multiple_of_vec(a.bounds[inner]),
                                  b.CreateICmpSLE(b.CreateAdd(off, b.getInt32(static_cast<int32_t>(l.shape.back()))), a.bounds[inner]));
  holds = b.CreateAnd(holds, b.CreateAnd(multiple_of_vec(off), uncut));
  llvm::Value* thread_off = base;
  for (size_t ax = 0; ax <= last; ++ax)
    thread_off = b.CreateAdd(thread_off, b.CreateMul(b.CreateSExt(first[ax], b.getInt64Ty()), tensor.strides[a.dims[ax]]));
  return UniformRuns{holds, unwalked_in, b.CreateGEP(b.getIntNTy(8 * dtype_bytes(tensor.dtype)), tensor.ptr, thread_off),
                     std::move(first)};
}

/// Whether `op` runs inside a loop. There the uniform path's per-thread products (coordinates times
/// strides) do not change between iterations, LLVM keeps them in registers across the loop (64 bits per
/// run and load), and kernels near 255 registers spill: with the ring copies on this path, ptxas 13.0
/// spilled poly_bwd_dkv 448 bytes where it spilled 156, and the gated linear_attn_fwd 24 where none.
bool in_loop(const ir::Op& op) {
  for (const ir::Block* blk = op.parent; blk && blk->parent; blk = blk->parent->parent)
    if (blk->parent->code == ir::OpCode::For) return true;
  return false;
}

/// Where `u.holds`, the run starting at coordinates `c`: whether it is in bounds (as a whole), and its
/// address (valid only where it is). Its distance from the thread's first element is the coordinates'
/// difference (a constant for blocked layouts) times the strides, a product computed once per access.
struct RunAt {
  llvm::Value* in_bounds;
  llvm::Value* at;
};

RunAt run_at(llvm::IRBuilder<>& b, const BlockAccess& a, const UniformRuns& u, const Coords& c) {
  llvm::Value* ok = u.unwalked_in;
  llvm::Value* delta = b.getInt64(0);
  // Dims of later axes first: the runs of a thread often share their column, and then so does its check.
  std::vector<bool> checked(a.offsets.size());
  for (size_t ax = a.dims.size(); ax-- > 0;) {
    const int64_t d = a.dims[ax];
    delta = b.CreateAdd(delta, b.CreateMul(b.CreateSExt(b.CreateSub(c[ax], u.first[ax]), b.getInt64Ty()), a.tensor->strides[d]));
    if (checked[d]) continue;
    checked[d] = true;
    ok = b.CreateAnd(ok, b.CreateICmpULT(tensor_index(b, a, c, d), a.bounds[d]));
  }
  return {ok, b.CreateGEP(b.getIntNTy(8 * dtype_bytes(a.tensor->dtype)), u.thread_first, delta)};
}

}  // namespace

void KernelLowering::lower_load(const ir::Op& op) {
  if (smem_.pipeline.is_prefetched(op.result())) {
    // Other threads may still read bytes of this buffer (a value whose live range just ended).
    before_smem_write(op.result());
    issue_async_copy(op, [&](const ir::Value* v) { return scalar(v); }, i32(0));
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, {});
    prefetch_in_flight_.push_back(smem_range(op.result()));
    return;
  }
  if (pipelined(op.result())) return;  // copied into shared memory by the loop (issue_async_copy)
  const TensorView& tv = tensors_.at(op.operands[0]);
  BlockAccess acc = make_access(this, b_, tv, op, [&](const ir::Value* v) { return scalar(v); });
  llvm::Type* ety = llvm_type(tv.dtype == DType::i1 ? DType::i1 : tv.dtype);
  llvm::Type* mem_ty = tv.dtype == DType::i1 ? b_.getInt8Ty() : ety;
  auto load_one = [&](const Coords& c) -> llvm::Value* {
    ElementAddr ea = element_addr(b_, acc, c);
    // Masked lanes read the first element instead (tensor pointers are never null: the launcher
    // passes a valid allocation even for empty tensors) and the value is replaced by 0.
    llvm::Value* safe = b_.CreateSelect(ea.in_bounds, ea.offset, b_.getInt64(0));
    llvm::Value* ptr = b_.CreateGEP(mem_ty, tv.ptr, safe);
    llvm::Value* x = b_.CreateLoad(mem_ty, ptr);
    if (tv.dtype == DType::i1) x = b_.CreateICmpNE(x, b_.getInt8(0));
    return b_.CreateSelect(ea.in_bounds, x, llvm::Constant::getNullValue(ety));
  };
  if (op.result()->type.is_scalar()) {
    regs_[op.result()] = {load_one({})};
    return;
  }
  const Layout& l = layout(op.result());
  int n = l.regs_per_thread();
  Regs out(n);
  const int64_t inner_dim = acc.dims.back();
  const bool can_vectorize = l.kind == Layout::Kind::Blocked && l.vec > 1 && tv.dtype != DType::i1;
  if (!can_vectorize) {
    for (int r = 0; r < n; ++r) out[r] = load_one(coords_of(l, r));
    regs_[op.result()] = std::move(out);
    return;
  }
  // Runs of `vec` elements along the tile's last axis, taken in groups of kMaxBytesPerBranch per thread.
  // One branch per group: when each of its runs is contiguous (unit stride), aligned, and wholly inside
  // or wholly outside the tensor, each run is one vector load (an outside run reads the first element
  // and yields zeros); otherwise every element is loaded alone (edges that cut a run, odd strides).
  // A branch per run, as this was before, kept ptxas from issuing the loads back to back: each was
  // waited for before the next (delta_rule_bwd_chunk's hottest instructions in ncu). Grouping, not the
  // whole tile at once: ptxas then hoists every load of a large tile and spills (poly_recurrent, at 255
  // registers); 32 bytes spill nowhere in the library. On an H200 (B8 T4096 H16 D128 bf16):
  // delta_rule_bwd_chunk 1.48 -> 1.42 ms, gla_bwd_intra 1.98 -> 1.88, gla 1.42 -> 1.40.
  struct Run {
    ElementAddr first, last;
  };
  const int runs_per_thread = n / l.vec;
  const int group = std::max(1, kMaxBytesPerBranch / (l.vec * dtype_bytes(tv.dtype)));
  for (int g0 = 0; g0 < runs_per_thread; g0 += group) {
    const int g1 = std::min(runs_per_thread, g0 + group);
    std::vector<Run> runs;
    llvm::Value* fast = b_.CreateICmpEQ(tv.strides[inner_dim], b_.getInt64(1));
    for (int i = g0; i < g1; ++i) {
      const int r = i * l.vec;
      Coords first = coords_of(l, r), last = coords_of(l, r + l.vec - 1);
      Run run{element_addr(b_, acc, first), element_addr(b_, acc, last)};
      // The run's first index along the tensor's inner dim: from 0 up, a run whose first element is
      // outside is outside whole (its other indices are those of its first element).
      llvm::Value* inner_first = tensor_index(b_, acc, first, inner_dim);
      llvm::Value* aligned = b_.CreateICmpEQ(b_.CreateAnd(run.first.offset, b_.getInt64(l.vec - 1)), b_.getInt64(0));
      llvm::Value* whole = b_.CreateOr(b_.CreateNot(run.first.in_bounds), run.last.in_bounds);
      llvm::Value* from_zero = b_.CreateICmpSGE(inner_first, b_.getInt32(0));
      fast = b_.CreateAnd(fast, b_.CreateAnd(aligned, b_.CreateAnd(whole, from_zero)));
      runs.push_back(run);
    }
    llvm::BasicBlock* fast_bb = llvm::BasicBlock::Create(ctx_, "ld.vec", fn_);
    llvm::BasicBlock* slow_bb = llvm::BasicBlock::Create(ctx_, "ld.scalar", fn_);
    llvm::BasicBlock* join = llvm::BasicBlock::Create(ctx_, "ld.join", fn_);
    b_.CreateCondBr(fast, fast_bb, slow_bb);
    b_.SetInsertPoint(fast_bb);
    auto* vty = llvm::FixedVectorType::get(ety, l.vec);
    const int first_reg = g0 * l.vec, regs = (g1 - g0) * l.vec;
    Regs fast_vals(regs);
    for (size_t i = 0; i < runs.size(); ++i) {
      llvm::Value* in = runs[i].first.in_bounds;
      llvm::Value* safe = b_.CreateSelect(in, runs[i].first.offset, b_.getInt64(0));
      llvm::Value* vec = b_.CreateAlignedLoad(vty, b_.CreateGEP(ety, tv.ptr, safe), llvm::Align(dtype_bytes(tv.dtype) * l.vec));
      for (int j = 0; j < l.vec; ++j)
        fast_vals[i * l.vec + j] = b_.CreateSelect(in, b_.CreateExtractElement(vec, j), llvm::Constant::getNullValue(ety));
    }
    llvm::BasicBlock* fast_end = b_.GetInsertBlock();
    b_.CreateBr(join);
    b_.SetInsertPoint(slow_bb);
    Regs slow_vals(regs);
    for (int r = 0; r < regs; ++r) slow_vals[r] = load_one(coords_of(l, first_reg + r));
    llvm::BasicBlock* slow_end = b_.GetInsertBlock();
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
    for (int r = 0; r < regs; ++r) {
      auto* phi = b_.CreatePHI(ety, 2);
      phi->addIncoming(fast_vals[r], fast_end);
      phi->addIncoming(slow_vals[r], slow_end);
      out[first_reg + r] = phi;
    }
  }
  regs_[op.result()] = std::move(out);
}

void KernelLowering::lower_store(const ir::Op& op) {
  // A tensor the kernel also reads (state kept in global memory, updated in place): other threads of
  // the program may read the elements this store overwrites, before (WAR) or after (RAW) it, so the
  // store is fenced by barriers on both sides (bar.sync orders global memory within the program).
  struct Fence {
    KernelLowering* self;
    bool on;
    Fence(KernelLowering* s, bool o) : self(s), on(o) { if (on) self->barrier(); }
    ~Fence() { if (on) self->barrier(); }
  } fence(this, read_write_tensors_.count(op.operands[0]) > 0);
  const TensorView& tv = tensors_.at(op.operands[0]);
  BlockAccess acc = make_access(this, b_, tv, op, [&](const ir::Value* v) { return scalar(v); });
  const ir::Value* val = op.operands.back();
  llvm::Type* mem_ty = tv.dtype == DType::i1 ? b_.getInt8Ty() : llvm_type(tv.dtype);
  auto store_one = [&](llvm::Value* x, const Coords& c, llvm::Value* owner) {
    ElementAddr ea = element_addr(b_, acc, c);
    llvm::Value* pred = owner ? b_.CreateAnd(ea.in_bounds, owner) : ea.in_bounds;
    llvm::BasicBlock* st = llvm::BasicBlock::Create(ctx_, "st", fn_);
    llvm::BasicBlock* cont = llvm::BasicBlock::Create(ctx_, "st.cont", fn_);
    b_.CreateCondBr(pred, st, cont);
    b_.SetInsertPoint(st);
    if (tv.dtype == DType::i1) x = b_.CreateZExt(x, b_.getInt8Ty());
    b_.CreateStore(x, b_.CreateGEP(mem_ty, tv.ptr, ea.offset));
    b_.CreateBr(cont);
    b_.SetInsertPoint(cont);
  };
  if (val->type.is_scalar()) {
    store_one(scalar(val), {}, b_.CreateICmpEQ(tid_, i32(0)));
    return;
  }
  Layout l = passes::store_layout(val, layout(val), cls(val) == ValueClass::Data, k_.num_warps);
  Regs rs = get_in_layout(val, l);
  const bool replicated = l.kind == Layout::Kind::Mma ? l.wm * l.wn < k_.num_warps
                                                      : int64_t{l.num_threads} * l.vec > l.numel();
  const int64_t inner_dim = acc.dims.back();
  const bool can_vectorize = l.kind == Layout::Kind::Blocked && l.vec > 1 && tv.dtype != DType::i1;
  for (int r = 0; r < l.regs_per_thread(); r += can_vectorize ? l.vec : 1) {
    llvm::Value* owner = replicated ? is_owner(l, r) : nullptr;
    if (!can_vectorize) {
      store_one(rs[r], coords_of(l, r), owner);
      continue;
    }
    Coords first = coords_of(l, r), last = coords_of(l, r + l.vec - 1);
    ElementAddr a0 = element_addr(b_, acc, first), a1 = element_addr(b_, acc, last);
    llvm::Value* contiguous = b_.CreateICmpEQ(tv.strides[inner_dim], b_.getInt64(1));
    llvm::Value* aligned = b_.CreateICmpEQ(b_.CreateAnd(a0.offset, b_.getInt64(l.vec - 1)), b_.getInt64(0));
    llvm::Value* fast = b_.CreateAnd(b_.CreateAnd(a0.in_bounds, a1.in_bounds), b_.CreateAnd(contiguous, aligned));
    if (owner) fast = b_.CreateAnd(fast, owner);
    llvm::BasicBlock* fast_bb = llvm::BasicBlock::Create(ctx_, "st.vec", fn_);
    llvm::BasicBlock* slow_bb = llvm::BasicBlock::Create(ctx_, "st.scalar", fn_);
    llvm::BasicBlock* join = llvm::BasicBlock::Create(ctx_, "st.join", fn_);
    b_.CreateCondBr(fast, fast_bb, slow_bb);
    b_.SetInsertPoint(fast_bb);
    llvm::Value* vec = llvm::PoisonValue::get(llvm::FixedVectorType::get(mem_ty, l.vec));
    for (int j = 0; j < l.vec; ++j) vec = b_.CreateInsertElement(vec, rs[r + j], j);
    b_.CreateAlignedStore(vec, b_.CreateGEP(mem_ty, tv.ptr, a0.offset), llvm::Align(dtype_bytes(tv.dtype) * l.vec));
    b_.CreateBr(join);
    b_.SetInsertPoint(slow_bb);
    for (int j = 0; j < l.vec; ++j) store_one(rs[r + j], coords_of(l, r + j), owner);
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
  }
}

llvm::Value* KernelLowering::scalar_at_iteration(const ir::Value* v, const ir::Block& body, llvm::Value* iv) {
  if (v == body.args[0]) return iv;
  bool inside = false;
  for (const ir::Block* blk = v->def ? v->def->parent : v->owner; blk; blk = blk->parent ? blk->parent->parent : nullptr)
    inside |= blk == &body;
  if (!inside) return scalar(v);  // loop-invariant: already lowered before the loop
  const ir::Op& op = *v->def;
  switch (op.code) {
    case OpCode::Constant: return eval_at(v, {});
    case OpCode::Dim: return tensors_.at(op.operands[0]).dims.at(op.attrs.axis);
    case OpCode::ProgramId:
    case OpCode::NumPrograms: {
      static constexpr llvm::Intrinsic::ID ids[2][3] = {
          {llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y,
           llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z},
          {llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x, llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_y,
           llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_z}};
      return b_.CreateIntrinsic(ids[op.code == OpCode::NumPrograms][op.attrs.axis], {});
    }
    default: {
      std::vector<llvm::Value*> args;
      for (const ir::Value* o : op.operands) args.push_back(scalar_at_iteration(o, body, iv));
      return element_op(op, args);
    }
  }
}

KernelLowering::AccessBounds KernelLowering::access_bounds(const ir::Op& op,
                                                          const std::function<llvm::Value*(const ir::Value*)>& scalar_of) {
  BlockAccess a = make_access(this, b_, tensors_.at(op.operands[0]), op, scalar_of);
  return {std::move(a.offsets), std::move(a.bounds)};
}

KernelLowering::TensorElement KernelLowering::tensor_element(const ir::Op& op, const AccessBounds& at, const Coords& c) {
  const BlockAccess a{&tensors_.at(op.operands[0]), at.offsets, at.bounds, op.attrs.dims};
  const ElementAddr e = element_addr(b_, a, c);
  return {e.in_bounds, e.offset};
}

void KernelLowering::issue_async_copy(const ir::Op& op, const std::function<llvm::Value*(const ir::Value*)>& scalar_of,
                                      llvm::Value* stage_off) {
  const TensorView& tv = tensors_.at(op.operands[0]);
  BlockAccess acc = make_access(this, b_, tv, op, scalar_of);
  const ir::Value* res = op.result();
  const int elem = dtype_bytes(tv.dtype);
  Layout l = Layout::blocked(res->type.shape, k_.num_warps * 32, elem);
  LINAC_INTERNAL_CHECK(l.vec * elem == 16, "asynchronous load without 16-byte vectors");
  llvm::Type* ety = llvm_type(tv.dtype);
  const int64_t inner_dim = acc.dims.back();
  // Where one check per access (uniform_runs) finds every run contiguous, aligned and whole or none,
  // each run is one cp.async of 16 bytes or none (0 bytes read, zeros written); otherwise, and in
  // loops (in_loop), each run is checked as below.
  llvm::BasicBlock* done = nullptr;
  if (const std::optional<UniformRuns> u = in_loop(op) ? std::nullopt : uniform_runs(b_, acc, l, coords_of(l, 0))) {
    llvm::BasicBlock* uniform_bb = llvm::BasicBlock::Create(ctx_, "cp.uniform", fn_);
    llvm::BasicBlock* general_bb = llvm::BasicBlock::Create(ctx_, "cp.general", fn_);
    done = llvm::BasicBlock::Create(ctx_, "cp.done");  // placed after the general path
    b_.CreateCondBr(u->holds, uniform_bb, general_bb);
    b_.SetInsertPoint(uniform_bb);
    for (int r = 0; r < l.regs_per_thread(); r += l.vec) {
      Coords first = coords_of(l, r);
      // A run outside reads 0 bytes, from the tensor's first element (tensor pointers are never null).
      const RunAt run = run_at(b_, acc, *u, first);
      b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_cg_shared_global_16_s, {},
                         {b_.CreateGEP(b_.getInt8Ty(), smem_addr(res, first), stage_off),
                          b_.CreateSelect(run.in_bounds, run.at, tv.ptr), b_.CreateSelect(run.in_bounds, i32(16), i32(0))});
    }
    b_.CreateBr(done);
    b_.SetInsertPoint(general_bb);
  }
  llvm::Value* contiguous = b_.CreateICmpEQ(tv.strides[inner_dim], b_.getInt64(1));
  for (int r = 0; r < l.regs_per_thread(); r += l.vec) {
    Coords first = coords_of(l, r);
    ElementAddr a0 = element_addr(b_, acc, first);
    // Elements of the run that are in bounds form a prefix (the run walks the innermost dim up to its
    // bound); cp.async reads that many bytes and zero-fills the rest of the 16.
    llvm::Value* room = b_.CreateSub(acc.bounds[inner_dim], tensor_index(b_, acc, first, inner_dim));
    llvm::Value* n_valid = b_.CreateSelect(a0.in_bounds, b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, room, i32(l.vec)), i32(0));
    llvm::Value* aligned = b_.CreateICmpEQ(b_.CreateAnd(a0.offset, b_.getInt64(l.vec - 1)), b_.getInt64(0));
    llvm::Value* dst = smem_addr(res, first);
    dst = b_.CreateGEP(b_.getInt8Ty(), dst, stage_off);
    llvm::BasicBlock* fast_bb = llvm::BasicBlock::Create(ctx_, "cp.async", fn_);
    llvm::BasicBlock* slow_bb = llvm::BasicBlock::Create(ctx_, "cp.sync", fn_);
    llvm::BasicBlock* join = llvm::BasicBlock::Create(ctx_, "cp.join", fn_);
    // A run that the tensor's end cuts (0 < n_valid < vec: a head dim of 1, a ragged last row) goes
    // element by element too: cp.async with a smaller src-size still issues a 16-byte read, which
    // compute-sanitizer reports past the end of an allocation (linear_attn's normalized backward reads
    // its [B, T, H, 1] `ones` this way).
    llvm::Value* whole_or_none = b_.CreateOr(b_.CreateICmpEQ(n_valid, i32(l.vec)), b_.CreateICmpEQ(n_valid, i32(0)));
    b_.CreateCondBr(b_.CreateAnd(b_.CreateAnd(contiguous, aligned), whole_or_none), fast_bb, slow_bb);
    b_.SetInsertPoint(fast_bb);
    llvm::Value* src = b_.CreateGEP(ety, tv.ptr, b_.CreateSelect(a0.in_bounds, a0.offset, b_.getInt64(0)));
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_cg_shared_global_16_s, {},
                       {dst, src, b_.CreateMul(n_valid, i32(elem))});
    b_.CreateBr(join);
    // Unaligned, strided or cut runs: element by element, synchronously (the wait's barrier orders them).
    b_.SetInsertPoint(slow_bb);
    for (int j = 0; j < l.vec; ++j) {
      Coords c = coords_of(l, r + j);
      ElementAddr a = element_addr(b_, acc, c);
      llvm::Value* x = b_.CreateLoad(ety, b_.CreateGEP(ety, tv.ptr, b_.CreateSelect(a.in_bounds, a.offset, b_.getInt64(0))));
      x = b_.CreateSelect(a.in_bounds, x, llvm::Constant::getNullValue(ety));
      b_.CreateStore(x, b_.CreateGEP(b_.getInt8Ty(), smem_addr(res, c), stage_off));
    }
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
  }
  if (done) {
    b_.CreateBr(done);
    done->insertInto(fn_);
    b_.SetInsertPoint(done);
  }
}

llvm::Value* KernelLowering::smem_addr(const ir::Value* v, const Coords& c) {
  auto it = smem_.buffers.find(v);
  LINAC_INTERNAL_CHECK(it != smem_.buffers.end(), "tile read at foreign coordinates was not planned into shared memory");
  const passes::SmemBuffer& buf = it->second;
  llvm::Type* ety = buf.dtype == DType::i1 ? b_.getInt8Ty() : llvm_type(buf.dtype);
  llvm::Value* base = b_.CreateConstGEP1_64(b_.getInt8Ty(), smem_ptr_, buf.offset);
  if (auto st = stage_base_.find(v); st != stage_base_.end()) base = b_.CreateGEP(b_.getInt8Ty(), base, st->second);
  if (buf.swizzle_bytes) {
    // Blocks of W-byte columns, rows of W bytes in each, 16-byte units permuted (smem_plan.h).
    const int64_t W = buf.swizzle_bytes, elem = dtype_bytes(buf.dtype), block_cols = W / elem;
    const int64_t block_bytes = v->type.shape[0] * W;
    llvm::Value* o = b_.CreateAdd(b_.CreateMul(b_.CreateUDiv(c[1], i32(block_cols)), i32(block_bytes)),
                                  b_.CreateAdd(b_.CreateMul(c[0], i32(W)), b_.CreateMul(b_.CreateURem(c[1], i32(block_cols)), i32(elem))));
    llvm::Value* unit = b_.CreateAnd(b_.CreateLShr(o, i32(7)), i32(W / 16 - 1));
    o = b_.CreateXor(o, b_.CreateShl(unit, i32(4)));
    return b_.CreateGEP(b_.getInt8Ty(), base, o);
  }
  llvm::Value* idx = c.size() == 2 ? b_.CreateAdd(b_.CreateMul(c[0], i32(buf.row_stride)), c[1]) : c.at(0);
  return b_.CreateGEP(ety, base, idx);
}

// The swizzle permutes whole 16-byte units, so a run of at most 16 bytes at a multiple of its size stays
// contiguous; LLVM cannot see through the permutation to merge such accesses into vectors (it does in
// padded buffers, whose addresses differ by constants), so they are emitted as vectors here.
int KernelLowering::swizzled_run(const ir::Value* v, const Layout& l) {
  auto it = smem_.buffers.find(v);
  if (it == smem_.buffers.end() || !it->second.swizzle_bytes || v->type.dtype == DType::i1) return 1;
  int run = passes::row_run(l);
  while (run > 1 && run * dtype_bytes(v->type.dtype) > 16) run /= 2;
  return run;
}

// Registers r .. r + run - 1 (r a multiple of run) are one vector of `run` elements at the address of
// register r, aligned to its size.
Regs KernelLowering::read_runs(const ir::Value* v, const Layout& l, int run) {
  before_smem_read(v);
  auto* vty = llvm::FixedVectorType::get(llvm_type(v->type.dtype), run);
  Regs out(l.regs_per_thread());
  for (int r = 0; r < l.regs_per_thread(); r += run) {
    llvm::Value* x = b_.CreateAlignedLoad(vty, smem_addr(v, coords_of(l, r)), llvm::Align(run * dtype_bytes(v->type.dtype)));
    for (int j = 0; j < run; ++j) out[r + j] = b_.CreateExtractElement(x, uint64_t(j));
  }
  return out;
}

void KernelLowering::write_runs(const ir::Value* v, const Layout& l, int run, const Regs& rs) {
  auto* vty = llvm::FixedVectorType::get(llvm_type(v->type.dtype), run);
  for (int r = 0; r < l.regs_per_thread(); r += run) {
    llvm::Value* x = llvm::PoisonValue::get(vty);
    for (int j = 0; j < run; ++j) x = b_.CreateInsertElement(x, rs[r + j], uint64_t(j));
    b_.CreateAlignedStore(x, smem_addr(v, coords_of(l, r)), llvm::Align(run * dtype_bytes(v->type.dtype)));
  }
}

// ldmatrix.trans hands each lane, of four 8 x 8 blocks, the transposed block's row lane / 4 at columns
// 2 (lane % 4) and the next: the mma layout's pairs (as a dot's B operand takes them), where element by
// element each took a 2-byte load (and, from a swizzled buffer, its address arithmetic). The blocks are
// a warp's two neighbouring 16 x 8 tiles of the transpose, rows 0-7 and 8-15 of each (its registers
// r .. r + 7, r a multiple of 8); each lane gives the address of one stored row of 8 elements, which
// starts at a 16-byte boundary in a swizzled buffer and in padded rows of a multiple of 16 bytes.
bool KernelLowering::ldmatrix_reads_transpose(const ir::Value* v, const Layout& l) {
  if (l.kind != Layout::Kind::Mma || !v->def || v->def->code != OpCode::Transpose || v->type.rank() != 2) return false;
  const ir::Value* src = v->def->operands[0];
  const DType t = src->type.dtype;
  if ((t != DType::bf16 && t != DType::f16) || cls(src) != ValueClass::Data || !smem_.buffers.count(src)) return false;
  const passes::SmemBuffer& buf = smem_.buffers.at(src);
  return (l.shape[1] / l.wn / 8) % 2 == 0 && (buf.swizzle_bytes || buf.row_stride * dtype_bytes(t) % 16 == 0);
}

std::optional<Regs> KernelLowering::transpose_by_ldmatrix(const ir::Value* v, const Layout& l) {
  if (!ldmatrix_reads_transpose(v, l)) return std::nullopt;
  const ir::Value* src = v->def->operands[0];
  const DType t = src->type.dtype;
  before_smem_read(src);
  llvm::Value* lane = b_.CreateURem(tid_, i32(32));
  llvm::Value* block = b_.CreateUDiv(lane, i32(8));  // which of the four blocks this lane addresses a row of
  const MmaWarp w = mma_warp(l);
  // Block j holds rows (j % 2) * 8 and columns (j / 2) * 8 on of the transpose: stored rows of the source.
  llvm::Value* stored_row = b_.CreateAdd(
      w.col0, b_.CreateAdd(b_.CreateURem(lane, i32(8)), b_.CreateMul(b_.CreateUDiv(block, i32(2)), i32(8))));
  llvm::Value* stored_col = b_.CreateAdd(w.row0, b_.CreateMul(b_.CreateURem(block, i32(2)), i32(8)));
  auto* pair = llvm::FixedVectorType::get(llvm_type(t), 2);
  Regs out(l.regs_per_thread());
  for (int r = 0; r < l.regs_per_thread(); r += 8) {
    const auto rc = l.register_coords(r);
    llvm::Value* addr = smem_addr(src, {b_.CreateAdd(stored_row, i32(rc[1])), b_.CreateAdd(stored_col, i32(rc[0]))});
    llvm::Value* blocks =
        b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_trans_b16, {addr->getType()}, {addr});
    for (int q = 0; q < 4; ++q) {
      llvm::Value* p = b_.CreateBitCast(b_.CreateExtractValue(blocks, q), pair);
      out[r + 2 * q] = b_.CreateExtractElement(p, uint64_t{0});
      out[r + 2 * q + 1] = b_.CreateExtractElement(p, uint64_t{1});
    }
  }
  return out;
}

bool KernelLowering::reads_transpose_by_ldmatrix(const ir::Value* v, const Layout& l) {
  if (!v->def || !ir::is_elementwise(v->def->code) || v->type.is_scalar()) return false;
  for (const ir::Value* o : v->def->operands) {
    if (o->type.is_scalar() || o->type.shape != v->type.shape) continue;
    if (ldmatrix_reads_transpose(o, l) || (cls(o) == ValueClass::Remat && reads_transpose_by_ldmatrix(o, l)))
      return true;
  }
  return false;
}

void KernelLowering::spill(const ir::Value* v) {
  Layout l = cls(v) == ValueClass::Data
                 ? layout(v)
                 : Layout::blocked(v->type.shape, k_.num_warps * 32, dtype_bytes(v->type.dtype));
  Regs rs = get_in_layout(v, l);
  const bool replicated = l.kind == Layout::Kind::Mma ? l.wm * l.wn < k_.num_warps
                                                      : int64_t{l.num_threads} * l.vec > l.numel();
  // The buffer may still be read by other threads (a previous iteration, or a value whose live range
  // ended just before): wait for them if needed; readers wait for the writes (before_smem_read).
  before_smem_write(v);
  if (const int run = replicated ? 1 : swizzled_run(v, l); run > 1) return write_runs(v, l, run, rs);
  for (int r = 0; r < l.regs_per_thread(); ++r) {
    llvm::Value* x = rs[r];
    if (v->type.dtype == DType::i1) x = b_.CreateZExt(x, b_.getInt8Ty());
    llvm::Value* addr = smem_addr(v, coords_of(l, r));
    if (!replicated) {
      b_.CreateStore(x, addr);
      continue;
    }
    llvm::BasicBlock* st = llvm::BasicBlock::Create(ctx_, "spill", fn_);
    llvm::BasicBlock* cont = llvm::BasicBlock::Create(ctx_, "spill.cont", fn_);
    b_.CreateCondBr(is_owner(l, r), st, cont);
    b_.SetInsertPoint(st);
    b_.CreateStore(x, addr);
    b_.CreateBr(cont);
    b_.SetInsertPoint(cont);
  }
}

llvm::Value* KernelLowering::smem_read(const ir::Value* v, const Coords& c) {
  before_smem_read(v);
  llvm::Type* ety = v->type.dtype == DType::i1 ? b_.getInt8Ty() : llvm_type(v->type.dtype);
  llvm::Value* x = b_.CreateLoad(ety, smem_addr(v, c));
  if (v->type.dtype == DType::i1) x = b_.CreateICmpNE(x, b_.getInt8(0));
  return x;
}

}  // namespace linac::nvptx
