// linac/runtime.h's helpers for checking a kernel against a reference: round_to, random_uniform,
// HostArray and max_relative_error.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "linac/dsl.h"
#include "linac/runtime.h"

using namespace linac;
namespace rt = linac::runtime;

TEST_CASE("round_to: bf16 and f16 round to nearest even, f32 keeps the floats") {
  const float one = 1.0f;
  std::vector<float> x = {one + 0x1p-10f, one + 0x1p-7f, one + 3 * 0x1p-9f, -2.5f};
  std::vector<float> b = x, h = x, f = x;
  rt::round_to(b, DType::bf16);  // 8 significant bits
  CHECK(b == std::vector<float>{1.0f, one + 0x1p-7f, one + 0x1p-7f, -2.5f});  // 1 + 3/512: a tie, to even
  rt::round_to(h, DType::f16);   // 11 significant bits: all four exact
  CHECK(h == x);
  rt::round_to(f, DType::f32);
  CHECK(f == x);
  CHECK_THROWS_AS(rt::round_to(f, DType::i32), UserError);
}

TEST_CASE("random_uniform: a fixed stream per seed, in [lo, hi)") {
  const std::vector<float> a = rt::random_uniform(1000, 7), b = rt::random_uniform(1000, 7);
  CHECK(a == b);
  CHECK(rt::random_uniform(1000, 8) != a);
  double mean = 0;
  for (float v : a) {
    CHECK(v >= -1.0f);
    CHECK(v < 1.0f);
    mean += v / 1000.0;
  }
  CHECK(std::abs(mean) < 0.1);
  // The stream is part of the contract (a failure seen once reruns anywhere): its first values pinned
  // (SplitMix64 from state 0: 0xe220a8397b1dcdaf, ...).
  const std::vector<float> first = rt::random_uniform(3, 0, 0.0f, 1.0f);
  CHECK(first == std::vector<float>{0x1.c4415p-1f, 0x1.b9e27ap-2f, 0x1.b11746p-6f});
  for (float v : rt::random_uniform(200, 3, 2.0f, 2.0f + 0x1p-20f)) CHECK((v >= 2.0f && v < 2.0f + 0x1p-20f));
  CHECK_THROWS_AS(rt::random_uniform(3, 0, 1.0f, 1.0f), UserError);
}

TEST_CASE("HostArray: inputs rounded in place, outputs poisoned, read back as floats") {
  std::vector<float> x = rt::random_uniform(6, 1);
  const std::vector<float> original = x;
  rt::HostArray a(x, DType::bf16, {2, 3});
  CHECK(a.view().dtype == DType::bf16);
  CHECK(a.view().shape == std::vector<int64_t>{2, 3});
  std::vector<float> rounded = original;
  rt::round_to(rounded, DType::bf16);
  CHECK(x == rounded);  // the reference sees what the kernel reads
  CHECK(x != original);
  CHECK(a.to_floats() == x);
  CHECK_THROWS_AS(rt::HostArray(x, DType::bf16, {4, 3}), UserError);

  rt::HostArray o(DType::f16, {5});
  for (float v : o.to_floats()) CHECK(std::isnan(v));
  rt::HostArray moved = std::move(a);  // the view follows the bytes
  CHECK(moved.to_floats() == x);
}

TEST_CASE("HostArray and max_relative_error check a bf16 kernel on the interpreter") {
  using namespace linac::dsl;
  KernelBuilder kb("twice");
  Tensor x = kb.tensor("x", DType::bf16, 1), o = kb.tensor("o", DType::bf16, 1);
  store(o, {0}, {64}, load(x, {0}, {64}) * 2.0f);
  auto kernel = kb.finish();
  std::vector<float> xf = rt::random_uniform(50, 11);
  rt::HostArray xa(xf, DType::bf16, {50}), oa(DType::bf16, {50});
  rt::run(*kernel, rt::Grid{1}, {{"x", xa.view()}, {"o", oa.view()}}, rt::Device::cpu);
  std::vector<double> ref(50);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = 2.0 * xf[i];
  CHECK(rt::max_relative_error(oa.to_floats(), ref) == 0.0);  // x2 is exact on the rounded inputs
  oa.poison();
  CHECK(std::isinf(rt::max_relative_error(oa.to_floats(), ref)));  // NaN: infinitely wrong
  CHECK(rt::max_relative_error({1.0f, 2.5f}, {1.0, 2.0}) == doctest::Approx(0.25));
  CHECK_THROWS_AS(rt::max_relative_error({1.0f}, {1.0, 2.0}), UserError);
}
