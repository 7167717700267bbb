// The part of the time axis a program of a library kernel works on, for dense and packed (varlen)
// inputs alike. Shared by every kernel that walks one sequence per program.
#pragma once
#include "linac/dsl.h"

namespace linac {

/// Batch row `b` and time rows [bos, eos) of sequence `i_n`.
struct SequenceBounds {
  dsl::Tile b, bos, eos;
};

/// With cu_seqlens (varlen: packed sequences in batch row 0), rows cu[i_n] .. cu[i_n+1]; otherwise
/// rows 0 .. T of batch row i_n, T = q.dim(1).
SequenceBounds sequence_bounds(const dsl::Tensor& q, const dsl::Tensor& cu_seqlens, bool varlen, const dsl::Tile& i_n);

}  // namespace linac
