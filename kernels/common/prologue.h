// The prologue most library kernels share, spelled once: q, k and v declared as parameters, and the
// sequence and head of a program whose grid axis runs over sequences x heads, with its sequence's rows.
// A kernel then reads from its first line of math:
//
//   auto [q, k, v] = declare_qkv(kb, dt);
//   ...                                     (the kernel's other parameters)
//   Tile i_v = program_id(0);
//   const auto [i_nh, i_n, i_h, seq] = sequence_program(q, cu, cfg.varlen, /*axis=*/1);
//
// Both record exactly the ops the kernels spelled out by hand before (tools/ptx_snapshot.sh compares).
#pragma once
#include "kernels/common/sequence_bounds.h"
#include "linac/dsl.h"

namespace linac {

/// q, k and v: the next three parameters of `kb`, in that order, rank 4 ([B, T, H, K] and [B, T, H, V])
/// and of `dtype`.
struct QkvParams {
  dsl::Tensor q, k, v;
};
QkvParams declare_qkv(dsl::KernelBuilder& kb, DType dtype);

/// Where a program works when grid axis `axis` runs over sequences x heads: i_nh = program_id(axis)
/// = i_n * H + i_h with H = q.dim(2), and `seq` the rows of sequence i_n (sequence_bounds: packed
/// sequences with varlen, else batch row i_n).
struct SequenceProgram {
  dsl::Tile i_nh, i_n, i_h;
  SequenceBounds seq;
};
SequenceProgram sequence_program(const dsl::Tensor& q, const dsl::Tensor& cu_seqlens, bool varlen, int axis);

}  // namespace linac
