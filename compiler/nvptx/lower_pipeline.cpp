// What lower_for emits for a chunk loop's pipeline: the ring of its pipelined loads
// (compiler/passes/pipeline.h: before the loop, at the head of the body, after the loop) and its wgmma
// products waited for an iteration late (compiler/passes/wgmma_waits.h: at the end of the body, after
// the loop, and the accumulators that enter as zeros).
#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

using ir::OpCode;

KernelLowering::LoopPipeline KernelLowering::loop_pipeline(const ir::Op& loop) {
  const ir::Block& body = *loop.regions[0];
  LoopPipeline p;
  for (const auto& inner : body.ops) {
    if (inner->code == OpCode::Load && smem_.pipeline.loads.count(inner.get()))
      (smem_.pipeline.tma.count(inner.get()) ? p.tma_loads : p.loads).push_back(inner.get());
    const auto d = smem_.deferred_waits.find(inner.get());
    if (d == smem_.deferred_waits.end()) continue;
    ++p.deferred_groups;  // one commit group per product
    if (!d->second.zero_start) continue;
    const ir::Value* acc = accumulators_.acc_of_dot.at(inner.get());
    for (size_t i = 0; i < loop.results.size(); ++i)
      if (body.args[i + 1] == acc) p.zero_start_carried.insert(i);
    p.zero_start_dots.push_back(inner.get());
  }
  p.slack = p.ring() && smem_.pipeline.slack();
  if (auto b = smem_.ring_barriers.find(&loop); b != smem_.ring_barriers.end()) p.barriers = b->second;
  ir::walk(const_cast<ir::Block&>(body), [&](ir::Op& inner) { p.async_reads = p.async_reads || smem_.wgmma_dots.count(&inner); });
  return p;
}

void KernelLowering::issue_ring_copies(const LoopPipeline& p, const ir::Block& body, llvm::Value* at,
                                       llvm::Value* stage, llvm::Value* hi) {
  auto issue_all = [&] {
    for (const ir::Op* load : p.loads) {
      llvm::Value* stage_off = b_.CreateMul(stage, i32(smem_.buffers.at(load->result()).stage_bytes));
      issue_async_copy(*load, [&](const ir::Value* v) { return scalar_at_iteration(v, body, at); }, stage_off);
    }
    if (!p.tma_loads.empty()) issue_tma_copies(p, body, at, stage);
  };
  if (!hi) return issue_all();
  auto* copy = llvm::BasicBlock::Create(ctx_, "prefetch", fn_);
  auto* done = llvm::BasicBlock::Create(ctx_, "prefetch.done", fn_);
  b_.CreateCondBr(b_.CreateICmpSLT(at, hi), copy, done);
  b_.SetInsertPoint(copy);
  issue_all();
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
}

void KernelLowering::ring_prologue(const LoopPipeline& p, const ir::Block& body, llvm::Value* lo, llvm::Value* hi,
                                   llvm::Value* step) {
  if (!p.ring()) return;
  // Other threads may still read or write bytes of these buffers (values whose live ranges ended just
  // before the loop: racecheck found poly's backward reading a broadcast tile there while the first
  // iteration's copies landed), as for a prefetched load (lower_load).
  std::vector<ByteRange> stages;
  for (const auto* loads : {&p.loads, &p.tma_loads})
    for (const ir::Op* load : *loads) stages.push_back(smem_range(load->result()));
  // A TMA ring: every thread past the barriers' initialisation before thread 0 arms a stage. Only
  // thread 0 and the copies touch them until the loop's first block barrier, but ptxas if-converts the
  // thread-0 branch into uniform-predicated instructions every warp steps over, and racecheck
  // attributed the initialisation to a thread of another warp, racing thread 0's first arrive (the
  // gated forward at chunks of 128 with a state, docs/ops/linear_attn.md).
  const bool tma = !p.tma_loads.empty();
  if (tma && !producer_loop_) init_ring_barriers(p);  // (with producer warps, before the warps part)
  before_smem_access({}, stages, /*barrier_anyway=*/tma);
  // With producer warps (the kernel's one ring, passes/warp_roles.h) the producer copies; the computing
  // warps, done with the stages' bytes behind that barrier, let it fill every stage.
  if (producer_loop_) return release_all_stages(p);
  // Two stages: the first iteration's copies. A slack stage: the first `distance` iterations', none past
  // the last. A TMA copy is never issued for an iteration that does not run: each one issued is waited
  // for, so none is in flight when the loop is left (or its barriers initialised again).
  const int copies = p.slack ? smem_.pipeline.distance() : 1;
  for (int d = 0; d < copies; ++d) {
    llvm::Value* at = d == 0 ? lo : b_.CreateAdd(lo, b_.CreateMul(step, i32(d)));
    issue_ring_copies(p, body, at, i32(d), p.slack || !p.tma_loads.empty() ? hi : nullptr);
    if (!p.loads.empty()) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, {});
  }
}

void KernelLowering::ring_head(const LoopPipeline& p, const ir::Block& body, llvm::Value* iv, llvm::Value* lo,
                               llvm::Value* hi, llvm::Value* step) {
  if (!p.ring()) return;
  const int stages = smem_.pipeline.stages, distance = smem_.pipeline.distance();
  const bool tma = !p.tma_loads.empty(), cp_async = !p.loads.empty();
  llvm::Value* iter = b_.CreateSDiv(b_.CreateSub(iv, lo), step);
  llvm::Value* cur = b_.CreateURem(iter, i32(stages));
  // A TMA ring's barrier is fenced: a tile that TMA could not copy was stored by the threads (generic
  // proxy), and wgmma (async proxy) may read it; the stage refilled behind it by TMA was read by them.
  if (!p.slack) {
    // Stage (i+1)%2 was last read in iteration i-1: once every thread is past this barrier it can be
    // refilled for iteration i+1. Then wait for this iteration's copies (all but the newest group)
    // and make every thread's copies visible. (Fenced for the async proxy as well, this barrier
    // spared gla's backward no barrier of its products and ran 1% slower: H200, session 17.) TMA's
    // copies are waited for on their stage's barrier, and need no second block barrier.
    if (tma) fenced_barrier();
    else barrier();
    if (producer_loop_) release_stage_ahead(p, iter);
    else issue_ring_copies(p, body, b_.CreateAdd(iv, step), b_.CreateXor(cur, i32(1)), tma ? hi : nullptr);
    if (cp_async) {
      b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, {});
      b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, {i32(1)});
      barrier();
    }
  } else {
    // This iteration's copies (all but the `distance - 1` newest groups), visible to every thread
    // and, where wgmma reads them, to the async proxy; behind the barrier every thread is done with
    // iteration i-2 (its products waited for at the end of iteration i-1), whose stage is refilled
    // for iteration i + distance.
    if (cp_async) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, {i32(distance - 1)});
    if (p.async_reads || tma) fenced_barrier();
    else barrier();
    if (producer_loop_) release_stage_ahead(p, iter);
    else issue_ring_copies(p, body, b_.CreateAdd(iv, b_.CreateMul(step, i32(distance))),
                           b_.CreateURem(b_.CreateAdd(iter, i32(distance)), i32(stages)), hi);
    if (cp_async) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_commit_group, {});
  }
  if (tma) wait_tma_stage(p, cur, iter);
  for (const auto* loads : {&p.loads, &p.tma_loads})
    for (const ir::Op* load : *loads)
      stage_base_[load->result()] = b_.CreateMul(cur, i32(smem_.buffers.at(load->result()).stage_bytes));
}

void KernelLowering::deferred_products_done(const LoopPipeline& p) {
  // The products deferred in this iteration stay in flight; those of the one before are done.
  if (p.deferred_groups > 0)
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_wgmma_wait_group_sync_aligned, {b_.getInt64(p.deferred_groups)});
}

void KernelLowering::pipeline_exit(const LoopPipeline& p) {
  if (p.deferred_groups > 0)  // the last iteration's products: the loop's results are their accumulators
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_wgmma_wait_group_sync_aligned, {b_.getInt64(0)});
  if (p.ring()) {
    // Copies may still be in flight (with two stages those for the iteration past the end; with a
    // slack stage empty groups): drain them before the buffers are reused. (No TMA copy is: see
    // ring_prologue.) Behind the barrier every thread is done waiting on the TMA ring's barriers.
    if (!p.loads.empty()) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, {i32(0)});
    barrier();
    for (const auto* loads : {&p.loads, &p.tma_loads})
      for (const ir::Op* load : *loads) stage_base_.erase(load->result());
  }
  for (const ir::Op* dot : p.zero_start_dots) first_step_adds_.erase(dot);
}

Regs KernelLowering::zero_where_no_iteration(Regs rs, llvm::Value* runs) {
  // Chosen here, after the wait, through an opaque copy: else LLVM moves the zeros onto the path that
  // skips the loop, ahead of the wait where the paths join, and ptxas serializes the products again.
  for (llvm::Value*& r : rs) {
    auto* copy = llvm::InlineAsm::get(llvm::FunctionType::get(r->getType(), {r->getType()}, false), "mov.b32 $0, $1;",
                                      "=f,f", /*hasSideEffects=*/true);
    r = b_.CreateSelect(runs, b_.CreateCall(copy, {r}), llvm::Constant::getNullValue(r->getType()));
  }
  return rs;
}

}  // namespace linac::nvptx
