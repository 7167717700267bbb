#include "kernels/common/sequence_bounds.h"

namespace linac {

using namespace dsl;

SequenceBounds sequence_bounds(const Tensor& q, const Tensor& cu_seqlens, bool varlen, const Tile& i_n) {
  if (varlen)
    return {constant(0, DType::i32), load(cu_seqlens, {i_n}, {kIndex}), load(cu_seqlens, {i_n + 1}, {kIndex})};
  return {i_n, constant(0, DType::i32), q.dim(1)};
}

SequenceBounds segment_bounds(const SequenceBounds& seq, const Tile& i_s, int64_t rows) {
  Tile bos = seq.bos + i_s * rows;
  return {seq.b, bos, minimum(seq.eos, bos + rows)};
}

ChunkBounds chunk_bounds(const Tensor& q, const Tensor& cu_seqlens, const Tensor& chunk_indices, bool varlen,
                         const Tile& i_c, const Tile& i_x, int64_t chunk_rows) {
  ChunkBounds c;
  if (varlen) {
    c.i_n = load(chunk_indices, {i_c, 0}, {kIndex, kIndex});
    c.chunk = load(chunk_indices, {i_c, 1}, {kIndex, kIndex});
    c.b = constant(0, DType::i32);
    c.i_h = i_x;
    c.bos = load(cu_seqlens, {c.i_n}, {kIndex});
    c.eos = load(cu_seqlens, {c.i_n + 1}, {kIndex});
    c.global_chunk = i_c;
  } else {
    Tile H = q.dim(2);
    c.b = i_x / H;
    c.i_n = c.b;
    c.i_h = i_x % H;
    c.chunk = i_c;
    c.bos = constant(0, DType::i32);
    c.eos = q.dim(1);
    c.global_chunk = c.b * ((c.eos + (chunk_rows - 1)) / chunk_rows) + i_c;
  }
  c.in_seq = AccessOptions{.limits = {{1, c.eos}}};
  c.t0 = c.bos + c.chunk * chunk_rows;
  return c;
}

ChunkIndexTables ChunkIndexTables::declare(KernelBuilder& kb, bool varlen) {
  ChunkIndexTables t;
  t.varlen = varlen;
  if (varlen) {
    t.cu_seqlens = kb.tensor("cu_seqlens", DType::i32, 1);
    t.chunk_indices = kb.tensor("chunk_indices", DType::i32, 2);
  }
  return t;
}

}  // namespace linac
