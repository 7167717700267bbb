#include "kernels/sequence_bounds.h"

namespace linac {

using namespace dsl;

SequenceBounds sequence_bounds(const Tensor& q, const Tensor& cu_seqlens, bool varlen, const Tile& i_n) {
  if (varlen)
    return {constant(0, DType::i32), load(cu_seqlens, {i_n}, {kIndex}), load(cu_seqlens, {i_n + 1}, {kIndex})};
  return {i_n, constant(0, DType::i32), q.dim(1)};
}

}  // namespace linac
