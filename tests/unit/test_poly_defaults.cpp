// poly's defaults read the call's GPU where it matters (OpOptions::max_smem_per_block): the backward's
// per-chunk kernels take two pipeline stages only where a block has the shared memory for them (sm_90),
// one when the GPU is unknown or smaller (sm_80).
#include <doctest/doctest.h>

#include <string>

#include "compiler/ir/ir.h"
#include "kernels/common/host_tensor.h"
#include "kernels/op.h"

using namespace linac;

namespace {

OpPlan backward_plan(int64_t max_smem) {
  TensorMap in;
  for (const char* n : {"q", "k", "v", "do"}) in[n] = HostTensor::zeros(DType::bf16, {1, 512, 2, 64});
  OpOptions opts;
  opts.dtype = DType::bf16;
  opts.backward = true;
  opts.max_smem_per_block = max_smem;
  return find_op("poly").prepare(in, opts, {"dq", "dk", "dv"});
}

int stages_of(const OpPlan& plan, const std::string& kernel) {
  for (const auto& l : plan.launches)
    if (l.kernel->name == kernel) return l.kernel->num_stages;
  FAIL("no launch of ", kernel);
  return 0;
}

}  // namespace

TEST_CASE("poly's backward takes two stages per chunk only where the GPU has the shared memory") {
  for (const char* k : {"poly_bwd_dq", "poly_bwd_dkv", "poly_bwd_prepare"}) {
    CAPTURE(k);
    CHECK(stages_of(backward_plan(0), k) == 1);       // no GPU known: what fits sm_80
    CHECK(stages_of(backward_plan(166912), k) == 1);  // sm_80
    CHECK(stages_of(backward_plan(232448), k) == 2);  // sm_90
  }
  CHECK(stages_of(backward_plan(0), "poly_bwd_sums") == 2);  // the sums fit two stages anywhere
}
