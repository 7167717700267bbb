// Producer warps filling a chunk loop's TMA ring (passes/warp_roles.h): the warps part at the kernel's
// entry; the producer warpgroup runs the loop's iterations issuing their copies, each stage handed over
// through its full and empty mbarriers; the computing warps release the stages where they used to issue
// the copies (lower_pipeline.cpp) and synchronize over their own threads (emit_block_barrier).
#include <llvm/IR/InlineAsm.h>

#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

namespace {

void set_max_registers(llvm::IRBuilder<>& b, bool increase, int registers) {
  b.CreateIntrinsic(increase ? llvm::Intrinsic::nvvm_setmaxnreg_inc_sync_aligned_u32
                             : llvm::Intrinsic::nvvm_setmaxnreg_dec_sync_aligned_u32,
                    {b.getInt32(registers)});
}

}  // namespace

void KernelLowering::part_warps() {
  const ir::Op& loop = *producer_loop_;
  const LoopPipeline p = loop_pipeline(loop);
  // Every thread: the scalars the copies' coordinates come from (the consumer's lowering of the body
  // evaluates them again where they stand; LLVM merges the two).
  for (const ir::Op* op : smem_.pipeline.producer.prologue) {
    set_location(op->loc);
    lower_op(*op);
  }
  set_location(loop.loc);
  init_ring_barriers(p);
  // Every thread past the initialisation before any waits on or arrives at a barrier.
  b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier_cta_sync_aligned_all, {i32(0)});
  const int consumers = k_.num_warps * 32;
  const passes::RoleRegisters regs = passes::role_registers(k_, smem_.pipeline);
  auto* producer = llvm::BasicBlock::Create(ctx_, "producer", fn_);
  auto* consumer = llvm::BasicBlock::Create(ctx_, "consumer", fn_);
  // The role by warpgroup, made visibly warp-uniform through a shuffle of lane 0's (as CUTLASS does):
  // setmaxnreg is .sync.aligned, every thread of a warp executes it together. (Whether ptxas needs it
  // was not isolated: the spills first blamed on the branch were the linker's, C7504: docs/hopper.md.)
  llvm::Value* group = b_.CreateCall(
      llvm::InlineAsm::get(llvm::FunctionType::get(b_.getInt32Ty(), {b_.getInt32Ty()}, false),
                           "shfl.sync.idx.b32 $0, $1, 0, 31, -1;", "=r,r", /*hasSideEffects=*/false),
      {b_.CreateLShr(thread_id(), i32(7))});
  b_.CreateCondBr(b_.CreateICmpULT(group, i32(consumers / 128)), consumer, producer);

  b_.SetInsertPoint(producer);
  set_max_registers(b_, false, regs.producer);
  // One warp of the warpgroup produces; the others leave (setmaxnreg is the whole warpgroup's), so that
  // no more than one warp spins on the empty barriers beside the computing warps.
  auto* issuing = llvm::BasicBlock::Create(ctx_, "producer.warp", fn_);
  auto* idle = llvm::BasicBlock::Create(ctx_, "producer.idle", fn_);
  b_.CreateCondBr(b_.CreateICmpSLT(thread_id(), i32(consumers + 32)), issuing, idle);
  b_.SetInsertPoint(idle);
  b_.CreateRetVoid();
  b_.SetInsertPoint(issuing);
  produce(p, loop);
  b_.CreateRetVoid();

  b_.SetInsertPoint(consumer);
  if (regs.consumer > regs.launch) set_max_registers(b_, true, regs.consumer);
  consumer_threads_ = consumers;
}

void KernelLowering::produce(const LoopPipeline& p, const ir::Op& loop) {
  const ir::Block& body = *loop.regions[0];
  llvm::Value* lo = scalar(loop.operands[0]);
  llvm::Value* hi = scalar(loop.operands[1]);
  llvm::Value* step = scalar(loop.operands[2]);
  const int stages = smem_.pipeline.stages;
  const int consumers = k_.num_warps * 32;
  llvm::Value* me = b_.CreateSub(thread_id(), i32(consumers));  // lane of the producing warp
  // Iterations lo, lo + step, ... below hi (step > 0, as lower_for runs them).
  llvm::Value* span = b_.CreateSub(hi, lo);
  llvm::Value* n = b_.CreateSelect(b_.CreateICmpSGT(span, i32(0)),
                                   b_.CreateSDiv(b_.CreateAdd(span, b_.CreateSub(step, i32(1))), step), i32(0));
  emit_counted_loop(i32(0), n, {}, [&](llvm::Value* j, const std::vector<llvm::Value*>&) {
    llvm::Value* stage = b_.CreateURem(j, i32(stages));
    // The use of the stage by iteration j is its (j / stages)-th; the computing warps released it once
    // before the loop and once after each earlier use.
    wait_barrier_phase(empty_barrier(p, stage), b_.CreateAnd(b_.CreateUDiv(j, i32(stages)), i32(1)));
    llvm::Value* at = b_.CreateAdd(lo, b_.CreateMul(j, step));
    const TmaCopies c = tma_copies(p, body, at);
    // The tiles TMA cannot copy, by the warp's threads; visible to the async proxy (wgmma reads them)
    // and, through the warp's barrier, ordered before lane 0's arrival on the full barrier, which
    // releases them to the computing warps.
    copy_fallbacks(p, c, stage, me, 32, /*rolled=*/true);
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_fence_proxy_async_shared_cta, {});
    warp_sync();
    arm_and_issue(p, c, stage, b_.CreateICmpEQ(me, i32(0)));
    warp_sync();
    return std::vector<llvm::Value*>{};
  });
}

void KernelLowering::release_all_stages(const LoopPipeline& p) {
  auto* release = llvm::BasicBlock::Create(ctx_, "ring.release", fn_);
  auto* done = llvm::BasicBlock::Create(ctx_, "ring.released", fn_);
  b_.CreateCondBr(b_.CreateICmpEQ(thread_id(), i32(0)), release, done);
  b_.SetInsertPoint(release);
  for (int s = 0; s < smem_.pipeline.stages; ++s) arrive(empty_barrier(p, i32(s)));
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
}

void KernelLowering::release_stage_ahead(const LoopPipeline& p, llvm::Value* iter) {
  // The stage iteration iter + distance copies into was last read by iteration iter + distance - stages
  // (none before the first `stages` iterations: released before the loop), which every computing thread
  // is done with behind the ring's barrier at this head.
  const int stages = smem_.pipeline.stages;
  llvm::Value* ahead = b_.CreateAdd(iter, i32(smem_.pipeline.distance()));
  auto* release = llvm::BasicBlock::Create(ctx_, "ring.release", fn_);
  auto* done = llvm::BasicBlock::Create(ctx_, "ring.released", fn_);
  b_.CreateCondBr(b_.CreateAnd(b_.CreateICmpEQ(thread_id(), i32(0)), b_.CreateICmpSGE(ahead, i32(stages))), release, done);
  b_.SetInsertPoint(release);
  arrive(empty_barrier(p, b_.CreateURem(ahead, i32(stages))));
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
}

}  // namespace linac::nvptx
