// signal and wait (ir.h): flags in global memory between launches that run at once. A producer's
// program, once all its threads are past their stores (a barrier), has one thread add 1 to the flag with
// release semantics at GPU scope; a consumer's program has one thread spin on an acquiring load until
// the flag reaches its count, then a barrier lets every thread on. The barrier is what makes the
// release and the acquire cover the other threads' stores and loads (PTX memory model: bar.sync
// synchronizes the program's threads, and release/acquire are cumulative over what they observed).
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

using ir::OpCode;

namespace {

llvm::InlineAsm* asm_of(llvm::Type* result, std::vector<llvm::Type*> args, const char* text, const char* constraints) {
  return llvm::InlineAsm::get(llvm::FunctionType::get(result, args, false), text, constraints, /*hasSideEffects=*/true);
}

}  // namespace

void KernelLowering::lower_flag(const ir::Op& op, const std::function<llvm::Value*(const ir::Value*)>& scalar_of) {
  const TensorView& tv = tensors_.at(op.operands[0]);
  const size_t rank = tv.dims.size();
  llvm::Value* offset = b_.getInt64(0);
  llvm::Value* in_bounds = b_.getTrue();
  for (size_t d = 0; d < rank; ++d) {
    llvm::Value* i = b_.CreateSExtOrTrunc(scalar_of(op.operands[1 + d]), b_.getInt32Ty());
    in_bounds = b_.CreateAnd(in_bounds, b_.CreateICmpULT(i, tv.dims[d]));  // unsigned: negative is out too
    offset = b_.CreateAdd(offset, b_.CreateMul(b_.CreateSExt(i, b_.getInt64Ty()), tv.strides[d]));
  }
  llvm::Value* addr = b_.CreatePtrToInt(b_.CreateGEP(b_.getInt32Ty(), tv.ptr, offset), b_.getInt64Ty());
  llvm::Value* count = op.code == OpCode::Wait ? b_.CreateSExtOrTrunc(scalar_of(op.operands[1 + rank]), b_.getInt32Ty())
                                               : nullptr;
  // A count of 0 or less: nothing, the barrier included (the count is uniform: every thread branches alike).
  llvm::BasicBlock* skip = nullptr;
  if (count) {
    auto* waits = llvm::BasicBlock::Create(ctx_, "wait.some", fn_);
    skip = llvm::BasicBlock::Create(ctx_, "wait.none", fn_);
    b_.CreateCondBr(b_.CreateICmpSGT(count, b_.getInt32(0)), waits, skip);
    b_.SetInsertPoint(waits);
  }
  // Every thread past its stores (signal) before thread 0 acts for the program.
  if (op.code == OpCode::Signal) barrier();
  auto* act = llvm::BasicBlock::Create(ctx_, op.code == OpCode::Signal ? "signal" : "wait", fn_);
  auto* done = llvm::BasicBlock::Create(ctx_, op.code == OpCode::Signal ? "signal.done" : "wait.done", fn_);
  b_.CreateCondBr(b_.CreateAnd(in_bounds, b_.CreateICmpEQ(thread_id(), b_.getInt32(0))), act, done);
  b_.SetInsertPoint(act);
  if (op.code == OpCode::Signal) {
    b_.CreateCall(asm_of(b_.getVoidTy(), {b_.getInt64Ty()}, "red.release.gpu.global.add.u32 [$0], 1;", "l,~{memory}"),
                  {addr});
    b_.CreateBr(done);
  } else {
    auto* spin = llvm::BasicBlock::Create(ctx_, "wait.spin", fn_);
    auto* nap = llvm::BasicBlock::Create(ctx_, "wait.nap", fn_);
    auto* ready = llvm::BasicBlock::Create(ctx_, "wait.ready", fn_);
    b_.CreateBr(spin);
    b_.SetInsertPoint(spin);
    llvm::Value* now = b_.CreateCall(
        asm_of(b_.getInt32Ty(), {b_.getInt64Ty()}, "ld.acquire.gpu.global.u32 $0, [$1];", "=r,l,~{memory}"), {addr});
    b_.CreateCondBr(b_.CreateICmpSGE(now, count), ready, nap);
    b_.SetInsertPoint(nap);
    b_.CreateCall(asm_of(b_.getVoidTy(), {}, "nanosleep.u32 100;", "~{memory}"), {});
    b_.CreateBr(spin);
    // The producer's stores, now visible to this thread, ordered before the TMA copies it issues next
    // (the async proxy, sm_90 on).
    b_.SetInsertPoint(ready);
    if (sm_ >= 90) b_.CreateCall(asm_of(b_.getVoidTy(), {}, "fence.proxy.async.global;", "~{memory}"), {});
    b_.CreateBr(done);
  }
  b_.SetInsertPoint(done);
  if (op.code == OpCode::Wait) {
    // Every thread on after thread 0's acquire. Not on every path (a count of 0 skips it), so it is not
    // recorded as one that orders shared-memory accesses (barrier()).
    emit_block_barrier(b_);
    b_.CreateBr(skip);
    b_.SetInsertPoint(skip);
  }
}

void KernelLowering::let_dependents_start() {
  if (sm_ < 90) return;
  bool flags = false;
  ir::walk(const_cast<ir::Block&>(k_.body),
           [&](ir::Op& op) { flags = flags || op.code == OpCode::Signal || op.code == OpCode::Wait; });
  // A consumer lets its producers start once all its programs have (they wait for the producers, who
  // never wait); a producer lets the next producer start beside it.
  if (flags) b_.CreateCall(asm_of(b_.getVoidTy(), {}, "griddepcontrol.launch_dependents;", "~{memory}"), {});
}

}  // namespace linac::nvptx
