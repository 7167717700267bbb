// dot on sm_90a's warpgroup tensor cores (wgmma.mma_async with B in a swizzled shared-memory buffer,
// passes::WgmmaDot): which products the plan puts there (no GPU needed), the PTX they make, and on a
// GPU their results against a float64 product of the same 16-bit inputs, for every operand form the
// lowering distinguishes: B stored [k][n] (MN-major) or [n][k] (K-major, a transpose), A from shared
// memory (stored [m][k] or transposed) or from registers, several 16-row tiles per warp, two
// warpgroups along N, a slice of a wider tile, an accumulator reused as B or as A (read from its own
// registers: smem_plan.h dot_a_in_registers), pipelined loads in a loop (two stages, or three and four
// with the product waited for an iteration late, a loop that runs once or not at all), 64- and 32-byte
// swizzles, f16.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "linac/dsl.h"
#include "linac/runtime.h"
#include "tests/unit/gpu_test_support.h"

using namespace linac;
using namespace linac::dsl;
namespace rt = linac::runtime;

namespace {

struct Case {
  const char* name;
  int64_t M, N, K;
  int warps;
  bool a_t = false;      // A given as [K, M] and used transposed
  bool b_t = false;      // B given as [N, K] and used transposed (K-major)
  int64_t b_col0 = -1;   // B is columns [b_col0, b_col0 + N) of a [K, 2N] tile
  bool b_product = false;  // B is the product X [K, 16] Y [16, N] rounded to 16 bits: an accumulator reused
  int64_t k_blocks = 1;  // > 1: a loop over K in blocks of K (pipelined loads), accumulating
  DType dt = DType::bf16;
  int wgmma_dots = 1;    // how many dots the sm_90a plan puts on wgmma
  bool a_product = false;  // A is the product X [M, 16] Z [16, K] rounded to 16 bits: an accumulator
                           // reused as A, read from its registers (no copy, no ldmatrix)
  int stages = 2;          // the loop's pipeline stages (3 and 4: its product waited for an iteration late)
  int64_t skipped = 0;     // blocks the loop leaves out (its count read at run time: K blocks less these)
};

const Case kCases[] = {
    {"64x64x64 MN-major", 64, 64, 64, 4},
    {"64x64x64 K-major", 64, 64, 64, 4, false, true},
    {"128x128x32 two row tiles per warp", 128, 128, 32, 4},
    {"64x128x64 two warpgroups along N", 64, 128, 64, 8},
    {"64x64x64 two warpgroups along N, K-major", 64, 64, 64, 8, false, true},
    {"128x64x128 A transposed, eight warps", 128, 64, 128, 8, true},
    {"64x64x32 slice of B at column 64", 64, 64, 32, 4, false, false, 64},
    {"64x64x64 accumulator as B", 64, 64, 64, 4, false, false, -1, true, 1, DType::bf16, 2},
    {"64x64x64 loop of 3 blocks", 64, 64, 64, 4, false, false, -1, false, 3},
    {"64x32x16 64-byte swizzle", 64, 32, 16, 4},
    {"64x32x16 32-byte swizzle, K-major", 64, 32, 16, 4, false, true},
    {"64x64x64 f16", 64, 64, 64, 4, false, false, -1, false, 1, DType::f16},
    // Rows of 96 bytes take no swizzle: A from registers (ldmatrix), B from shared memory.
    {"64x64x48 A in registers", 64, 64, 48, 4},
    {"64x64x64 accumulator as A", 64, 64, 64, 4, false, false, -1, false, 1, DType::bf16, 2, true},
    // Products waited for an iteration late (compiler/passes/wgmma_waits.h).
    {"64x64x64 loop of 5 blocks, 3 stages", 64, 64, 64, 4, false, false, -1, false, 5, DType::bf16, 1, false, 3},
    {"64x64x64 loop of 6 blocks, 4 stages", 64, 64, 64, 4, false, false, -1, false, 6, DType::bf16, 1, false, 4},
    {"64x128x64 loop of 4 blocks, two warpgroups along N, 4 stages", 64, 128, 64, 8, false, false, -1, false, 4,
     DType::bf16, 1, false, 4},
    {"64x64x64 loop of 3 blocks, accumulator as A, 3 stages", 64, 64, 64, 4, false, false, -1, false, 3, DType::bf16, 2,
     true, 3},
    {"64x64x64 loop of 3 blocks, K-major, 3 stages, one iteration run", 64, 64, 64, 4, false, true, -1, false, 3,
     DType::bf16, 1, false, 3, 2},
    {"64x64x64 loop of 2 blocks, 3 stages, no iteration run", 64, 64, 64, 4, false, false, -1, false, 2, DType::bf16,
     1, false, 3, 2},
};

/// Whether the case's loop product is waited for an iteration late.
bool deferred(const Case& c) { return c.k_blocks > 1 && c.stages >= 3; }

/// O = A B for the case (f32 out).
std::shared_ptr<ir::Kernel> build(const Case& c) {
  KernelBuilder kb("dot_case");
  kb.set_num_warps(c.warps);
  kb.set_num_stages(c.k_blocks > 1 ? c.stages : 1);
  Tensor a = kb.tensor("a", c.dt, 2), b = kb.tensor("b", c.dt, 2), o = kb.tensor("o", DType::f32, 2);
  Tensor y = c.b_product ? kb.tensor("y", c.dt, 2) : Tensor();
  Tensor z = c.a_product ? kb.tensor("z", c.dt, 2) : Tensor();
  auto a_block = [&](const Tile& k0) {
    if (c.a_product) return dot(load(a, {0, 0}, {c.M, 16}), load(z, {0, k0}, {16, c.K})).to(c.dt);
    return c.a_t ? load(a, {k0, 0}, {c.K, c.M}).T() : load(a, {0, k0}, {c.M, c.K});
  };
  auto b_block = [&](const Tile& k0) {
    if (c.b_t) return load(b, {0, k0}, {c.N, c.K}).T();
    if (c.b_col0 >= 0) return slice(load(b, {k0, 0}, {c.K, 2 * c.N}), 1, c.b_col0, c.N);
    if (c.b_product) return dot(load(b, {k0, 0}, {c.K, 16}), load(y, {0, 0}, {16, c.N})).to(c.dt);
    return load(b, {k0, 0}, {c.K, c.N});
  };
  Tile O;
  if (c.k_blocks == 1) {
    Tile k0 = constant(0, DType::i32);
    O = dot(a_block(k0), b_block(k0));
  } else {
    O = zeros({c.M, c.N}, DType::f32);
    Tile blocks = (c.b_t ? b.dim(1) : b.dim(0)) / c.K - c.skipped;
    for_range(0, blocks, [&](Tile i) { O = O + dot(a_block(i * c.K), b_block(i * c.K)); }, O);
  }
  store(o, {0, 0}, {c.M, c.N}, O);
  return kb.finish();
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

/// 16-bit data of `n` values of a smooth pattern (bits in `bits`, their float values in `vals`).
void make_input(DType dt, int64_t n, double phase, std::vector<uint16_t>* bits, std::vector<float>* vals) {
  std::vector<float> f(n);
  for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(std::sin(phase + 0.731 * static_cast<double>(i)) * 0.5);
  bits->assign(n, 0);
  rt::convert(rt::TensorView::of(f.data(), {n}), rt::TensorView{bits->data(), dt, {n}});
  vals->assign(n, 0.0f);
  rt::convert(rt::TensorView{bits->data(), dt, {n}}, rt::TensorView::of(vals->data(), {n}));
}

}  // namespace

/// Runs `body` with LINAC_WGMMA set to `value` (rt::compile and rt::run read it), then unset.
template <class F>
void with_dots(const char* value, F body) {
  setenv("LINAC_WGMMA", value, 1);
  try {
    body();
  } catch (...) {
    unsetenv("LINAC_WGMMA");
    throw;
  }
  unsetenv("LINAC_WGMMA");
}

TEST_CASE("wgmma: the sm_90a plan puts the products it can hold on warpgroup tensor cores, sm_80 none") {
  for (const Case& c : kCases) {
    const std::string name = c.name;
    CAPTURE(name);
    auto k = build(c);
    rt::Compiled hopper = rt::compile(*k, rt::Arch::sm_90a);
    CHECK(count(hopper.smem_plan, "\nwgmma ") == c.wgmma_dots);
    const int a_in_registers = c.a_product ? 1 : 0;
    CHECK(count(hopper.smem_plan, "A in its registers") == a_in_registers);
    CHECK(count(hopper.smem_plan, "A by ldmatrix") == c.wgmma_dots - a_in_registers);  // the default
    CHECK(count(hopper.ptx, "wgmma.mma_async.sync.aligned") >= c.K / 16);
    CHECK(hopper.ptx.find("fence.proxy.async.shared::cta") != std::string::npos);
    CHECK(hopper.ptx.find("wgmma.wait_group.sync.aligned") != std::string::npos);
    CHECK(count(hopper.smem_plan, "waited for an iteration later") == (deferred(c) ? 1 : 0));
    CHECK(count(hopper.ptx, "wgmma.wait_group.sync.aligned \t1;") == (deferred(c) ? 1 : 0));
    with_dots("a-shared", [&] {
      // A from shared memory wherever its rows take a swizzle: all but the 96-byte rows of K = 48.
      rt::Compiled a_shared = rt::compile(*k, rt::Arch::sm_90a);
      CHECK(count(a_shared.smem_plan, "\nwgmma ") == c.wgmma_dots);
      CHECK(count(a_shared.smem_plan, "A by ldmatrix") == (c.K == 48 ? 1 : 0));
    });
    with_dots("0", [&] { CHECK(count(rt::compile(*k, rt::Arch::sm_90a).ptx, "wgmma.mma_async") == 0); });
    rt::Compiled ampere = rt::compile(*k, rt::Arch::sm_80);
    CHECK(count(ampere.smem_plan, "\nwgmma ") == 0);
    CHECK(count(ampere.ptx, "wgmma.mma_async") == 0);
    CHECK(ampere.ptx.find("mma.sync") != std::string::npos);
    CHECK(count(ampere.smem_plan, "A in its registers") == a_in_registers);
  }
}

TEST_CASE("wgmma: products too small for a warpgroup stay on mma.sync") {
  Case c{"32 rows", 32, 64, 64, 4};
  auto k = build(c);
  CHECK(count(rt::compile(*k, rt::Arch::sm_90a).smem_plan, "\nwgmma ") == 0);
}

TEST_CASE("wgmma: LINAC_WGMMA takes 0, 1 or a-shared") {
  auto k = build(kCases[0]);
  with_dots("2", [&] { CHECK_THROWS_WITH_AS(rt::compile(*k, rt::Arch::sm_90a), doctest::Contains("LINAC_WGMMA=2"), UserError); });
}

namespace {

/// The case on the GPU against a float64 product of the same 16-bit inputs.
void check_on_gpu(const Case& c) {
  const int64_t depth = c.K * c.k_blocks;
  const int64_t b_cols = c.b_col0 >= 0 ? 2 * c.N : c.b_product ? 16 : c.N;
  const int64_t a_cols = c.a_product ? 16 : depth;
  std::vector<uint16_t> a_bits, b_bits, y_bits, z_bits;
  std::vector<float> a_vals, b_vals, y_vals, z_vals;
  make_input(c.dt, c.M * a_cols, 0.1, &a_bits, &a_vals);
  make_input(c.dt, depth * b_cols, 0.7, &b_bits, &b_vals);
  if (c.b_product) make_input(c.dt, 16 * c.N, 1.3, &y_bits, &y_vals);
  if (c.a_product) make_input(c.dt, 16 * depth, 1.9, &z_bits, &z_vals);
  // A product of 16 terms rounded to the 16-bit dtype, as the kernel rounds its accumulators.
  auto rounded = [&](double s) {
    float f = static_cast<float>(s);
    uint16_t h;
    rt::convert(rt::TensorView::of(&f, {1}), rt::TensorView{&h, c.dt, {1}});
    rt::convert(rt::TensorView{&h, c.dt, {1}}, rt::TensorView::of(&f, {1}));
    return static_cast<double>(f);
  };
  // Element (i, kk) of A and (kk, j) of B as the case stores them.
  auto A = [&](int64_t i, int64_t kk) -> double {
    if (c.a_product) {
      double s = 0;
      for (int t = 0; t < 16; ++t) s += static_cast<double>(a_vals[i * 16 + t]) * z_vals[t * depth + kk];
      return rounded(s);
    }
    return c.a_t ? a_vals[kk * c.M + i] : a_vals[i * depth + kk];
  };
  auto B = [&](int64_t kk, int64_t j) -> double {
    if (c.b_t) return b_vals[j * depth + kk];
    if (c.b_col0 >= 0) return b_vals[kk * b_cols + c.b_col0 + j];
    if (c.b_product) {
      double s = 0;
      for (int t = 0; t < 16; ++t) s += static_cast<double>(b_vals[kk * 16 + t]) * y_vals[t * c.N + j];
      return rounded(s);
    }
    return b_vals[kk * c.N + j];
  };
  auto k = build(c);
  std::vector<float> out(c.M * c.N, -1.0f);
  rt::Args args = {{"a", rt::TensorView{a_bits.data(), c.dt, c.a_t ? std::vector<int64_t>{depth, c.M}
                                                                     : std::vector<int64_t>{c.M, a_cols}}},
                   {"b", rt::TensorView{b_bits.data(), c.dt, c.b_t ? std::vector<int64_t>{c.N, depth}
                                                                     : std::vector<int64_t>{depth, b_cols}}},
                   {"o", rt::TensorView::of(out.data(), {c.M, c.N})}};
  if (c.b_product) args["y"] = rt::TensorView{y_bits.data(), c.dt, {16, c.N}};
  if (c.a_product) args["z"] = rt::TensorView{z_bits.data(), c.dt, {16, depth}};
  CHECK(rt::run(*k, rt::Grid{1}, args, rt::Device::gpu) == rt::Device::gpu);
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double want = 0;
      for (int64_t kk = 0; kk < depth - c.skipped * c.K; ++kk) want += A(i, kk) * B(kk, j);
      worst = std::max(worst, std::abs(out[i * c.N + j] - want));
      scale = std::max(scale, std::abs(want));
    }
  // fp32 accumulation of exact 16-bit products: rounding only.
  CHECK(worst <= 1e-5 * std::max(1.0, scale) * static_cast<double>(depth));
}

}  // namespace

TEST_CASE("gpu: wgmma products equal float64 products of the same inputs" * doctest::skip(test::no_gpu())) {
  for (const char* dots : {"1", "a-shared"}) {
    const std::string mode = dots;
    CAPTURE(mode);
    with_dots(dots, [&] {
      for (const Case& c : kCases) {
        const std::string name = c.name;
        CAPTURE(name);
        check_on_gpu(c);
      }
    });
  }
}
