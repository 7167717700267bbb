// The log-decay gates of the chunked kernels (linear_attn's per-head scalar gate, gla's per-channel
// one) as the kernels that need it read them.
//
// The gates' contract is g <= 0, -inf included: exp(g) = 0 drops the state before the token, as the
// recurrent forms do. The chunked forms build the decays between rows from chunk-local cumulative sums b
// of the gates, some of them as differences b_r - b_c (linear_attn's exp(b_r - b_c) and exp(b_C - b);
// gla's L - g0 and tot - L against a sub-chunk's first row, the diagonal blocks' L_r - L_c and their
// factored form's exp(L - m) with m midway between L's extremes): a gate of -inf makes both terms -inf
// and the difference NaN, which then reaches every later output; a finite gate of -3e38 overflows the
// sums or swallows the gates summed with it. Kernels that take such differences read their gates
// through floor_log_decay, which raises them to kLogDecayFloor:
//  - any decay whose span includes a floored gate is a sum <= kLogDecayFloor (+ rounding), whose exp is
//    0 in fp32 (exp(-128) = 2.6e-56; fp32's smallest subnormal is 1.4e-45), as the exp of the
//    original gate is: the state is dropped exactly as the recurrence drops it;
//  - decays that do not include it, taken as differences of sums that do, are rounded to ulp(|b|):
//    about 1e-5 relative after one floored gate, finer than after an unfloored gate of -1e4 (1e-3);
//  - gates >= kLogDecayFloor are read bit for bit (ordinary inputs give the same results), and NaN stays
//    NaN (a select; maximum() would drop it). One compare and select per gate element loaded.
// Kernels whose every decay is a sum of the gates it spans need no floor (exp(-inf) = 0, -inf + x =
// -inf): the delta rules (blocks::chunk_decays, linac/blocks.h), gla's backward walks and split-schedule
// state passes.
#pragma once
#include "linac/dsl.h"

namespace linac {

/// The smallest log-decay a chunked kernel works with: exp of it (and of anything below) is 0 in fp32.
inline constexpr float kLogDecayFloor = -128.0f;

/// g with every entry below kLogDecayFloor (-inf included) raised to it; NaN and entries above are kept.
dsl::Tile floor_log_decay(const dsl::Tile& g);

}  // namespace linac
