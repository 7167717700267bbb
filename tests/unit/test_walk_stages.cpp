// The forward walks of gla and the delta rules take their pipeline stages from the fitting mechanism
// (kernels/common/fitting.h): two where the walk's two-stage plan fits a block of the call's GPU, one
// on a GPU whose blocks hold the one-stage plan only; fp32 delta-rule walks at K > 64 propose one stage
// only (measured faster: docs/ops/delta_rule.md, "Measured"); --config stages=N is taken as given.
#include <doctest/doctest.h>

#include <string>

#include "compiler/ir/ir.h"
#include "kernels/common/fitting.h"
#include "kernels/common/host_tensor.h"
#include "kernels/op.h"
#include "tests/unit/defaults_test_support.h"

using namespace linac;

namespace {

OpOptions options(DType dtype, int64_t max_smem, const std::string& config = "") {
  OpOptions opts = test::on_gpu(max_smem, dtype);
  if (!config.empty()) opts.config = parse_config(config);
  return opts;
}

/// The forward's walk kernel (the launch with "_fwd" in its name) of `op` at head dims K = V = d.
std::shared_ptr<ir::Kernel> walk(const std::string& op, int64_t d, const OpOptions& opts) {
  TensorMap in;
  for (const char* n : {"q", "k", "v"}) in[n] = HostTensor::zeros(DType::bf16, {1, 256, 2, d});
  if (op == "gla") in["g"] = HostTensor::zeros(DType::f32, {1, 256, 2, d});
  if (op != "gla") in["beta"] = HostTensor::zeros(DType::f32, {1, 256, 2});
  if (op == "gated_delta_rule") in["g"] = HostTensor::zeros(DType::f32, {1, 256, 2});
  const OpPlan plan = find_op(op).prepare(in, opts, {"o"});
  for (const auto& l : plan.launches)
    if (l.kernel->name.find("_fwd") != std::string::npos) return l.kernel;
  FAIL("no walk in the plan of ", op);
  return nullptr;
}

}  // namespace

TEST_CASE("gla's and the delta rules' walks take two stages where they fit the GPU's blocks") {
  const int64_t h100 = test::kH100Smem;
  struct Case {
    std::string op;
    int64_t d;
    DType dtype;
    std::string config;  // held fixed: gla halves its chunk first where gla_chunk does not fit the block
  };
  for (const Case& c : {Case{"gla", 128, DType::f32, ""}, Case{"gla", 256, DType::bf16, "chunk=64"},
                        Case{"delta_rule", 256, DType::bf16, ""}, Case{"gated_delta_rule", 256, DType::bf16, ""},
                        Case{"delta_rule", 64, DType::f32, ""}}) {
    CAPTURE(c.op);
    CAPTURE(c.d);
    auto with = [&](const std::string& more) { return c.config.empty() ? more : more.empty() ? c.config : c.config + "," + more; };
    const auto two = walk(c.op, c.d, options(c.dtype, h100, with("")));
    CHECK(two->num_stages == 2);
    CHECK(walk(c.op, c.d, options(c.dtype, 0, with("")))->num_stages == 2);  // no GPU known: the reference H100's
    CHECK(walk(c.op, c.d, options(c.dtype, planned_smem_bytes(two, options(c.dtype, h100)), with("")))->num_stages == 2);
    // A block that holds the one-stage walk alone: one stage (unless asked for two).
    const auto one = walk(c.op, c.d, options(c.dtype, h100, with("stages=1")));
    const int64_t one_bytes = planned_smem_bytes(one, options(c.dtype, h100));
    CHECK(one_bytes < planned_smem_bytes(two, options(c.dtype, h100)));
    CHECK(walk(c.op, c.d, options(c.dtype, one_bytes, with("")))->num_stages == 1);
    CHECK(walk(c.op, c.d, options(c.dtype, one_bytes, with("stages=2")))->num_stages == 2);
  }
  // fp32 delta-rule walks above head dim 64 propose one stage, though two fit an H100's block.
  for (const char* op : {"delta_rule", "gated_delta_rule"}) {
    CAPTURE(op);
    CHECK(walk(op, 128, options(DType::f32, h100))->num_stages == 1);
  }
}
