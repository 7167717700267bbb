// linear_attn's backward walks take the first of their (chunk, columns) proposals whose walks fit the
// call's GPU (kernels/common/fitting.h), then narrow their column blocks where the walks are few
// (kernels/linear_attn/op_bwd.cpp, bwd_proposals and configure): chunk 64 in 16-bit, 32 in fp32; wider
// columns before larger chunks, but no block of 128 columns where the other head dim is over 128 (it
// spills); fp32 narrowed walks keep 8 warps. The gated 16-bit walks at K = V = 256 plan more shared
// memory at the H100's default (chunk 64, 64 columns) than an A100 block's 163 KB: an A100 gets another
// configuration while an H100 keeps that one.
#include <doctest/doctest.h>

#include "compiler/ir/ir.h"
#include "kernels/common/fitting.h"
#include "kernels/common/host_tensor.h"
#include "kernels/op.h"
#include "tests/unit/defaults_test_support.h"

using namespace linac;
using namespace linac::test;

namespace {

struct Call {
  DType dtype = DType::bf16;
  int64_t B = 1, H = 64, K = 256, V = 256;
  bool gated = false;
  int64_t max_smem = kH100Smem;
  std::map<std::string, int64_t> config = {};
};

OpPlan backward(const Call& c) {
  TensorMap in;
  for (const char* n : {"q", "k"}) in[n] = HostTensor::zeros(c.dtype, {c.B, 64, c.H, c.K});
  for (const char* n : {"v", "do"}) in[n] = HostTensor::zeros(c.dtype, {c.B, 64, c.H, c.V});
  if (c.gated) in["g"] = HostTensor::zeros(DType::f32, {c.B, 64, c.H});
  OpOptions opts;
  opts.dtype = c.dtype;
  opts.backward = true;
  opts.max_smem_per_block = c.max_smem;
  opts.config = c.config;
  std::vector<std::string> wanted = {"dq", "dk", "dv"};
  if (c.gated) wanted.push_back("dg");
  return find_op("linear_attn").prepare(in, opts, wanted);
}

/// The dq walk's launch (the first).
const KernelLaunch& dq(const OpPlan& plan) {
  REQUIRE(plan.launches.at(0).kernel->name == "linear_attn_bwd_dq");
  return plan.launches.at(0);
}

}  // namespace

TEST_CASE("linear_attn's backward at head dim 256 fits the GPU it plans for") {
  Call gated{.gated = true};
  Call on_a100 = gated;
  on_a100.max_smem = kA100Smem;
  const OpPlan a = backward(on_a100), h = backward(gated);
  CHECK(fits_gpu(kernels_of(a), on_gpu(kA100Smem)));
  CHECK(fits_gpu(kernels_of(h), on_gpu(kH100Smem)));
  // The H100's plan would not fit the A100: the A100's is another.
  CHECK_FALSE(fits_gpu(kernels_of(h), on_gpu(kA100Smem)));
  CHECK(kernels_of(a) != kernels_of(h));
}

TEST_CASE("linear_attn's backward chunk: 64 in 16-bit, 32 in fp32; no 128-column block spanning a head dim over 128") {
  // The default plan's kernels are the memo's kernels of the configuration named (same pointers).
  auto same_as = [](Call c, std::map<std::string, int64_t> config) {
    const OpPlan dflt = backward(c);
    c.config = std::move(config);
    return kernels_of(dflt) == kernels_of(backward(c));
  };
  // 16-bit at K = V = 128, 128 sequences x heads: chunk 64, one program per head, 8 warps.
  CHECK(same_as({.B = 2, .K = 128, .V = 128}, {{"chunk", 64}, {"bk", 128}, {"bv", 128}, {"warps", 8}}));
  // fp32 there: chunk 32 (64 fits but ran slower), still one program per head.
  CHECK(same_as({.dtype = DType::f32, .B = 2, .K = 128, .V = 128},
                {{"chunk", 32}, {"bk", 128}, {"bv", 128}, {"warps", 8}}));
  // 16-bit at K = V = 256: chunk 64 on 64 columns (at 128 the dk and dv walks spill); at K = 64,
  // V = 256: 128 value columns (the dv walk spans K = 64 only); at K = 256, V = 128: 64 (dv would span
  // K = 256).
  CHECK(same_as({.B = 2}, {{"chunk", 64}, {"bk", 64}, {"bv", 64}, {"warps", 8}}));
  CHECK(same_as({.B = 2, .K = 64}, {{"chunk", 64}, {"bk", 64}, {"bv", 128}, {"warps", 8}}));
  CHECK(same_as({.B = 2, .V = 128}, {{"chunk", 64}, {"bk", 64}, {"bv", 64}, {"warps", 8}}));
}

TEST_CASE("linear_attn's backward walks narrow their columns where they are few; fp32 keeps 8 warps") {
  // 64 sequences x heads at K = V = 128: 64 walks of one program per head are few, 128 of 64 columns not.
  const OpPlan bf16 = backward({.K = 128, .V = 128});
  CHECK(dq(bf16).grid[0] == 2);
  CHECK(dq(bf16).kernel->num_warps == 4);
  const OpPlan f32 = backward({.dtype = DType::f32, .K = 128, .V = 128});
  CHECK(dq(f32).grid[0] == 2);
  CHECK(dq(f32).kernel->num_warps == 8);
  // 128 sequences x heads: one program per head.
  CHECK(dq(backward({.dtype = DType::f32, .B = 2, .K = 128, .V = 128})).grid[0] == 1);
}
