// What a plan's defaults know of the GPU the call runs on, and the one rule for "these walks leave it
// idle". The runtime sets OpOptions::num_sms, max_smem_per_block and sm for CUDA calls; where no GPU is
// known (`linac plan`, `linac compile --shape`, CPU runs) the reference GPU stands in: an H100 (132 SMs,
// sm_90, 227 KB of shared memory per block), the card the defaults were measured on (docs/ops/*.md,
// "Measured"), so a plan made without a GPU is the one an H100 runs. No default reads
// OpOptions::max_smem_per_block itself: what fits is kernels/common/fitting.h's.
#pragma once
#include <cstdint>

#include "kernels/op.h"

namespace linac {

/// The GPU a plan is made for: the call's, or the reference GPU where it is not known.
struct DeviceLimits {
  int64_t sms = 0;                 // streaming multiprocessors
  int64_t max_smem_per_block = 0;  // bytes of dynamic shared memory one block may have
  int sm = 0;                      // compute capability x 10 (90: sm_90a, whose dots run on wgmma)
};

/// The limits of the call's GPU (each field from `opts` where set, else the reference GPU's).
DeviceLimits device_limits(const OpOptions& opts);

/// Whether `walks` (programs that each carry a state through a whole sequence) leave at least half of
/// the SMs idle: where a schedule with more, shorter programs (narrower column blocks, segments, the
/// split schedules) pays for its extra work.
bool few_walks(int64_t walks, const OpOptions& opts);

/// Column blocks for a walk over `padded` columns at `heads` sequences x heads (0: unknown, kept as
/// they are): `columns` halved, down to `narrowest`, while the walk's programs (heads x padded / columns)
/// are few. Narrower blocks give a walk more programs; each redoes the products its block shares.
int64_t columns_for_walks(int64_t columns, int64_t padded, int64_t heads, int64_t narrowest, const OpOptions& opts);

}  // namespace linac
