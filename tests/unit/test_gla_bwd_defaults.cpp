// gla's backward defaults from the fitting rule (kernels/gla/op_bwd.cpp, configure): the walks' column
// blocks are the first of 128 x 128, 64 x 64, ... whose walks fit the call's GPU, two stages deep and
// then one; narrowed to 64 columns where the walks are few; the split schedule's chunk is the first of
// its proposals that fits, with the state passes two stages deep where they fit.
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
  DType dtype = DType::f32;
  int64_t B = 8, T = 64, H = 16, K = 128, V = 128;
  int64_t max_smem = kH100Smem;
  std::map<std::string, int64_t> config = {};
};

OpPlan backward(const Call& c) {
  TensorMap in;
  for (const char* n : {"q", "k"}) in[n] = HostTensor::zeros(c.dtype, {c.B, c.T, c.H, c.K});
  for (const char* n : {"v", "do"}) in[n] = HostTensor::zeros(c.dtype, {c.B, c.T, c.H, c.V});
  in["g"] = HostTensor::zeros(DType::f32, {c.B, c.T, c.H, c.K});
  OpOptions opts;
  opts.dtype = c.dtype;
  opts.backward = true;
  opts.max_smem_per_block = c.max_smem;
  opts.config = c.config;
  return find_op("gla").prepare(in, opts, {"dq", "dk", "dv", "dg"});
}

const KernelLaunch& launch(const OpPlan& plan, const std::string& name) {
  for (const auto& l : plan.launches)
    if (l.kernel->name == name) return l;
  FAIL("no launch of " << name);
  return plan.launches.front();
}

bool launches(const OpPlan& plan, const std::string& name) {
  for (const auto& l : plan.launches)
    if (l.kernel->name == name) return true;
  return false;
}

}  // namespace

TEST_CASE("gla's backward walks: whole 128-column blocks where they fit, narrowed where the walks are few") {
  // fp32 at K = V = 128 and 128 sequences x heads: one program per head, dk and dv in one walk (227 KB of an
  // H100 block; 64-column blocks before session 19, restating an A100's limit).
  const OpPlan many = backward({});
  CHECK(launch(many, "gla_bwd_dq").grid[0] == 1);
  CHECK(launches(many, "gla_bwd_dkdv"));
  CHECK(fits_gpu(kernels_of(many), on_gpu(kH100Smem)));
  // An A100 block is smaller: 64-column blocks, two walks.
  const OpPlan a100 = backward({.max_smem = kA100Smem});
  CHECK(launch(a100, "gla_bwd_dq").grid[0] == 2);
  CHECK_FALSE(launches(a100, "gla_bwd_dkdv"));
  CHECK(fits_gpu(kernels_of(a100), on_gpu(kA100Smem)));
  // 32 sequences x heads: 64-column blocks (more programs per walk).
  const OpPlan few = backward({.B = 2});
  CHECK(launch(few, "gla_bwd_dq").grid[0] == 2);
  CHECK_FALSE(launches(few, "gla_bwd_dkdv"));
  // 16-bit at K = V = 256 and 32 sequences x heads: 64 columns too.
  CHECK(launch(backward({.dtype = DType::bf16, .B = 2, .K = 256, .V = 256}), "gla_bwd_dq").grid[0] == 4);
}

TEST_CASE("gla's fp32 backward at K = V = 256 fits an A100 with the walks one stage deep") {
  const OpPlan h100 = backward({.K = 256, .V = 256}), a100 = backward({.K = 256, .V = 256, .max_smem = kA100Smem});
  CHECK(fits_gpu(kernels_of(h100), on_gpu(kH100Smem)));
  CHECK(fits_gpu(kernels_of(a100), on_gpu(kA100Smem)));
  CHECK(launch(h100, "gla_bwd_dv").kernel->num_stages == 2);
  CHECK(launch(a100, "gla_bwd_dv").kernel->num_stages == 1);
}

TEST_CASE("gla's split schedule: chunk 32 in fp32, the state passes two stages deep where they fit") {
  const OpPlan split = backward({.B = 2, .T = 2048, .K = 64, .V = 64, .config = {{"split", 1}}});
  CHECK(launch(split, "gla_bwd_intra").grid[0] == 2048 / 32);
  CHECK(launch(split, "gla_bwd_states").kernel->num_stages == 2);
  // 16-bit at K = V = 128 on an A100: every kernel fits (dg's offsets in steps of 32 chunks: summing_rows).
  const OpPlan a100 = backward({.dtype = DType::bf16, .B = 2, .T = 2048, .max_smem = kA100Smem, .config = {{"split", 1}}});
  CHECK(fits_gpu(kernels_of(a100), on_gpu(kA100Smem)));
}

TEST_CASE("gla's backward records a kernel once whatever the options it does not read") {
  // gla_bwd_intra reads neither the walks' producer warps nor where dg is formed: with and without
  // producer warps (16 bits, where the walks take them by default) it is the same recorded kernel, the
  // walks are not.
  const OpPlan with = backward({.dtype = DType::bf16}), without = backward({.dtype = DType::bf16, .config = {{"producer", 0}}});
  CHECK(launch(with, "gla_bwd_intra").kernel == launch(without, "gla_bwd_intra").kernel);
  CHECK(launch(with, "gla_bwd_dq").kernel != launch(without, "gla_bwd_dq").kernel);
  CHECK(launch(with, "gla_bwd_dq").kernel->producer_warps == 4);
}
