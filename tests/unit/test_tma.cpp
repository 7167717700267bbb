// The TMA ring (compiler/passes/pipeline.h TmaLoad, compiler/nvptx/lower_tma.cpp): which loads the
// sm_90a plan copies by TMA, and on a GPU a sum over a loop of 64-row tiles against the CPU for every
// path a tile can take: TMA (rows past the tensor's end zero-filled by the map), the threads' copy
// where a limit short of the tensor's end cuts the box (packed sequences), and the threads' copy of
// every tile where the driver cannot describe the tensor (rows of 136 bytes: not a multiple of 16), with
// two and three stages.
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

constexpr int64_t kRows = 64, kCols = 64;

/// o[r, c] = sum over chunks i of x[i * 64 + r, c] for rows below `limit` (the tile's rows past it read
/// as zeros).
std::shared_ptr<ir::Kernel> build(int stages) {
  KernelBuilder kb("tma_sum");
  kb.set_num_warps(4);
  kb.set_num_stages(stages);
  Tensor x = kb.tensor("x", DType::bf16, 2), o = kb.tensor("o", DType::f32, 2);
  Tile limit = kb.scalar("limit", DType::i32);
  Tile chunks = (x.dim(0) + (kRows - 1)) / kRows;
  Tile sum = zeros({kRows, kCols}, DType::f32);
  for_range(0, chunks, [&](Tile i) {
    sum = sum + load(x, {i * kRows, 0}, {kRows, kCols}, AccessOptions{.limits = {{0, limit}}}).to(DType::f32);
  }, sum);
  store(o, {0, 0}, {kRows, kCols}, sum);
  return kb.finish();
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("tma: the sm_90a plan copies a loop's 64-row box by TMA; sm_80 and LINAC_TMA=0 by cp.async") {
  auto k = build(2);
  rt::Compiled hopper = rt::compile(*k, rt::Arch::sm_90a);
  CHECK(count(hopper.smem_plan, "by TMA (1 x box [64, 64] of map 0)") == 1);
  CHECK(count(hopper.smem_plan, "tensor map 0: %x box [64, 64] swizzle=128B") == 1);
  CHECK(count(hopper.ptx, "cp.async.bulk.tensor.2d") == 2);  // before the loop and in it
  CHECK(count(hopper.ptx, "mbarrier.try_wait.parity") == 1);
  CHECK(count(rt::compile(*k, rt::Arch::sm_80).ptx, "cp.async.bulk") == 0);
  setenv("LINAC_TMA", "0", 1);
  const std::string off = rt::compile(*k, rt::Arch::sm_90a).smem_plan;
  unsetenv("LINAC_TMA");
  CHECK(count(off, "TMA") == 0);
}

TEST_CASE("gpu: TMA ring sums equal the CPU's on every path a tile takes" * doctest::skip(test::no_gpu())) {
  struct Shape {
    const char* what;
    int64_t rows, cols, limit;
  };
  const Shape shapes[] = {
      {"TMA, the last chunk past the end", 200, 64, 200},
      {"TMA with a limit cutting chunk 1 (the threads copy it)", 256, 64, 100},
      {"rows of 136 bytes: no map, the threads copy every tile", 200, 68, 200},
  };
  for (int stages : {2, 3}) {
    auto k = build(stages);
    for (const Shape& s : shapes) {
      const std::string what = s.what;
      CAPTURE(what);
      CAPTURE(stages);
      std::vector<float> f(s.rows * s.cols);
      for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
      std::vector<uint16_t> bits(f.size());
      const int64_t n = static_cast<int64_t>(f.size());
      rt::convert(rt::TensorView::of(f.data(), {n}), rt::TensorView{bits.data(), DType::bf16, {n}});
      rt::convert(rt::TensorView{bits.data(), DType::bf16, {n}}, rt::TensorView::of(f.data(), {n}));
      std::vector<float> out(kRows * kCols, -1.0f);
      rt::Args args = {{"x", rt::TensorView{bits.data(), DType::bf16, {s.rows, s.cols}}},
                       {"o", rt::TensorView::of(out.data(), {kRows, kCols})},
                       {"limit", static_cast<double>(s.limit)}};
      CHECK(rt::run(*k, rt::Grid{1}, args, rt::Device::gpu) == rt::Device::gpu);
      double worst = 0;
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kCols; ++c) {
          double want = 0;
          for (int64_t t = r; t < std::min(s.rows, s.limit); t += kRows) want += f[t * s.cols + c];
          worst = std::max(worst, std::abs(out[r * kCols + c] - want));
        }
      CHECK(worst <= 1e-5);
    }
  }
}
