// Dots split along K among the warps that would hold copies of their result (passes::dot_split_k): a
// 16 x 16 result on 8 warps is two warps' 16 x 8 tiles, and the other six hold copies; each copy takes a
// slice of K and the partials meet through scratch. One kernel, 8 warps: a 16-bit product over K = 256
// (four slices of four 16-deep steps), the same in fp32 as tf32x3 (four slices of eight 8-deep steps),
// an accumulated one over K = 128 (`acc + dot` in a loop, two slices: the sum starts from acc in slice 0
// only), and
// one over K = 64 left whole (four steps: halves would be shorter than kMinSplitSteps). Checked on the
// interpreter, in the plan and PTX for both targets, and on a GPU, against float64.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "linac/dsl.h"
#include "linac/runtime.h"
#include "tests/unit/gpu_test_support.h"

using namespace linac;
using namespace linac::dsl;
namespace rt = linac::runtime;

namespace {

constexpr int64_t M = 16, N = 16, KL = 256, KA = 128, KS = 64;

std::shared_ptr<ir::Kernel> split_dots() {
  KernelBuilder kb("split_dots");
  kb.set_num_warps(8);
  kb.set_tensor_core_f32(true);
  Tensor a = kb.tensor("a", DType::bf16, 2), b = kb.tensor("b", DType::bf16, 2);
  Tensor af = kb.tensor("af", DType::f32, 2), bf = kb.tensor("bf", DType::f32, 2), c = kb.tensor("c", DType::f32, 2);
  Tensor long16 = kb.tensor("long16", DType::f32, 2), long32 = kb.tensor("long32", DType::f32, 2);
  Tensor accumulated = kb.tensor("accumulated", DType::f32, 2), short16 = kb.tensor("short16", DType::f32, 2);
  Tile A = load(a, {0, 0}, {M, KL}), B = load(b, {0, 0}, {KL, N});
  store(long16, {0, 0}, {M, N}, dot(A, B));
  store(long32, {0, 0}, {M, N}, dot(load(af, {0, 0}, {M, KL}), load(bf, {0, 0}, {KL, N})));
  // Carried by a loop, the accumulator takes the dot's layout, and the dot adds to it in place.
  Tile acc = load(c, {0, 0}, {M, N});
  for_range(0, 2, [&](Tile) { acc = acc + dot(slice(A, 1, 0, KA), slice(B, 0, 0, KA)); }, acc);
  store(accumulated, {0, 0}, {M, N}, acc);
  store(short16, {0, 0}, {M, N}, dot(slice(A, 1, 0, KS), slice(B, 0, 0, KS)));
  return kb.finish();
}

/// bf16-exact inputs (small multiples of 1/8): every product and sum is exact in fp32.
float value(int64_t i, int64_t salt) { return static_cast<float>(((i * 7 + salt * 13) % 17) - 8) / 8.0f; }

uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

double worst_error(rt::Device device) {
  std::vector<float> av(M * KL), bv(KL * N), cv(M * N);
  for (int64_t i = 0; i < M * KL; ++i) av[i] = value(i, 1);
  for (int64_t i = 0; i < KL * N; ++i) bv[i] = value(i, 2);
  for (int64_t i = 0; i < M * N; ++i) cv[i] = value(i, 3) * 100;
  std::vector<uint16_t> a16(av.size()), b16(bv.size());
  std::transform(av.begin(), av.end(), a16.begin(), to_bf16);
  std::transform(bv.begin(), bv.end(), b16.begin(), to_bf16);
  std::vector<float> long16(M * N, -7), long32(M * N, -7), accumulated(M * N, -7), short16(M * N, -7);
  auto kernel = split_dots();
  CHECK(rt::run(*kernel, rt::Grid{1},
                {{"a", rt::TensorView{a16.data(), DType::bf16, {M, KL}}},
                 {"b", rt::TensorView{b16.data(), DType::bf16, {KL, N}}},
                 {"af", rt::TensorView::of(av.data(), {M, KL})},
                 {"bf", rt::TensorView::of(bv.data(), {KL, N})},
                 {"c", rt::TensorView::of(cv.data(), {M, N})},
                 {"long16", rt::TensorView::of(long16.data(), {M, N})},
                 {"long32", rt::TensorView::of(long32.data(), {M, N})},
                 {"accumulated", rt::TensorView::of(accumulated.data(), {M, N})},
                 {"short16", rt::TensorView::of(short16.data(), {M, N})}},
                device) == device);
  auto prod = [&](int64_t r, int64_t col, int64_t depth) {
    double s = 0;
    for (int64_t k = 0; k < depth; ++k) s += static_cast<double>(av[r * KL + k]) * bv[k * N + col];
    return s;
  };
  double worst = 0;
  auto err = [&](double got, double want) { worst = std::max(worst, std::abs(got - want) / (1 + std::abs(want))); };
  for (int64_t r = 0; r < M; ++r)
    for (int64_t col = 0; col < N; ++col) {
      err(long16[r * N + col], prod(r, col, KL));
      err(long32[r * N + col], prod(r, col, KL));
      err(accumulated[r * N + col], cv[r * N + col] + 2 * prod(r, col, KA));
      err(short16[r * N + col], prod(r, col, KS));
    }
  return worst;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("split dots: the interpreter computes each product whole") { CHECK(worst_error(rt::Device::cpu) < 1e-6); }

TEST_CASE("split dots: the plan splits the long products, the PTX runs each copy's slice") {
  auto kernel = split_dots();
  for (rt::Arch arch : {rt::Arch::sm_80, rt::Arch::sm_90a}) {
    CAPTURE(static_cast<int>(arch));
    rt::Compiled c = rt::compile(*kernel, arch);
    CHECK(count(c.smem_plan, "K in 4 slices over its copies' warps") == 2);
    CHECK(count(c.smem_plan, "K in 2 slices over its copies' warps") == 1);
    CHECK(count(c.smem_plan, " slices over its copies' warps") == 3);
    CHECK(count(c.layouts, "(accumulates)") == 1);  // c + dot: c is where its accumulators start
    // 16-bit steps per warp: 4 of the long product's 16 (its slice), 4 of the accumulated one's 8 in
    // each of the loop's two iterations (unrolled), and all 4 of the short one's; the tf32x3 loop's
    // body has its three products once.
    CHECK(count(c.ptx, "mma.sync.aligned.m16n8k16") == 16);
    CHECK(count(c.ptx, "mma.sync.aligned.m16n8k8") == 3);
    if (c.spill_store_bytes) CHECK(*c.spill_store_bytes == 0);
  }
}

TEST_CASE("gpu: split dots sum their slices" * doctest::skip(test::no_gpu())) { CHECK(worst_error(rt::Device::gpu) < 1e-6); }
