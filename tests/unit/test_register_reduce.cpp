// Reductions of 2-D tiles along either axis in registers (passes::register_reduction): each thread folds
// its elements of a kept coordinate, the lanes along the reduced axis fold with shuffles, the warps along
// it through per-warp partials in scratch. One kernel with every form: an mma accumulator's row sums,
// column sums and row maxima (4 warps: warps along both axes), a blocked tile's column sums (two passes
// and four warps per column) and an outer product computed at the reduction, 64 elements a thread (no
// buffer of it). Checked on the interpreter, in the backend's stages for both targets, and on a GPU,
// against float64.
#include <doctest/doctest.h>
#include <fmt/format.h>

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

constexpr int64_t M = 32, N = 64, KD = 16, R = 16, C = 64, P = 128;

std::shared_ptr<ir::Kernel> reductions() {
  KernelBuilder kb("register_reductions");
  kb.set_num_warps(4);
  Tensor a = kb.tensor("a", DType::bf16, 2), b = kb.tensor("b", DType::bf16, 2);
  Tensor x = kb.tensor("x", DType::f32, 2), u = kb.tensor("u", DType::f32, 1), w = kb.tensor("w", DType::f32, 1);
  Tensor rows = kb.tensor("rows", DType::f32, 1), cols = kb.tensor("cols", DType::f32, 1);
  Tensor maxes = kb.tensor("maxes", DType::f32, 1), xcols = kb.tensor("xcols", DType::f32, 1);
  Tensor outer = kb.tensor("outer", DType::f32, 1);
  Tile acc = dot(load(a, {0, 0}, {M, KD}), load(b, {0, 0}, {KD, N}));  // [M, N] in the mma layout
  store(rows, {0}, {M}, sum(acc, 1));
  store(cols, {0}, {N}, sum(acc, 0));
  store(maxes, {0}, {M}, max(acc, 1));
  store(xcols, {0}, {C}, sum(exp(load(x, {0, 0}, {R, C})), 0));
  Tile U = load(u, {0}, {P}), W = load(w, {0}, {P});
  store(outer, {0}, {P}, sum(expand_dims(U, 1) * expand_dims(W, 0), 1));
  return kb.finish();
}

/// bf16-exact inputs (small multiples of 1/8), so that the float64 reference sees what the kernel sees.
float value(int64_t i, int64_t salt) { return static_cast<float>(((i * 7 + salt * 13) % 17) - 8) / 8.0f; }

uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);  // exact: every value has at most 8 significant bits
}

double worst_error(rt::Device device) {
  std::vector<float> af(M * KD), bf(KD * N), x(R * C), u(P), w(P);
  for (int64_t i = 0; i < M * KD; ++i) af[i] = value(i, 1);
  for (int64_t i = 0; i < KD * N; ++i) bf[i] = value(i, 2);
  for (int64_t i = 0; i < R * C; ++i) x[i] = value(i, 3);
  for (int64_t i = 0; i < P; ++i) u[i] = value(i, 4), w[i] = value(i, 5);
  std::vector<uint16_t> a16(M * KD), b16(KD * N);
  std::transform(af.begin(), af.end(), a16.begin(), to_bf16);
  std::transform(bf.begin(), bf.end(), b16.begin(), to_bf16);
  std::vector<float> rows(M, -7), cols(N, -7), maxes(M, -7), xcols(C, -7), outer(P, -7);
  auto kernel = reductions();
  CHECK(rt::run(*kernel, rt::Grid{1},
                {{"a", rt::TensorView{a16.data(), DType::bf16, {M, KD}}},
                 {"b", rt::TensorView{b16.data(), DType::bf16, {KD, N}}},
                 {"x", rt::TensorView::of(x.data(), {R, C})},
                 {"u", rt::TensorView::of(u.data(), {P})},
                 {"w", rt::TensorView::of(w.data(), {P})},
                 {"rows", rt::TensorView::of(rows.data(), {M})},
                 {"cols", rt::TensorView::of(cols.data(), {N})},
                 {"maxes", rt::TensorView::of(maxes.data(), {M})},
                 {"xcols", rt::TensorView::of(xcols.data(), {C})},
                 {"outer", rt::TensorView::of(outer.data(), {P})}},
                device) == device);
  auto prod = [&](int64_t r, int64_t c) {
    double s = 0;
    for (int64_t k = 0; k < KD; ++k) s += static_cast<double>(af[r * KD + k]) * bf[k * N + c];
    return s;
  };
  double worst = 0;
  auto err = [&](double got, double want) { worst = std::max(worst, std::abs(got - want) / (1 + std::abs(want))); };
  for (int64_t r = 0; r < M; ++r) {
    double s = 0, m = -INFINITY;
    for (int64_t c = 0; c < N; ++c) s += prod(r, c), m = std::max(m, prod(r, c));
    err(rows[r], s);
    err(maxes[r], m);
  }
  for (int64_t c = 0; c < N; ++c) {
    double s = 0;
    for (int64_t r = 0; r < M; ++r) s += prod(r, c);
    err(cols[c], s);
  }
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int64_t r = 0; r < R; ++r) s += std::exp(static_cast<double>(x[r * C + c]));
    err(xcols[c], s);
  }
  for (int64_t i = 0; i < P; ++i) {
    double s = 0;
    for (int64_t j = 0; j < P; ++j) s += static_cast<double>(u[i]) * w[j];
    err(outer[i], s);
  }
  return worst;
}

/// Whether the shared-memory plan has a buffer of `type` (its "smem" lines; `register load` lines name
/// loads without one).
bool has_buffer(const std::string& plan, const std::string& type) {
  size_t at = 0;
  while ((at = plan.find(type, at)) != std::string::npos) {
    const size_t line = plan.rfind('\n', at);
    if (plan.compare(line == std::string::npos ? 0 : line + 1, 5, "smem ") == 0) return true;
    at += type.size();
  }
  return false;
}

}  // namespace

TEST_CASE("register reductions: every form on the interpreter") { CHECK(worst_error(rt::Device::cpu) < 1e-5); }

TEST_CASE("register reductions: no operand goes through shared memory, lanes fold with shuffles") {
  auto kernel = reductions();
  for (rt::Arch arch : {rt::Arch::sm_80, rt::Arch::sm_90a}) {
    CAPTURE(static_cast<int>(arch));
    rt::Compiled c = rt::compile(*kernel, arch);
    // The dot's accumulator, the exp'd tile and the outer product: none has a buffer (the loads of the
    // dot's operands do, for ldmatrix).
    CHECK_FALSE(has_buffer(c.smem_plan, "tile<32x64xf32>"));
    CHECK_FALSE(has_buffer(c.smem_plan, "tile<16x64xf32>"));
    CHECK_FALSE(has_buffer(c.smem_plan, "tile<128x128xf32>"));
    // shfl.sync.bfly: mma rows, lanes 1 and 2 apart (columns 2 (l % 4)); columns, 4, 8 and 16 apart
    // (rows l / 4); the blocked column sums 16 apart (16 lanes a row).
    for (int off : {1, 2, 4, 8, 16}) {
      CAPTURE(off);
      CHECK(c.ptx.find(fmt::format(", {}, 31, -1;", off)) != std::string::npos);
    }
    CHECK(c.ptx.find("max.f32") != std::string::npos);
    if (c.spill_store_bytes) CHECK(*c.spill_store_bytes == 0);
  }
}

TEST_CASE("gpu: register reductions, every form" * doctest::skip(test::no_gpu())) {
  CHECK(worst_error(rt::Device::gpu) < 1e-5);
}
