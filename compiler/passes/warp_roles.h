// Warp specialisation of a chunk loop's TMA ring (Kernel::producer_warps, sm_90a).
//
// By default the warps that compute also fill the ring: at the head of iteration i, behind the ring's
// barrier, thread 0 arms a stage's mbarrier and issues the TMA copies of a later iteration
// (pipeline.h). With producer warps a warpgroup of its own does that and nothing else: it runs the
// loop's iterations by itself, for each one waiting until the computing warps have released the stage
// (an "empty" mbarrier per stage, which they arrive on where they used to issue the copies), then
// arming the stage's "full" mbarrier with its bytes and issuing the copies. The computing warps
// synchronize among themselves with a named barrier (bar.sync 1, their threads) instead of bar.sync 0,
// and the registers move between the roles (setmaxnreg): the producer keeps few, the computing
// warpgroups take the rest.
//
// The producer runs no tile op: before the warps part, every thread evaluates the scalars the copies'
// coordinates need (the loop's bounds, and what the loads' offsets and limits are computed from outside
// the loop: program ids, a sequence's bounds loaded from cu_seqlens, ...). Those must come from pure
// scalar ops at the top level of the kernel; the ring must be the kernel's only one, at its top level,
// with every pipelined load copied by TMA; and the kernel must wait for no flag (the producer runs
// ahead of any wait). Else producer warps are refused: a UserError naming what stands in the way.
#pragma once
#include <vector>

#include "compiler/ir/ir.h"

namespace linac::passes {

struct PipelinePlan;

/// What the producer warps need: the loop whose ring they fill, and the top-level ops (in program order)
/// every thread evaluates before the warps part.
struct ProducerPlan {
  const ir::Op* loop = nullptr;
  std::vector<const ir::Op*> prologue;
};

/// The producer plan of `k` given its pipelining, or an empty plan (loop null) where k asks for no
/// producer warps or its loops copy nothing by TMA (sm_80, LINAC_TMA=0: producer warps are then ignored).
/// UserError where k asks for them but its ring does not have the form above.
ProducerPlan plan_producer(const ir::Kernel& k, const PipelinePlan& pipeline);

/// The threads of one block of `k`: its warps, and its producer warps where `producer` has a loop.
int block_threads(const ir::Kernel& k, const ProducerPlan& producer);

/// Registers per thread with producer warps (multiples of 8, as setmaxnreg takes them): what every
/// thread starts with (.maxnreg: the register file over the block's threads and min_ctas_per_sm
/// blocks), what the producer keeps (more where `pipeline` copies many loads per iteration), and what
/// the computing warps take from the block's pool once the producer released the rest (at most 248).
struct RoleRegisters {
  int launch = 0, producer = 0, consumer = 0;
};
RoleRegisters role_registers(const ir::Kernel& k, const PipelinePlan& pipeline);

}  // namespace linac::passes
