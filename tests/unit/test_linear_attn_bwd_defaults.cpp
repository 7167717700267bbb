// linear_attn's backward walks at head dims over 128 take chunks of 32, or 16 where the walks at 32 do not
// fit the call's GPU (kernels/common/fitting.h): the gated 16-bit walks at K = V = 256 plan 168 KB at 32,
// more than an A100 block's 163 KB, so an A100 gets 16 while an H100 keeps 32.
#include <doctest/doctest.h>

#include "kernels/common/fitting.h"
#include "kernels/common/host_tensor.h"
#include "kernels/op.h"

using namespace linac;

namespace {

OpPlan gated_backward(int64_t max_smem) {
  TensorMap in;
  for (const char* n : {"q", "k", "v", "do"}) in[n] = HostTensor::zeros(DType::bf16, {1, 64, 64, 256});
  in["g"] = HostTensor::zeros(DType::f32, {1, 64, 64});
  OpOptions opts;
  opts.dtype = DType::bf16;
  opts.backward = true;
  opts.max_smem_per_block = max_smem;
  return find_op("linear_attn").prepare(in, opts, {"dq", "dk", "dv", "dg"});
}

std::vector<std::shared_ptr<ir::Kernel>> kernels_of(const OpPlan& plan) {
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (const auto& l : plan.launches) out.push_back(l.kernel);
  return out;
}

}  // namespace

TEST_CASE("linear_attn's backward at head dim 256 fits the GPU it plans for") {
  const int64_t h100 = 232448, a100 = 166912;
  OpOptions on_a100;
  on_a100.max_smem_per_block = a100;
  OpOptions on_h100;
  on_h100.max_smem_per_block = h100;
  const OpPlan a = gated_backward(a100), h = gated_backward(h100);
  CHECK(fits_gpu(kernels_of(a), on_a100));
  CHECK(fits_gpu(kernels_of(h), on_h100));
  // The H100's plan (chunk 32) would not fit the A100: the A100's is another (chunk 16).
  CHECK_FALSE(fits_gpu(kernels_of(h), on_a100));
  CHECK(kernels_of(a) != kernels_of(h));
}
