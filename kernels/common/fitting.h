// Defaults the compiler's own plan decides: a family proposes configurations in order of preference and
// the shared-memory planner (compiler/passes/smem_plan.h: layouts, pipelining and the plan, no LLVM) picks
// the first whose kernels fit a block of the call's GPU (kernels/common/device_limits.h: the reference
// GPU where none is known), planned for that GPU's target as its compile will (passes::dot_unit_for_sm:
// sm_90a's dots on wgmma unless LINAC_WGMMA says otherwise; passes::tma_for_sm: its pipelined boxes by TMA,
// in swizzled buffers, unless LINAC_TMA=0). So no default restates
// what the planner would say ("fp32 at head dim 128 takes chunk 32 because chunk 64 needs N KB"), and a
// GPU with less shared memory gets the next proposal instead of a launch that fails. Registers are not
// planned before ptxas: defaults bounded by spills stay rules of their family, which say so.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/common/config_schema.h"
#include "kernels/op.h"

namespace linac {

/// The dynamic shared memory `k` plans on the call's GPU (as `linac compile --emit smem` shows it).
int64_t planned_smem_bytes(const std::shared_ptr<ir::Kernel>& k, const OpOptions& opts);

/// Whether every one of `kernels` fits a block of the call's GPU.
bool fits_gpu(const std::vector<std::shared_ptr<ir::Kernel>>& kernels, const OpOptions& opts);

/// Whether every kernel of `kernels` that asks for producer warps (Kernel::producer_warps) gets them on
/// the call's GPU: it copies with TMA and passes::plan_producer accepts the kernel's ring (elsewhere a
/// UserError). Families default to producer warps only where this holds.
bool producer_warps_apply(const std::vector<std::shared_ptr<ir::Kernel>>& kernels, const OpOptions& opts);

/// The producer warps a family's kernels take unless asked (`--config producer`), the rule for every
/// family that offers them: cfg.*warps becomes 4 in 16 bits where they apply (producer_warps_apply) to
/// `kernels_of(c)`, the kernels the plan launches at c = cfg with 4, else 0. Where a family offers them is
/// its own rule (measured: docs/hopper.md, "Session 33" and "Session 34").
template <class C, class KernelsOf>
void default_producer_warps(C& cfg, int C::*warps, const KernelsOf& kernels_of, const OpOptions& opts) {
  if (producer_key().asked(opts)) return;
  C with = cfg;
  with.*warps = 4;
  cfg.*warps = cfg.dtype != DType::f32 && producer_warps_apply(kernels_of(with), opts) ? 4 : 0;
}

/// The first of `proposals` (non-empty) whose kernels fit (`kernels_of`: the kernels the plan launches
/// with that configuration); the last when none does, whose compile then says what does not fit.
template <class C>
C first_fitting(const std::vector<C>& proposals,
                const std::function<std::vector<std::shared_ptr<ir::Kernel>>(const C&)>& kernels_of,
                const OpOptions& opts) {
  for (const C& c : proposals)
    if (fits_gpu(kernels_of(c), opts)) return c;
  return proposals.back();
}

}  // namespace linac
