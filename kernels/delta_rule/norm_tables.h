// --l2norm-qk's inverse row norms r = 1 / sqrt(|x|^2 + eps) of q and k, as tables: the UT kernel
// (delta_rule_wy) forms them, since it reads k anyway, and the forward's later kernels (the walk, the
// segments' states, the scores) read them as row factors. Each kernel forming them itself summed
// [BT, K] squares across its warps in every chunk, in the walks on the chain of every chunk step
// (docs/ops/delta_rule.md, "--l2norm-qk's norms").
#pragma once

#include "kernels/common/op_support.h"
#include "linac/dsl.h"

namespace linac {

/// The tables, as kernel parameters: q_norms and k_norms [chunks, H, BT] f32, chunks numbered over all
/// sequences (chunk_tables' offsets, kernels/common/op_support.h); rows past a sequence's end hold
/// rsqrt(eps), a zero row's.
struct InverseNormTables {
  dsl::Tensor q, k;
  /// Declares q_norms (where `with_q`), then k_norms.
  static InverseNormTables declare(dsl::KernelBuilder& kb, bool with_q);
  /// Rows row0 .. row0 + rows of chunk `chunk` of head `i_h`: [rows] f32.
  dsl::Tile load_q(const dsl::Tile& chunk, const dsl::Tile& i_h, int64_t row0, int64_t rows) const;
  dsl::Tile load_k(const dsl::Tile& chunk, const dsl::Tile& i_h, int64_t row0, int64_t rows) const;
  /// Stores the inverse norms of the rows of `x` ([rows, K]) as rows row0.. of `table` (q or k), and
  /// returns them.
  static dsl::Tile store_inverse_norms(const dsl::Tensor& table, const dsl::Tile& x, const dsl::Tile& chunk,
                                       const dsl::Tile& i_h, int64_t row0);
};

/// Adds the tables of `chunks` chunks (over all sequences) of `chunk` rows and `heads` heads to `plan`.
void add_inverse_norm_tables(OpPlan& plan, int64_t chunks, int64_t heads, int64_t chunk);

}  // namespace linac
