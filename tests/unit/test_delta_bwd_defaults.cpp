// The delta rules' backward takes chunks of 32 where its kernels fit the call's GPU and 16 where they do
// not (kernels/common/fitting.h), as the forward does when it saves for the backward, the per-chunk
// kernel stepping through V in 64 or 32 columns where all of V does not fit; the gated form in fp32
// above V = 64 proposes 16 alone (measured faster: docs/ops/delta_rule.md, "Measured").
#include <doctest/doctest.h>

#include "kernels/common/host_tensor.h"
#include "kernels/delta_rule/op.h"
#include "kernels/op.h"
#include "tests/unit/defaults_test_support.h"

using namespace linac;

namespace {

OpOptions options(DType dtype, int64_t max_smem) { return test::on_gpu(max_smem, dtype); }

}  // namespace

TEST_CASE("the delta rules' backward chunk is the first of 32, 16 whose kernels fit the GPU") {
  const int64_t h100 = test::kH100Smem, a100 = test::kA100Smem;
  for (bool gated : {false, true}) {
    CAPTURE(gated);
    // 16-bit: 32 on both GPUs at every head dim measured here.
    for (int64_t d : {64, 128, 256}) CHECK(delta_bwd_default_chunk(options(DType::bf16, h100), gated, d, d) == 32);
    CHECK(delta_bwd_default_chunk(options(DType::f32, h100), gated, 64, 64) == 32);
    // A block too small for the kernels at 32 even in value steps of 32: 16.
    CHECK(delta_bwd_default_chunk(options(DType::f32, 60000), gated, 64, 64) == 16);
  }
  // fp32 at K = V = 128: the per-chunk kernel plans 252 KB at 32 with all of V in one step, 148 KB in
  // steps of 64: 32 (the gated form takes 16 by its own rule, below).
  CHECK(delta_bwd_default_chunk(options(DType::f32, h100), false, 128, 128) == 32);
  CHECK(delta_bwd_default_chunk(options(DType::f32, h100), true, 128, 128) == 16);
  // fp32 with K != V: 32 where it fits (148-174 KB on an H100; on an A100 in value steps of 64) ...
  CHECK(delta_bwd_default_chunk(options(DType::f32, h100), false, 128, 64) == 32);
  CHECK(delta_bwd_default_chunk(options(DType::f32, h100), false, 64, 128) == 32);
  CHECK(delta_bwd_default_chunk(options(DType::f32, h100), true, 128, 64) == 32);
  CHECK(delta_bwd_default_chunk(options(DType::f32, a100), false, 64, 128) == 32);
  // ... but the gated form above V = 64 takes 16 though 32 fits.
  CHECK(delta_bwd_default_chunk(options(DType::f32, h100), true, 64, 128) == 16);
}
