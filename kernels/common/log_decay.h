// The log-decay gates of the chunked kernels (linear_attn's and gated_delta_rule's per-head scalar
// gate, gla's per-channel one) as the kernels that need it read them.
//
// The gates' contract is g <= 0, -inf included: exp(g) = 0 drops the state before the token, as the
// recurrent forms do. The chunked forms build the decays between rows from chunk-local cumulative sums b
// of the gates, some of them as differences b_r - b_c (the scalar-gated walks' exp(b_r - b_c) and
// exp(b_C - b), ChunkLogDecays; gla's L - g0 and tot - L against a sub-chunk's first row, the
// diagonal blocks' L_r - L_c and their factored form's exp(L - m) with m midway between L's
// extremes): a gate of -inf makes both terms -inf and the difference NaN, which then reaches every
// later output; a finite gate of -3e38 overflows the sums or swallows the gates summed with it.
// Kernels that take such differences read their gates through floor_log_decay, which raises them to
// kLogDecayFloor (or set them apart: ChunkLogDecays below):
//  - any decay whose span includes a floored gate is a sum <= kLogDecayFloor (+ rounding), whose exp is
//    0 in fp32 (exp(-128) = 2.6e-56; fp32's smallest subnormal is 1.4e-45), as the exp of the
//    original gate is: the state is dropped exactly as the recurrence drops it;
//  - decays that do not include it, taken as differences of sums that do, are rounded to ulp(|b|):
//    about 1e-5 relative after one floored gate, finer than after an unfloored gate of -1e4 (1e-3);
//  - gates >= kLogDecayFloor are read bit for bit (ordinary inputs give the same results), and NaN stays
//    NaN (a select; maximum() would drop it). One compare and select per gate element loaded.
// Kernels whose every decay is a sum of the gates it spans need no floor (exp(-inf) = 0, -inf + x =
// -inf): the delta rules' UT kernel and backward (blocks::chunk_decays, linac/blocks.h), gla's backward
// walks and split-schedule state passes.
#pragma once
#include "linac/dsl.h"

namespace linac {

/// The smallest log-decay a chunked kernel works with: exp of it (and of anything below) is 0 in fp32.
inline constexpr float kLogDecayFloor = -128.0f;

/// g with every entry below kLogDecayFloor (-inf included) raised to it; NaN and entries above are kept.
dsl::Tile floor_log_decay(const dsl::Tile& g);

/// A chunk's per-row gates [BT] (or [BT, heads], summed down axis 0) as the chunk walks read them:
/// summed once (b, b_C), every decay between rows a difference of those sums, where summing the gates
/// each decay spans (blocks::chunk_decays) is a [BT, BT] scan through shared memory. Rows past the
/// sequence end load g = 0, so b stops growing there and b_C = b at the last row.
/// Gates below kLogDecayFloor (-inf included) are set apart: left out of b and counted per row instead
/// (a second scan); a decay whose span holds one is 0 and every other is exp of a difference of
/// ordinary sums, as precise as without the gate (outputs after such a gate keep the 1e-5 of the spans
/// summed one by one: tests/python/test_delta_rule.py; flooring them instead rounded the decays after
/// them to ulp(|b|), 4e-5 relative). The walks of linear_attn and the delta rules do not scan: they
/// read these sums from tables filled once per chunk (chunk_gate_sums.h); the normalized walk
/// (linear_attn --normalize) still scans (reading the sums, ptxas spilled it in fp32 on sm_80).
struct ChunkLogDecays {
  dsl::Tile b;      // [BT]: b_r, the gates of rows 0..r summed (set-apart gates left out)
  dsl::Tile total;  // the log of the chunk's whole decay: b_C (kLogDecayFloor if it holds a set-apart gate)
  /// [BT, BT]: exp(b_r - b_c) where `pairs` holds (r >= c), exp(b_c - b_r) with `reverse`, 1 elsewhere:
  /// exponentiated only where the rows interact (elsewhere the difference would overflow).
  dsl::Tile between(const dsl::Tile& pairs, bool reverse = false) const;
  /// [BT]: exp(b_C - b_r), the decay from row r to the chunk's end.
  dsl::Tile to_end() const;
  /// [BT]: exp(b_r), the decay from the chunk's start to row r.
  dsl::Tile from_start() const;

  dsl::Tile span_total;  // b_C as a sum (set-apart gates left out)
  dsl::Tile cuts;        // [BT]: set-apart gates in rows 0..r
  dsl::Tile cut_total;   // set-apart gates in the chunk
};

/// g: a chunk's gates as loaded.
ChunkLogDecays chunk_log_decays(const dsl::Tile& g);

}  // namespace linac
