// The TMA copies of a chunk loop's ring (sm_90a; compiler/passes/pipeline.h, TmaLoad): the stages'
// mbarriers, one thread arming a stage with its bytes and issuing cp.async.bulk.tensor per box, every
// thread waiting on the stage's phase; and, per tile and iteration, the synchronous copy where a box
// would cross a limit that is not the tensor's end or the launcher could not encode the map. Inline PTX
// throughout (the instructions as the PTX ISA spells them, which tests/ptx/tma_probe.ptx pins and
// tools/tma_probe.py ran on an H200); each statement clobbers memory, so that no shared-memory access
// moves across it.
#include <fmt/format.h>
#include <llvm/IR/InlineAsm.h>

#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

namespace {

llvm::InlineAsm* asm_of(llvm::Type* ret, std::vector<llvm::Type*> args, const std::string& text,
                        const std::string& constraints) {
  return llvm::InlineAsm::get(llvm::FunctionType::get(ret, args, false), text, constraints, /*hasSideEffects=*/true);
}

/// The 32-bit shared-memory address of `p` (a pointer into the dynamic shared memory), as PTX's
/// shared-space operands take it.
llvm::Value* shared_u32(llvm::IRBuilder<>& b, llvm::Value* p) {
  return b.CreateTrunc(b.CreatePtrToInt(p, b.getInt64Ty()), b.getInt32Ty());
}

}  // namespace

void KernelLowering::init_ring_barriers(const LoopPipeline& p) {
  auto* init = llvm::BasicBlock::Create(ctx_, "tma.init", fn_);
  auto* done = llvm::BasicBlock::Create(ctx_, "tma.init.done", fn_);
  b_.CreateCondBr(b_.CreateICmpEQ(thread_id(), i32(0)), init, done);
  b_.SetInsertPoint(init);
  llvm::Type* i32t = b_.getInt32Ty();
  // One arrival each: thread 0's (a producer's with producer warps) with the stage's bytes on a full
  // barrier; thread 0's, once every computing thread is past the ring's barrier, on an empty one.
  for (int s = 0; s < smem_.pipeline.stages; ++s) {
    b_.CreateCall(asm_of(b_.getVoidTy(), {i32t}, "mbarrier.init.shared::cta.b64 [$0], 1;", "r,~{memory}"),
                  {ring_barrier(p, i32(s))});
    if (producer_loop_)
      b_.CreateCall(asm_of(b_.getVoidTy(), {i32t}, "mbarrier.init.shared::cta.b64 [$0], 1;", "r,~{memory}"),
                    {empty_barrier(p, i32(s))});
  }
  // The initialisation visible to the async proxy (the copies complete on these barriers).
  b_.CreateCall(asm_of(b_.getVoidTy(), {}, "fence.mbarrier_init.release.cluster;", "~{memory}"), {});
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
}

void KernelLowering::issue_tma_copies(const LoopPipeline& p, const ir::Block& body, llvm::Value* at,
                                      llvm::Value* stage) {
  const TmaCopies c = tma_copies(p, body, at);
  warp_sync();
  arm_and_issue(p, c, stage, b_.CreateICmpEQ(thread_id(), i32(0)));
  // Every thread: the tiles TMA does not copy, synchronously (visible behind the ring's next barrier).
  copy_fallbacks(p, c, stage, thread_id(), k_.num_warps * 32, /*rolled=*/false);
}

KernelLowering::TmaCopies KernelLowering::tma_copies(const LoopPipeline& p, const ir::Block& body, llvm::Value* at) {
  auto scalar_of = [&](const ir::Value* v) { return scalar_at_iteration(v, body, at); };
  // Per load: whether TMA copies it this time (uniform over the block: scalars and parameters only).
  TmaCopies c;
  std::vector<llvm::Value*>& by_tma = c.by_tma;
  std::vector<AccessBounds>& where = c.where;
  llvm::Value*& tx = c.tx;
  tx = i32(0);
  for (const ir::Op* load : p.tma_loads) {
    const passes::TmaLoad& t = smem_.pipeline.tma.at(load);
    const TensorView& tv = tensors_.at(load->operands[0]);
    const std::vector<int64_t>& box = smem_.pipeline.tensor_maps.at(t.map).box;
    AccessBounds a = access_bounds(*load, scalar_of);
    // The map zero-fills past the tensor's end only: a dim whose bound is short of it (a sequence's end
    // inside a packed batch, a limit the program gives) must not cut the tile.
    llvm::Value* ok = b_.CreateICmpNE(tensor_map_ok_.at(t.map), i32(0));
    const int64_t extent_along[2] = {load->result()->type.shape[0], load->result()->type.shape[1]};
    const size_t rank = a.bounds.size();
    for (size_t d = 0; d < rank; ++d) {
      // A limit that is the tensor's own size along d cuts nothing (most of them: the test costs
      // registers through the loop, and gla_bwd_dg spilled).
      const ir::Value* limit = load->operands[1 + rank + d];
      if (limit->def && limit->def->code == ir::OpCode::Dim && limit->def->operands[0] == load->operands[0] &&
          limit->def->attrs.axis == static_cast<int64_t>(d))
        continue;
      int64_t extent = box[d];
      for (size_t ax = 0; ax < load->attrs.dims.size(); ++ax)
        if (load->attrs.dims[ax] == static_cast<int64_t>(d)) extent = extent_along[ax];
      llvm::Value* whole_dim = b_.CreateICmpEQ(a.bounds[d], tv.dims[d]);
      llvm::Value* inside = b_.CreateICmpSLE(b_.CreateAdd(a.offsets[d], i32(extent)), a.bounds[d]);
      ok = b_.CreateAnd(ok, b_.CreateOr(whole_dim, inside));
    }
    by_tma.push_back(ok);
    where.push_back(std::move(a));
    tx = b_.CreateAdd(tx, b_.CreateSelect(ok, i32(t.bytes), i32(0)));
  }
  return c;
}

void KernelLowering::arm_and_issue(const LoopPipeline& p, const TmaCopies& c, llvm::Value* stage, llvm::Value* issuer) {
  const std::vector<llvm::Value*>& by_tma = c.by_tma;
  const std::vector<AccessBounds>& where = c.where;
  llvm::Type* i32t = b_.getInt32Ty();
  // The issuer: arm the stage's barrier with the bytes of the tiles TMA copies (0: a plain arrival), then
  // issue their boxes, each completing on that barrier.
  llvm::Value* bar = ring_barrier(p, stage);
  auto* issue = llvm::BasicBlock::Create(ctx_, "tma.issue", fn_);
  auto* issued = llvm::BasicBlock::Create(ctx_, "tma.issued", fn_);
  b_.CreateCondBr(issuer, issue, issued);
  b_.SetInsertPoint(issue);
  b_.CreateCall(asm_of(b_.getVoidTy(), {i32t, i32t},
                       "{ .reg .b64 state; mbarrier.arrive.expect_tx.shared::cta.b64 state, [$0], $1; }", "r,r,~{memory}"),
                {bar, c.tx});
  for (size_t i = 0; i < p.tma_loads.size(); ++i) {
    const ir::Op* load = p.tma_loads[i];
    const passes::TmaLoad& t = smem_.pipeline.tma.at(load);
    const int rank = static_cast<int>(where[i].offsets.size());
    auto* copy = llvm::BasicBlock::Create(ctx_, "tma.copy", fn_);
    auto* next = llvm::BasicBlock::Create(ctx_, "tma.copy.done", fn_);
    b_.CreateCondBr(by_tma[i], copy, next);
    b_.SetInsertPoint(copy);
    const passes::SmemBuffer& buf = smem_.buffers.at(load->result());
    llvm::Value* dst0 = b_.CreateGEP(b_.getInt8Ty(), b_.CreateConstGEP1_64(b_.getInt8Ty(), smem_ptr_, buf.offset),
                                     b_.CreateMul(stage, i32(buf.stage_bytes)));
    // Coordinates innermost first: {dim rank-1, ..., dim 0}, operands $3 ...
    std::string coords;
    for (int j = 0; j < rank; ++j) coords += fmt::format("{}${}", j ? ", " : "", 3 + j);
    const std::string text = fmt::format(
        "cp.async.bulk.tensor.{}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$0], [$1, {{{}}}], [$2];",
        rank, coords);
    std::vector<llvm::Type*> types = {i32t, llvm::PointerType::get(ctx_, 0), i32t};
    std::string constraints = "r,l,r";
    for (int j = 0; j < rank; ++j) {
      types.push_back(i32t);
      constraints += ",r";
    }
    constraints += ",~{memory}";
    // Box b covers the columns [b * box_cols, (b + 1) * box_cols) of the tile: block b of its buffer.
    const int64_t block_bytes = load->result()->type.shape[0] * t.box_cols * dtype_bytes(buf.dtype);
    for (int bx = 0; bx < t.boxes; ++bx) {
      std::vector<llvm::Value*> args = {shared_u32(b_, b_.CreateConstGEP1_64(b_.getInt8Ty(), dst0, bx * block_bytes)),
                                        tensor_maps_.at(t.map), bar};
      for (int j = 0; j < rank; ++j) {
        llvm::Value* c = where[i].offsets[rank - 1 - j];
        if (j == 0 && bx > 0) c = b_.CreateAdd(c, i32(bx * t.box_cols));
        args.push_back(c);
      }
      b_.CreateCall(asm_of(b_.getVoidTy(), types, text, constraints), args);
    }
    b_.CreateBr(next);
    b_.SetInsertPoint(next);
  }
  b_.CreateBr(issued);
  b_.SetInsertPoint(issued);
}

void KernelLowering::copy_fallbacks(const LoopPipeline& p, const TmaCopies& c, llvm::Value* stage, llvm::Value* first,
                                    int threads, bool rolled) {
  for (size_t i = 0; i < p.tma_loads.size(); ++i) {
    auto* copy = llvm::BasicBlock::Create(ctx_, "tma.fallback", fn_);
    auto* next = llvm::BasicBlock::Create(ctx_, "tma.fallback.done", fn_);
    b_.CreateCondBr(c.by_tma[i], next, copy);
    b_.SetInsertPoint(copy);
    copy_tile_by_threads(*p.tma_loads[i], c.where[i], stage, first, threads, rolled);
    b_.CreateBr(next);
    b_.SetInsertPoint(next);
  }
}

void KernelLowering::copy_tile_by_threads(const ir::Op& load, const AccessBounds& at, llvm::Value* stage,
                                          llvm::Value* first, int threads, bool rolled) {
  // A loop over the tile's elements, thread t taking t, t + threads, ...: a rare path, kept small. (The
  // copy unrolled per element, as cp.async's fallback is, held enough values through poly_fwd_out's loop
  // to make it spill. In a producer warp of 40 registers LLVM's unrolling of this loop made ptxas spill:
  // rolled there. Rolled everywhere, linear_attn_normalized_fwd spilled 8 bytes instead.)
  const ir::Value* res = load.result();
  const TensorView& tv = tensors_.at(load.operands[0]);
  const int64_t rows = res->type.shape[0], cols = res->type.shape[1];
  llvm::Type* ety = llvm_type(tv.dtype);
  llvm::Value* stage_off = b_.CreateMul(stage, i32(smem_.buffers.at(res).stage_bytes));
  const int64_t per_thread = (rows * cols + threads - 1) / threads;
  emit_counted_loop(i32(0), i32(per_thread), {}, [&](llvm::Value* j, const std::vector<llvm::Value*>&) {
    llvm::Value* e = b_.CreateAdd(first, b_.CreateMul(j, i32(threads)));
    auto* body = llvm::BasicBlock::Create(ctx_, "tma.fallback.element", fn_);
    auto* done = llvm::BasicBlock::Create(ctx_, "tma.fallback.element.done", fn_);
    b_.CreateCondBr(b_.CreateICmpSLT(e, i32(rows * cols)), body, done);
    b_.SetInsertPoint(body);
    const Coords c = {b_.CreateUDiv(e, i32(cols)), b_.CreateURem(e, i32(cols))};
    const TensorElement el = tensor_element(load, at, c);
    llvm::Value* x = b_.CreateLoad(ety, b_.CreateGEP(ety, tv.ptr, b_.CreateSelect(el.in_bounds, el.offset, b_.getInt64(0))));
    x = b_.CreateSelect(el.in_bounds, x, llvm::Constant::getNullValue(ety));
    b_.CreateStore(x, b_.CreateGEP(b_.getInt8Ty(), smem_addr(res, c), stage_off));
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
    return std::vector<llvm::Value*>{};
  }, rolled);
}

void KernelLowering::wait_tma_stage(const LoopPipeline& p, llvm::Value* stage, llvm::Value* iter) {
  // Stage s completes once per use; its use by iteration i is its (i / stages)-th since the barriers
  // were initialised, so the phase to wait for has parity (i / stages) & 1.
  wait_barrier_phase(ring_barrier(p, stage), b_.CreateAnd(b_.CreateUDiv(iter, i32(smem_.pipeline.stages)), i32(1)));
}

void KernelLowering::wait_barrier_phase(llvm::Value* bar, llvm::Value* parity) {
  llvm::Type* i32t = b_.getInt32Ty();
  auto* wait = llvm::BasicBlock::Create(ctx_, "tma.wait", fn_);
  auto* landed = llvm::BasicBlock::Create(ctx_, "tma.landed", fn_);
  b_.CreateBr(wait);
  b_.SetInsertPoint(wait);
  // The warp leaves the loop together, once each of its threads saw the phase complete (each needs its
  // own completed wait to see the copies), and reconverges (warp_sync): threads spinning apart made
  // racecheck report the warp's barrier operations as potential hazards (poly_fwd_out and poly_bwd_dq,
  // H200; none with both).
  llvm::Value* done = b_.CreateCall(
      asm_of(i32t, {i32t, i32t},
             "{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [$1], $2; "
             "vote.sync.all.pred done, done, 0xffffffff; selp.u32 $0, 1, 0, done; }",
             "=r,r,r,~{memory}"),
      {bar, parity});
  b_.CreateCondBr(b_.CreateICmpNE(done, i32(0)), landed, wait);
  b_.SetInsertPoint(landed);
  warp_sync();
}

void KernelLowering::warp_sync() {
  // The warp's threads reconverge around the barrier operations (racecheck reports the operations of
  // one warp's threads on a barrier as potential hazards where nothing orders them within the warp).
  b_.CreateCall(asm_of(b_.getVoidTy(), {}, "bar.warp.sync -1;", "~{memory}"), {});
}

llvm::Value* KernelLowering::ring_barrier(const LoopPipeline& p, llvm::Value* stage) {
  return shared_u32(b_, b_.CreateGEP(b_.getInt8Ty(), b_.CreateConstGEP1_64(b_.getInt8Ty(), smem_ptr_, p.barriers),
                                     b_.CreateMul(stage, i32(8))));
}

llvm::Value* KernelLowering::empty_barrier(const LoopPipeline& p, llvm::Value* stage) {
  return shared_u32(b_, b_.CreateGEP(b_.getInt8Ty(),
                                     b_.CreateConstGEP1_64(b_.getInt8Ty(), smem_ptr_, p.barriers + 8 * smem_.pipeline.stages),
                                     b_.CreateMul(stage, i32(8))));
}

void KernelLowering::arrive(llvm::Value* bar) {
  b_.CreateCall(asm_of(b_.getVoidTy(), {b_.getInt32Ty()},
                       "{ .reg .b64 state; mbarrier.arrive.shared::cta.b64 state, [$0]; }", "r,~{memory}"),
                {bar});
}

}  // namespace linac::nvptx
