// A plan may offer more outputs than a call asks for (an op that saves tensors for its backward when
// asked): the rest are scratch. This crashed the interpreter once (the unasked output had no buffer).
#include <doctest/doctest.h>

#include <vector>

#include "kernels/common/op_support.h"
#include "kernels/op.h"
#include "linac/dsl.h"
#include "linac/ops.h"

using namespace linac;
using namespace linac::dsl;

namespace {

std::shared_ptr<ir::Kernel> twice_and_thrice() {
  KernelBuilder kb("twice_and_thrice");
  Tensor src = kb.tensor("src", DType::f32, 1);
  Tensor twice = kb.tensor("twice", DType::f32, 1);
  Tensor thrice = kb.tensor("thrice", DType::f32, 1);
  Tile x = load(src, {0}, {16});
  store(twice, {0}, {16}, x * 2.0f);
  store(thrice, {0}, {16}, x * 3.0f);
  return kb.finish();
}

}  // namespace

TEST_CASE("a plan's output the call did not ask for is scratch") {
  OpDef op;
  op.name = "test_plan_offers_more_outputs";
  op.summary = "twice and thrice the input; the plan always offers both";
  op.inputs = {{"src", true, "[16]", "input"}};
  op.outputs = {{"twice", true, "[16]", "2 src"}, {"thrice", false, "[16]", "3 src"}};
  op.prepare = [](const TensorMap& in, const OpOptions&, const std::vector<std::string>&) {
    OpPlan plan;
    plan.tensors["src"] = in.at("src");
    plan.tensors["twice"] = HostTensor::zeros(DType::f32, {16});
    plan.tensors["thrice"] = HostTensor::zeros(DType::f32, {16});
    plan.outputs = {{"twice", "twice"}, {"thrice", "thrice"}};  // both, whatever was wanted
    plan.launches.push_back(plan_launch(plan, twice_and_thrice(), {1, 1, 1}, {}));
    return plan;
  };
  add_op(op);
  std::vector<float> src(16), twice(16, -1.0f);
  for (int i = 0; i < 16; ++i) src[i] = static_cast<float>(i);
  ops::run(op.name, {{"src", ops::Tensor::host(src.data(), DType::f32, {16})}},
           {{"twice", ops::Tensor::host(twice.data(), DType::f32, {16})}});
  for (int i = 0; i < 16; ++i) CHECK(twice[i] == 2.0f * static_cast<float>(i));
}
