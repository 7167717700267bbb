#include "kernels/common/prologue.h"

namespace linac {

using namespace dsl;

QkvParams declare_qkv(KernelBuilder& kb, DType dtype) {
  Tensor q = kb.tensor("q", dtype, 4);
  Tensor k = kb.tensor("k", dtype, 4);
  Tensor v = kb.tensor("v", dtype, 4);
  return {q, k, v};
}

SequenceProgram sequence_program(const Tensor& q, const Tensor& cu_seqlens, bool varlen, int axis) {
  Tile i_nh = program_id(axis);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  return {i_nh, i_n, i_h, sequence_bounds(q, cu_seqlens, varlen, i_n)};
}

}  // namespace linac
