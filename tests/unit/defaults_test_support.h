// What the tests of the defaults share (test_*_defaults.cpp, test_walk_stages.cpp): the dynamic shared
// memory per block of the GPUs they plan for, options naming such a GPU, and the kernels a plan launches.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/op.h"

namespace linac::test {

/// Bytes of dynamic shared memory a block may have: H100/H200 (sm_90) and A100 (sm_80).
inline constexpr int64_t kH100Smem = 232448;
inline constexpr int64_t kA100Smem = 166912;

/// Options for a GPU whose blocks have `max_smem` bytes (0: none known, the reference H100's).
inline OpOptions on_gpu(int64_t max_smem, DType dtype = DType::bf16) {
  OpOptions opts;
  opts.dtype = dtype;
  opts.max_smem_per_block = max_smem;
  return opts;
}

/// The kernels `plan` launches, in order.
inline std::vector<std::shared_ptr<ir::Kernel>> kernels_of(const OpPlan& plan) {
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (const auto& l : plan.launches) out.push_back(l.kernel);
  return out;
}

}  // namespace linac::test
