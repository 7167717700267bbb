// Users' ops (linac/user_op.h): registered in-process, run through ops::run and ops::Call on host
// memory (the interpreter) like the library's; the plan's bindings, tuning parameters and mistakes.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "linac/dsl.h"
#include "linac/ops.h"
#include "linac/user_op.h"

namespace ops = linac::ops;
using linac::DType;
using namespace linac::dsl;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const linac::UserError& e) {
    return e.what();
  }
  return "(no error)";
}

/// dst[i] = src[i] * factor + shift, in blocks of `block` elements (one program each).
std::shared_ptr<linac::ir::Kernel> affine(const std::string& name, int64_t block, DType dt) {
  KernelBuilder kb(name);
  Tensor src = kb.tensor("src", dt, 1);
  Tensor dst = kb.tensor("dst", dt, 1);
  Tile factor = kb.scalar("factor", DType::f32);
  Tile i0 = program_id(0) * block;
  Tile x = load(src, {i0}, {block}).to(DType::f32);
  store(dst, {i0}, {block}, (x * factor + 1.0f).to(dt));
  return kb.finish();
}

/// y = 2 x + 1 then z = 3 y + 1, through a scratch tensor, in blocks of the tuning parameter "block".
ops::UserOp two_step(const std::string& name) {
  ops::UserOp op;
  op.name = name;
  op.summary = "two affine maps through scratch";
  op.inputs = {"x"};
  op.outputs = {"z"};
  op.tuning = {{"block", {32, 16}}};
  op.plan = [](const ops::UserCall& c) {
    const ops::UserTensor& x = c.inputs.at("x");
    const int64_t block = c.config.at("block"), n = x.shape.at(0);
    ops::UserPlan p;
    p.outputs["z"] = x;
    p.scratch["y"] = x;
    const std::array<int64_t, 3> grid = {(n + block - 1) / block, 1, 1};
    p.launches.push_back({affine("first", block, x.dtype), grid, {{"src", "x"}, {"dst", "y"}}, {{"factor", 2.0}}});
    p.launches.push_back({affine("second", block, x.dtype), grid, {{"src", "y"}, {"dst", "z"}}, {{"factor", 3.0}}});
    return p;
  };
  return op;
}

}  // namespace

TEST_CASE("a user op runs through ops::run and ops::Call like the library's ops") {
  ops::register_op(two_step("user_two_step"));
  std::vector<float> x(100), z(100, -7.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.25f - 3.0f;
  const ops::Tensors in = {{"x", ops::Tensor::host(x.data(), DType::f32, {100})}};
  const ops::Tensors out = {{"z", ops::Tensor::host(z.data(), DType::f32, {100})}};
  ops::run("user_two_step", in, out);
  for (size_t i = 0; i < x.size(); ++i) CHECK(z[i] == doctest::Approx(3.0 * (2.0 * x[i] + 1.0) + 1.0));

  // Another block size (a tuning parameter) gives the same result; the prepared call runs on new data.
  std::vector<float> z2(100);
  ops::Options o = ops::Options::parse("block=16");
  ops::run("user_two_step", in, {{"z", ops::Tensor::host(z2.data(), DType::f32, {100})}}, o);
  CHECK(z2 == z);
  const ops::Call call = ops::Call::prepare("user_two_step", in, out);
  std::vector<float> x3(100, 1.0f), z3(100);
  void* ins[] = {x3.data()};
  void* outs[] = {z3.data()};
  call.run(ins, outs);
  CHECK(z3[99] == doctest::Approx(10.0));

  const std::vector<std::string> names = ops::op_names();
  CHECK(std::find(names.begin(), names.end(), "user_two_step") != names.end());
}

TEST_CASE("mistakes in a user op are user errors that name them") {
  CHECK(error_of([] { ops::register_op(two_step("bad name")); }) ==
        "a user op's name must be letters, digits and '_'; got 'bad name'");
  CHECK(error_of([] { ops::register_op(two_step("gla")); }) == "'gla' is the name of one of linac's ops");
  ops::UserOp no_plan = two_step("user_no_plan");
  no_plan.plan = nullptr;
  CHECK(error_of([&] { ops::register_op(no_plan); }) == "user op user_no_plan has no plan");
  ops::UserOp twice = two_step("user_twice");
  twice.outputs = {"x"};
  CHECK(error_of([&] { ops::register_op(twice); }) == "user op user_twice: 'x' is named twice");

  ops::UserOp unbound = two_step("user_unbound");
  unbound.plan = [](const ops::UserCall& c) {
    ops::UserPlan p;
    p.outputs["z"] = c.inputs.at("x");
    p.launches.push_back({affine("first", 32, DType::f32), {1, 1, 1}, {{"dst", "z"}}, {{"factor", 2.0}}});
    return p;
  };
  ops::register_op(unbound);
  std::vector<float> x(8), z(8);
  const ops::Tensors in = {{"x", ops::Tensor::host(x.data(), DType::f32, {8})}};
  const ops::Tensors out = {{"z", ops::Tensor::host(z.data(), DType::f32, {8})}};
  CHECK(error_of([&] { ops::run("user_unbound", in, out); }) ==
        "user_unbound: parameter 'src' of kernel first binds to 'src', which is no input, output or scratch tensor "
        "of the call");

  ops::register_op(two_step("user_options"));
  CHECK(error_of([&] { ops::run("user_options", in, out, ops::Options::parse("chunk=4")); }) ==
        "user_options has no tuning parameter 'chunk' (it has: block)");
  CHECK(error_of([&] { ops::run("user_options", in, out, ops::Options::parse("scale=0.5")); }) ==
        "user_options is a user op: it takes tuning parameters only (its gradients are op 'none')");
  CHECK(error_of([&] { ops::run("user_options", {{"y", in.at("x")}}, out); }) == "user_options has no input 'y' (inputs: x)");
}

TEST_CASE("a user op registered again under its name replaces it for new calls") {
  ops::register_op(two_step("user_again"));
  std::vector<float> x(40, 1.0f), z(40);
  const ops::Tensors in = {{"x", ops::Tensor::host(x.data(), DType::f32, {40})}};
  const ops::Tensors out = {{"z", ops::Tensor::host(z.data(), DType::f32, {40})}};
  const ops::Call before = ops::Call::prepare("user_again", in, out);
  ops::run("user_again", in, out);
  CHECK(z[0] == doctest::Approx(10.0));  // 3 (2 + 1) + 1

  ops::UserOp one_step = two_step("user_again");
  one_step.plan = [](const ops::UserCall& c) {
    ops::UserPlan p;
    p.outputs["z"] = c.inputs.at("x");
    p.launches.push_back({affine("only", 32, DType::f32), {2, 1, 1}, {{"src", "x"}, {"dst", "z"}}, {{"factor", 2.0}}});
    return p;
  };
  ops::register_op(one_step);
  ops::run("user_again", in, out);
  CHECK(z[0] == doctest::Approx(3.0));  // 2 + 1
  void* ins[] = {x.data()};
  void* outs[] = {z.data()};
  before.run(ins, outs);  // prepared for the first registration: runs it
  CHECK(z[0] == doctest::Approx(10.0));
  const std::vector<std::string> names = ops::op_names();
  CHECK(std::count(names.begin(), names.end(), "user_again") == 1);
}
