// Launches that overlap: per-chunk producers (one program per chunk: the delta rules' UT and scores
// kernels) and a walk over the chunks that runs beside them, waiting for flags instead of for the
// producers' end (KernelLaunch::overlaps, kernels/op.h; dsl.h, signal / wait_for). Where the walk's
// programs leave SMs idle (few heads) the producers' work was to hide under the walk's chain; measured,
// the walk slows by as much as they run beside it (docs/ops/delta_rule.md, "The walk beside its
// producers"), so the delta rules take it only when asked (--config overlap=1). The producers take the
// heads as their grid's first axis, so that their programs run in the chunks' order, as the walks need
// them.
//
// A flag counts the producers' programs done with a group of kChunksPerFlag chunks of one sequence and
// head: the walk waits once per group (for the next one, at the head of a group's first iteration),
// since a wait in every iteration put an acquiring load and a barrier on the chain of every chunk step.
#pragma once

#include "kernels/common/device_limits.h"
#include "linac/dsl.h"

namespace linac {

/// Chunks per flag. At least dsl::kPipelineLookahead: a group's iterations read ahead into the next
/// group only.
constexpr int kChunksPerFlag = 8;
static_assert(kChunksPerFlag >= dsl::kPipelineLookahead);

/// Whether a walk of `programs` programs may wait for producers running beside it: on sm_90 or later
/// (the producers start early: programmatic dependent launch) and fewer programs than SMs, so that an SM
/// is left to the producers whatever the scheduler places where (their programs never wait, so they
/// always finish).
bool walk_may_overlap(int64_t programs, const OpOptions& opts);

/// The flags, as a kernel parameter: chunk_ready [sequences, groups, H] i32, dense inputs.
struct ChunkReadyFlags {
  dsl::Tensor ready;
  static ChunkReadyFlags declare(dsl::KernelBuilder& kb);
  /// A producer's program: chunk `chunk` (of its sequence) of sequence `i_n`, head `i_h` stored.
  void signal(const dsl::Tile& i_n, const dsl::Tile& chunk, const dsl::Tile& i_h,
              dsl::Loc loc = dsl::Loc::current()) const;
  /// A walk over `chunks` chunks of sequence i_n, head i_h, before its loop: the first two groups done
  /// by `producers` kernels.
  void wait_before_walk(const dsl::Tile& i_n, const dsl::Tile& chunks, const dsl::Tile& i_h, int producers,
                        dsl::Loc loc = dsl::Loc::current()) const;
  /// At the head of iteration i: at a group's first iteration, the next group done (the iterations of
  /// this group read ahead into it); elsewhere no wait.
  void wait_in_walk(const dsl::Tile& i, const dsl::Tile& i_n, const dsl::Tile& chunks, const dsl::Tile& i_h,
                    int producers, dsl::Loc loc = dsl::Loc::current()) const;
};

/// Adds the flags of `sequences` sequences of `chunks` chunks each and `heads` heads to `plan`, cleared
/// before every run.
void add_chunk_ready_flags(OpPlan& plan, int64_t sequences, int64_t chunks, int64_t heads);

}  // namespace linac
