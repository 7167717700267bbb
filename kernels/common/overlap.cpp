#include "kernels/common/overlap.h"

#include <algorithm>

namespace linac {

using namespace dsl;

bool walk_may_overlap(int64_t programs, const OpOptions& opts) {
  const DeviceLimits gpu = device_limits(opts);
  return gpu.sm >= 90 && programs < gpu.sms;
}

ChunkReadyFlags ChunkReadyFlags::declare(KernelBuilder& kb) { return {kb.tensor("chunk_ready", DType::i32, 3)}; }

void ChunkReadyFlags::signal(const Tile& i_n, const Tile& chunk, const Tile& i_h, Loc loc) const {
  dsl::signal(ready, {i_n, chunk / kChunksPerFlag, i_h}, loc);
}

namespace {

/// The wait for group g (past the last: none), where `at_head` (1, else 0): every chunk of it done by
/// `producers` kernels. Arithmetic only (no selects): a wait in a loop body is lowered at the iteration's
/// head from the induction variable (ir.h, Wait), as the pipeline evaluates the loads' offsets.
void wait_for_group(const Tensor& ready, const Tile& i_n, const Tile& g, const Tile& chunks, const Tile& i_h,
                    int producers, const Tile& at_head, Loc loc) {
  const Tile groups = (chunks + (kChunksPerFlag - 1)) / kChunksPerFlag;
  const Tile in_group = maximum(minimum(chunks - g * kChunksPerFlag, kChunksPerFlag), 0);  // 0 past the last
  wait_for(ready, {i_n, minimum(g, groups - 1), i_h}, in_group * producers * at_head, loc);
}

}  // namespace

void ChunkReadyFlags::wait_before_walk(const Tile& i_n, const Tile& chunks, const Tile& i_h, int producers,
                                       Loc loc) const {
  const Tile yes = constant(1, DType::i32);
  for (int g = 0; g < 2; ++g) wait_for_group(ready, i_n, constant(g, DType::i32), chunks, i_h, producers, yes, loc);
}

void ChunkReadyFlags::wait_in_walk(const Tile& i, const Tile& i_n, const Tile& chunks, const Tile& i_h, int producers,
                                   Loc loc) const {
  const Tile at_head = 1 - minimum(i % kChunksPerFlag, 1);  // a group's first iteration
  wait_for_group(ready, i_n, i / kChunksPerFlag + 1, chunks, i_h, producers, at_head, loc);
}

void add_chunk_ready_flags(OpPlan& plan, int64_t sequences, int64_t chunks, int64_t heads) {
  const int64_t groups = std::max<int64_t>((chunks + kChunksPerFlag - 1) / kChunksPerFlag, 1);
  plan.tensors["chunk_ready"] = HostTensor::zeros(DType::i32, {std::max<int64_t>(sequences, 1), groups, heads});
  plan.cleared.push_back("chunk_ready");
}

}  // namespace linac
