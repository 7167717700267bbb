#include "kernels/common/device_limits.h"

namespace linac {

namespace {

/// The reference GPU (an H100 SXM): see the header.
constexpr DeviceLimits kReferenceGpu{132, 232448, 90};

}  // namespace

DeviceLimits device_limits(const OpOptions& opts) {
  return {opts.num_sms > 0 ? opts.num_sms : kReferenceGpu.sms,
          opts.max_smem_per_block > 0 ? opts.max_smem_per_block : kReferenceGpu.max_smem_per_block,
          opts.sm > 0 ? opts.sm : kReferenceGpu.sm};
}

bool few_walks(int64_t walks, const OpOptions& opts) { return 2 * walks <= device_limits(opts).sms; }

int64_t columns_for_walks(int64_t columns, int64_t padded, int64_t heads, int64_t narrowest, const OpOptions& opts) {
  while (heads > 0 && columns > narrowest && few_walks(heads * (padded / columns), opts)) columns /= 2;
  return columns;
}

}  // namespace linac
