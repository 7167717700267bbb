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

/// Segment `i_s` of `seq` when its rows are cut in segments of `rows`: rows [bos + i_s rows,
/// min(eos, bos + (i_s + 1) rows)) of the same batch row (the segment-parallel schedules).
SequenceBounds segment_bounds(const SequenceBounds& seq, const dsl::Tile& i_s, int64_t rows);

/// Where a program of a kernel with one program per chunk works, for grid (i_c, i_x): with varlen,
/// chunk_indices[i_c] = (sequence, chunk of it) and i_x is the head; otherwise i_x = batch row x heads
/// and i_c the chunk. `global_chunk` numbers the chunk among all chunks of all sequences (the row of
/// per-chunk tables), for chunks of `chunk_rows` rows.
/// `i_n` is the sequence (dense: the batch row). `t0` is the chunk's first row (bos + chunk * chunk_rows) and `in_seq` masks rows at or past eos.
struct ChunkBounds {
  dsl::Tile i_n, b, i_h, bos, eos, chunk, global_chunk, t0;
  dsl::AccessOptions in_seq;
};
ChunkBounds chunk_bounds(const dsl::Tensor& q, const dsl::Tensor& cu_seqlens, const dsl::Tensor& chunk_indices,
                         bool varlen, const dsl::Tile& i_c, const dsl::Tile& i_x, int64_t chunk_rows);

/// The packed-sequence tables of a kernel with one program per chunk, as its parameters: cu_seqlens
/// [N+1] and chunk_indices [chunks, 2] (chunk_tables', kernels/common/op_support.h); none for dense
/// inputs.
struct ChunkIndexTables {
  dsl::Tensor cu_seqlens, chunk_indices;
  bool varlen = false;
  /// Declares cu_seqlens, then chunk_indices, where `varlen`; nothing otherwise.
  static ChunkIndexTables declare(dsl::KernelBuilder& kb, bool varlen);
  /// chunk_bounds with these tables.
  ChunkBounds bounds(const dsl::Tensor& q, const dsl::Tile& i_c, const dsl::Tile& i_x, int64_t chunk_rows) const {
    return chunk_bounds(q, cu_seqlens, chunk_indices, varlen, i_c, i_x, chunk_rows);
  }
};

}  // namespace linac
