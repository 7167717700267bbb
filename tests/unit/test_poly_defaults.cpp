// poly's pipeline stages are the fitting mechanism's (kernels/common/fitting.h): each kernel takes the
// first of its proposals (3, 2, 1 for the outputs and the scans at K <= 64; else 2, 1) whose plan fits a
// block of the call's GPU. The backward's per-chunk kernels at chunks of 128 take two stages where their
// two-stage plan fits (H100 and H200, A100 too since their plan is 145 KB) and one on a GPU whose blocks
// are smaller than that plan; with no GPU known, the reference GPU's answer (an H100's).
#include <doctest/doctest.h>

#include <string>

#include "compiler/ir/ir.h"
#include "compiler/ir/printer.h"
#include "kernels/common/fitting.h"
#include "kernels/common/host_tensor.h"
#include "kernels/op.h"
#include "tests/unit/defaults_test_support.h"

using namespace linac;

namespace {

OpOptions backward_options(int64_t max_smem, const std::string& config = "") {
  OpOptions opts;
  if (!config.empty()) opts.config = parse_config(config);
  opts.dtype = DType::bf16;
  opts.backward = true;
  opts.max_smem_per_block = max_smem;
  return opts;
}

OpPlan backward_plan(int64_t max_smem, const std::string& config = "") {
  TensorMap in;
  for (const char* n : {"q", "k", "v", "do"}) in[n] = HostTensor::zeros(DType::bf16, {1, 512, 2, 64});
  return find_op("poly").prepare(in, backward_options(max_smem, config), {"dq", "dk", "dv"});
}

std::shared_ptr<ir::Kernel> kernel_of(const OpPlan& plan, const std::string& name) {
  for (const auto& l : plan.launches)
    if (l.kernel->name == name) return l.kernel;
  FAIL("no launch of ", name);
  return nullptr;
}

}  // namespace

TEST_CASE("poly's stages are the first proposal whose plan fits the GPU's blocks") {
  const int64_t h100 = test::kH100Smem, a100 = test::kA100Smem;
  for (const char* k : {"poly_bwd_dq", "poly_bwd_dkv", "poly_bwd_prepare"}) {
    CAPTURE(k);
    const auto two = kernel_of(backward_plan(h100), k);
    CHECK(two->num_stages == 2);
    CHECK(kernel_of(backward_plan(0), k)->num_stages == 2);     // no GPU known: the reference H100's
    CHECK(kernel_of(backward_plan(a100), k)->num_stages == 2);  // the two-stage plan fits an A100's block
    // A block one byte smaller than the two-stage plan: one stage.
    const int64_t bytes = planned_smem_bytes(two, backward_options(h100));
    CHECK(bytes <= a100);
    CHECK(kernel_of(backward_plan(bytes - 1), k)->num_stages == 1);
  }
  // The scans take the slack stage (three), the sums two, wherever they fit.
  CHECK(kernel_of(backward_plan(0), "poly_bwd_scan")->num_stages == 3);
  CHECK(kernel_of(backward_plan(0), "poly_bwd_sums")->num_stages == 2);
}

namespace {

OpPlan forward_plan(const std::string& config = "") {
  TensorMap in;
  for (const char* n : {"q", "k", "v"}) in[n] = HostTensor::zeros(DType::bf16, {1, 512, 2, 64});
  OpOptions opts;
  opts.dtype = DType::bf16;
  if (!config.empty()) opts.config = parse_config(config);
  return find_op("poly").prepare(in, opts, {"o"});
}

}  // namespace

TEST_CASE("poly's chunk order and blocks per SM: configuration keys with per-kernel defaults") {
  // The outputs at three blocks of 4 warps per SM in 16 bits, their chunks longest first; the backward's
  // first step (the same builder) in grid order at one block; --config sets them for every kernel.
  const auto out = kernel_of(forward_plan(), "poly_fwd_out");
  CHECK(out->min_ctas_per_sm == 3);
  CHECK(kernel_of(forward_plan(), "poly_fwd_sums")->min_ctas_per_sm == 1);
  CHECK(kernel_of(backward_plan(0), "poly_bwd_prepare")->min_ctas_per_sm == 1);
  // At 8 warps the default follows the warps (three blocks of 256 threads would leave 85 registers).
  CHECK(kernel_of(forward_plan("warps=8"), "poly_fwd_out")->min_ctas_per_sm == 1);
  CHECK(kernel_of(forward_plan("ctas=2"), "poly_fwd_out")->min_ctas_per_sm == 2);
  // The order shows in the kernels: longest first maps the program id through the chunks per segment.
  const auto text = [](const std::shared_ptr<ir::Kernel>& k) { return ir::print(*k); };
  CHECK(text(out) != text(kernel_of(forward_plan("order=0"), "poly_fwd_out")));
  const auto prepare = text(kernel_of(backward_plan(0), "poly_bwd_prepare"));
  CHECK(prepare == text(kernel_of(backward_plan(0, "order=0"), "poly_bwd_prepare")));
  CHECK(prepare != text(kernel_of(backward_plan(0, "order=1"), "poly_bwd_prepare")));
}
