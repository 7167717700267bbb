// Software pipelining of the loads of a chunk loop (num_stages >= 2).
//
// A load directly in a for body whose offsets and limits are pure scalar functions of the induction
// variable and of values defined before the loop can be issued iterations early: the lowering copies
// the block for a later iteration into shared memory with cp.async (16-byte vectors, zero-filled past
// the bounds) while iteration i computes on its own block. The loaded tile then lives only in shared
// memory (a ring of `stages` buffers, iteration i using stage i % stages); consumers read it there
// (dot operands through ldmatrix or wgmma's descriptors, everything else through shared-memory reads).
//
// Two stages: iteration i copies for i + 1 into the stage iteration i - 1 read, after a barrier that
// every thread passes once done with it (two barriers per iteration: that one and the one after the
// copies for i have landed). Three or more: one stage is slack. Iteration i copies for
// i + stages - 2 into the stage iteration i - 2 read, right after the one barrier (behind which every
// thread is done with iteration i - 2); a wgmma product of iteration i - 1 may still run then, reading
// its own stage (wgmma_waits.h: its wait is deferred by one iteration).
//
// Loads at the top level of the kernel (outside any loop or branch) whose tiles go to shared memory
// anyway (dot operands, reductions, reads in another layout) are "prefetched" the same way, chosen by
// the shared-memory planner: the lowering issues their cp.async copies where the load stands and
// waits for them only where their buffer is first read, so that consecutive loads overlap their
// latencies instead of each stalling its first use (delta_rule_bwd_chunk spent 56% of its stall
// samples waiting for loads one at a time).
//
// On sm_90a the pipelined loads that are boxes of their tensor go through the Tensor Memory Accelerator
// (TmaLoad): one thread issues cp.async.bulk.tensor per box of the tile into the stage, which completes
// on the stage's mbarrier; every thread waits on that barrier's phase instead of on cp.async groups. The
// tile's buffer takes the swizzled layout the copy writes (the box's inner extent is one swizzle span),
// and the kernel takes a tensor map per (tensor, box) from the launcher. Where a box would cross a
// limit that is not the tensor's end (packed sequences: rows past the sequence's end read as zeros, the
// map zero-fills only past the tensor's end) or the launcher could not encode the map, that copy is
// made by every thread with plain loads and stores instead, at run time (docs/hopper.md, "TMA").
#pragma once
#include <map>
#include <set>
#include <vector>

#include "compiler/ir/ir.h"
#include "compiler/passes/warp_roles.h"

namespace linac::passes {

/// A tensor map a kernel takes for its TMA loads: the tensor (a kernel parameter) and the box one copy
/// moves, in elements per tensor dim (outermost first: 1 on the dims the tile indexes), with the swizzle
/// that lays a box's rows out as the tile's buffer has them.
struct TensorMapSpec {
  const ir::Value* tensor = nullptr;
  std::vector<int64_t> box;
  int swizzle_bytes = 0;
  bool operator==(const TensorMapSpec&) const = default;
};

/// A pipelined load copied by TMA: `boxes` copies of tensor map `map` side by side along the tile's
/// columns (each one block of the swizzled buffer), `box_cols` columns each.
struct TmaLoad {
  int map = 0;
  int64_t box_cols = 0;
  int boxes = 1;
  int64_t bytes = 0;  // the whole tile: what the stage's barrier expects when every box is copied
};

struct PipelinePlan {
  int stages = 1;  // 1 (no pipelining) to ir::kMaxNumStages
  std::set<const ir::Op*> loads;       // the pipelined loads (in loop bodies, `stages` stages)
  std::set<const ir::Op*> prefetched;  // top-level loads copied asynchronously (one stage)
  std::map<const ir::Op*, TmaLoad> tma;     // the pipelined loads copied by TMA (sm_90a)
  std::vector<TensorMapSpec> tensor_maps;   // the maps those copies read, in kernel-parameter order
  ProducerPlan producer;  // with producer warps (warp_roles.h): the loop whose ring they fill
  /// Whether v lives in shared memory only, copied there by cp.async (pipelined or prefetched).
  bool contains(const ir::Value* v) const { return v->def && (loads.count(v->def) || prefetched.count(v->def)); }
  bool is_prefetched(const ir::Value* v) const { return v->def && prefetched.count(v->def); }
  /// Whether one stage of the ring is slack (three stages or more; see above).
  bool slack() const { return stages >= 3; }
  /// How many iterations ahead the copies go: stages - 1, or stages - 2 with a slack stage.
  int distance() const { return stages - (slack() ? 2 : 1); }
  /// The mbarriers of a TMA ring per stage: "full" (the copies landed), and with producer warps "empty"
  /// (the computing warps are done with the stage) after all the full ones.
  int barriers_per_stage() const { return producer.loop ? 2 : 1; }
};

/// The tensors `k` stores to anywhere: loading one of them early (a pipelined iteration ahead, or
/// asynchronously ahead of a store of this program) could read stale data.
std::set<const ir::Value*> stored_tensors(const ir::Kernel& k);

/// Whether a load of tile type `t` in a kernel of `num_threads` threads splits into 16-byte vectors
/// over the threads (cp.async's unit).
bool splits_into_16_byte_copies(const ir::Type& t, int num_threads);

/// Chooses the loads to pipeline: loads directly in a for body, with predictable offsets, from a
/// tensor the kernel never stores to, whose tile splits into 16-byte vectors (cp.async's unit) over
/// the kernel's threads or, with `tma` and no producer warps, is a box of 32 columns or more that TMA
/// copies (pipeline.cpp, collect). With `tma` the loads that are boxes of their tensor go through TMA: a
/// 2-D tile along two of the tensor's dims in order, the second its innermost, 32 to 256 rows (8 with
/// producer warps), whose rows take a swizzled layout (swizzle_width).
PipelinePlan plan_pipelining(const ir::Kernel& k, bool tma = false);

/// Whether compute capability `sm` (x 10) copies pipelined loads with TMA: from 90 on, unless LINAC_TMA=0
/// (1 is the default; anything else is a UserError). Compiles (nvptx::GpuTarget::for_sm) and the
/// defaults' fit checks (kernels/common/fitting.h) both ask it.
bool tma_for_sm(int sm);

/// The width W of the swizzled layout a buffer of tile type `t` takes (SmemBuffer::swizzle_bytes): the
/// widest of 128, 64, 32 bytes that its rows are a multiple of (128) or equal to (64, 32), rows in
/// groups of 8; 0 where none fits (rank other than 2).
int swizzle_width(const ir::Type& t);

/// Whether `v` is computed from the block's induction variable and values defined outside `body`
/// by pure scalar ops only (what the lowering can re-evaluate for the next iteration).
bool is_predictable_scalar(const ir::Value* v, const ir::Block& body);

}  // namespace linac::passes
