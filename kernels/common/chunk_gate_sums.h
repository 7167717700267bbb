// The scalar gates' chunk-local sums (ChunkLogDecays, log_decay.h), computed once per
// chunk by a kernel of their own, all chunks in parallel, for the walks that read them: a walk that
// summed its chunk's gates itself ran two [BT] scans (and their selects) per chunk in every warp of
// every program, beside its chain (docs/ops/delta_rule.md, "The gates' sums"). fla's chunk_local_cumsum
// does the same.
#pragma once
#include <memory>
#include <vector>

#include "kernels/common/log_decay.h"
#include "kernels/common/op_support.h"
#include "linac/dsl.h"

namespace linac {

/// One chunk's stored sums (a walk loads the next chunk's an iteration ahead and carries them).
struct GateSums {
  dsl::Tile b, cuts, span_total, cut_total;  // ChunkLogDecays' fields of the same names
  /// The decays these sums give: chunk_log_decays(g) of the chunk's gates.
  ChunkLogDecays decays() const;
  /// A walk's loop-carried values: its `state`, then these four tiles where they are loaded (a gated
  /// walk), for for_range_carrying.
  std::vector<dsl::Tile*> carried_with(dsl::Tile& state) {
    if (!b.valid()) return {&state};
    return {&state, &b, &cuts, &span_total, &cut_total};
  }
};

/// The tables, as kernel parameters: gate_b and gate_cuts [chunks, H, BT] (rows past a sequence's end
/// hold the chunk's totals: its gates read 0 there), gate_totals [chunks, H, 2] (span_total, cut_total),
/// chunks numbered over all sequences (chunk_tables' offsets, kernels/common/op_support.h).
struct GateSumTables {
  dsl::Tensor b, cuts, totals;
  /// Declares the three parameters, in that order.
  static GateSumTables declare(dsl::KernelBuilder& kb);
  /// The sums of chunk `chunk` (a row of the tables; past the last, zeros) of head `i_h`, `rows` = BT.
  GateSums load(const dsl::Tile& chunk, const dsl::Tile& i_h, int64_t rows) const;
};

/// Heads per program of chunk_gate_sums: one program per chunk of one head was bound by its latency
/// times the waves of short programs (docs/ops/delta_rule.md, "The gates' sums").
inline constexpr int64_t kGateSumHeads = 16;

/// One program per (chunk, block of kGateSumHeads heads): grid (chunks, B * head blocks), or (total
/// chunks, head blocks) with varlen. Parameters: g [cu_seqlens chunk_indices] gate_b gate_cuts
/// gate_totals.
std::shared_ptr<ir::Kernel> build_chunk_gate_sums(int chunk, bool varlen);

/// Adds the tables for `plan.tensors["g"]` in chunks of `chunk` rows, and the kernel's launch, to
/// `plan`; and chunk_offsets (with varlen chunk_indices: chunk_tables') where the plan has none yet.
void add_chunk_gate_sums(OpPlan& plan, const SequenceLayout& seq, int chunk);

}  // namespace linac
