#include "kernels/common/fitting.h"

#include <map>
#include <mutex>
#include <tuple>

#include "compiler/passes/layout.h"
#include "compiler/passes/pipeline.h"
#include "compiler/passes/smem_plan.h"
#include "kernels/common/device_limits.h"
#include "linac/error.h"

namespace linac {

int64_t planned_smem_bytes(const std::shared_ptr<ir::Kernel>& k, const OpOptions& opts) {
  const DeviceLimits gpu = device_limits(opts);
  // Where the compile will run the dots (wgmma: swizzled operand buffers, warpgroup layouts).
  const passes::DotUnit unit = passes::dot_unit_for_sm(gpu.sm);
  const bool wgmma = unit != passes::DotUnit::mma_sync;
  const bool tma = passes::tma_for_sm(gpu.sm);
  // Every call planned asks again, for kernels that are memoized (KernelMemo) and immutable: one plan
  // per kernel and target (the key holds the kernel, so its address is never reused for another).
  using Key = std::tuple<std::shared_ptr<ir::Kernel>, int64_t, passes::DotUnit, bool>;
  static std::mutex mu;
  static std::map<Key, int64_t> planned;
  const Key key{k, gpu.max_smem_per_block, unit, tma};
  {
    std::lock_guard lock(mu);
    if (auto it = planned.find(key); it != planned.end()) return it->second;
  }
  const passes::SmemPlan plan =
      passes::plan_shared_memory(*k, passes::assign_layouts(*k, wgmma), passes::plan_pipelining(*k, tma),
                                 gpu.max_smem_per_block, unit);
  std::lock_guard lock(mu);
  planned[key] = plan.total_bytes;
  return plan.total_bytes;
}

bool fits_gpu(const std::vector<std::shared_ptr<ir::Kernel>>& kernels, const OpOptions& opts) {
  for (const auto& k : kernels)
    if (planned_smem_bytes(k, opts) > device_limits(opts).max_smem_per_block) return false;
  return true;
}

bool producer_warps_apply(const std::vector<std::shared_ptr<ir::Kernel>>& kernels, const OpOptions& opts) {
  const bool tma = passes::tma_for_sm(device_limits(opts).sm);
  for (const auto& k : kernels) {
    if (!k->producer_warps) continue;
    try {
      if (!passes::plan_pipelining(*k, tma).producer.loop) return false;
    } catch (const UserError&) {
      return false;
    }
  }
  return true;
}

}  // namespace linac
