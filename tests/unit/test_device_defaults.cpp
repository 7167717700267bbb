// Defaults read the call's GPU (kernels/common/device_limits.h, fitting.h): its SM count decides how many
// programs fill it, its shared memory which proposal runs; an unknown GPU is the reference one (an H100).
#include <doctest/doctest.h>

#include "compiler/ir/ir.h"
#include "kernels/common/device_limits.h"
#include "kernels/common/fitting.h"
#include "kernels/common/host_tensor.h"
#include "kernels/op.h"

using namespace linac;

namespace {

OpOptions on_gpu(int64_t sms, int64_t max_smem, int sm) {
  OpOptions opts;
  opts.num_sms = sms;
  opts.max_smem_per_block = max_smem;
  opts.sm = sm;
  return opts;
}

/// The walk of linear_attn's gated fp32 forward at head dim 128 on `gpu` (after chunk_gate_sums).
std::shared_ptr<ir::Kernel> gated_fp32_forward(const OpOptions& gpu) {
  TensorMap in;
  for (const char* n : {"q", "k", "v"}) in[n] = HostTensor::zeros(DType::f32, {8, 256, 16, 128});
  in["g"] = HostTensor::zeros(DType::f32, {8, 256, 16});
  OpOptions opts = gpu;
  opts.dtype = DType::f32;
  const OpPlan plan = find_op("linear_attn").prepare(in, opts, {"o"});
  REQUIRE(plan.launches.size() == 2);
  REQUIRE(plan.launches[1].kernel->name == "linear_attn_fwd");
  return plan.launches[1].kernel;
}

}  // namespace

TEST_CASE("few_walks reads the call's SM count, else the reference GPU's 132") {
  const OpOptions unknown, small = on_gpu(16, 0, 0);
  CHECK(few_walks(66, unknown));
  CHECK_FALSE(few_walks(67, unknown));
  CHECK_FALSE(few_walks(9, small));
  CHECK(device_limits(unknown).max_smem_per_block == 232448);
  CHECK(device_limits(unknown).sm == 90);
}

TEST_CASE("a default bounded by shared memory is the first proposal that fits the call's GPU") {
  // linear_attn's gated fp32 forward at head dim 128: chunks of 64 fit neither; 32 fit sm_90, not sm_80.
  const OpOptions sm90 = on_gpu(132, 232448, 90), sm80 = on_gpu(108, 166912, 80);
  const auto on_sm90 = gated_fp32_forward(sm90), on_sm80 = gated_fp32_forward(sm80);
  CHECK(on_sm90 != on_sm80);
  CHECK(planned_smem_bytes(on_sm90, sm90) <= 232448);
  CHECK(planned_smem_bytes(on_sm90, sm80) > 166912);  // what sm_80 would have been given without the planner
  CHECK(planned_smem_bytes(on_sm80, sm80) <= 166912);
  CHECK(gated_fp32_forward(OpOptions{}) == on_sm90);  // no GPU known: the reference GPU's
}

namespace {

/// The value blocks of linear_attn's bf16 forward walk at [B, T, H, D] (its grid's first axis).
int64_t forward_value_blocks(int64_t B, int64_t T, int64_t H, int64_t D, bool gated) {
  TensorMap in;
  for (const char* n : {"q", "k", "v"}) in[n] = HostTensor::zeros(DType::bf16, {B, T, H, D});
  if (gated) in["g"] = HostTensor::zeros(DType::f32, {B, T, H});
  OpOptions opts;
  opts.dtype = DType::bf16;
  const OpPlan plan = find_op("linear_attn").prepare(in, opts, {"o"});
  return plan.launches.back().grid[0];
}

}  // namespace

TEST_CASE("linear_attn's walks take 128 value columns unless 64-column programs all run at once") {
  // 96 walks on the reference GPU's 132 SMs: 192 programs of 64 columns would take two waves.
  CHECK(forward_value_blocks(1, 8192, 96, 128, false) == 1);
  CHECK(forward_value_blocks(1, 8192, 96, 128, true) == 1);
  // 32 walks, too short for segments: 64 programs of 64 columns run at once.
  CHECK(forward_value_blocks(1, 256, 32, 128, false) == 2);
  // Head dim 256: the state [256, 128] fits its registers, gated (updated in place) or not.
  CHECK(forward_value_blocks(8, 2048, 32, 256, false) == 2);
  CHECK(forward_value_blocks(8, 2048, 32, 256, true) == 2);
}
