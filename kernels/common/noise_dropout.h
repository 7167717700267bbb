// Noise-dropout (seed 000): o <- (1 - p) o (1 + psi), psi ~ N(0, p) independently per element of o,
// `linac run linear_attn|poly ... --noise-dropout P [--seed S]`. The noise comes from a counter-based
// generator, so the backward regenerates exactly the forward's noise from the seed:
//   key = splitmix64(S);  r1 = splitmix64(key + 2i), r2 = splitmix64(key + 2i + 1)   (i: the element's
//   row-major index in o [B, T, H, V]);  u1 = ((r1 >> 11) + 1) 2^-53, u2 = (r2 >> 11) 2^-53;
//   psi = sqrt(p) sqrt(-2 ln u1) cos(2 pi u2)                                         (Box-Muller)
// where splitmix64(x) is Steele et al.'s finalizer of x + 0x9E3779B97F4A7C15. The multipliers
// m = (1 - p)(1 + psi) are made on the host (fp32, O(T*V) like o) and applied by an elementwise kernel
// after the forward (o *= m) or before the backward (do *= m: d(o m)/do = m).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/op.h"

namespace linac {

/// The multipliers (1 - p)(1 + psi) for an output of `shape`, fp32.
HostTensor noise_dropout_multipliers(const std::vector<int64_t>& shape, double p, uint64_t seed);

/// Applies opts.noise_dropout (if set) to the plan an op made from `inputs`: forward plans get o *= m
/// after their launches, backward plans do *= m before theirs (o is [B, T, H, V] from q and v).
void apply_noise_dropout(OpPlan& plan, const OpOptions& opts, const TensorMap& inputs);

}  // namespace linac
