// Rank-3 tiles fused into the reductions that consume them (passes::fused_rank3_values): the decayed
// scores of Kimi Delta Attention, A[r, c] = sum_d Q[r, d] K[c, d] exp(G[r, d] - G[c, d]) for r >= c,
// written as a broadcast product summed over its third axis, on the interpreter, in the GPU backend's
// stages, and on a GPU, against float64; and the rank-3 tiles the backend still cannot hold, rejected
// at their DSL line.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "linac/dsl.h"
#include "linac/error.h"
#include "linac/runtime.h"
#include "tests/unit/gpu_test_support.h"

using namespace linac;
using namespace linac::dsl;
namespace rt = linac::runtime;

namespace {

constexpr int64_t BT = 16, D = 32;

std::shared_ptr<ir::Kernel> decayed_scores() {
  KernelBuilder kb("decayed_scores");
  Tensor q = kb.tensor("q", DType::f32, 2), k = kb.tensor("k", DType::f32, 2), g = kb.tensor("g", DType::f32, 2);
  Tensor a = kb.tensor("a", DType::f32, 2);
  Tile Q = load(q, {0, 0}, {BT, D}), K = load(k, {0, 0}, {BT, D}), G = load(g, {0, 0}, {BT, D});
  Tile terms = expand_dims(Q, 1) * expand_dims(K, 0) * exp(expand_dims(G, 1) - expand_dims(G, 0));  // [BT, BT, D]
  Tile causal = expand_dims(iota(BT), 1) >= expand_dims(iota(BT), 0);
  store(a, {0, 0}, {BT, BT}, where(causal, sum(terms, 2), 0.0f));
  return kb.finish();
}

struct Inputs {
  std::vector<float> q, k, g;
  Inputs() : q(BT * D), k(BT * D), g(BT * D) {
    for (int64_t i = 0; i < BT * D; ++i) {
      q[i] = static_cast<float>(std::sin(0.3 * static_cast<double>(i)));
      k[i] = static_cast<float>(std::cos(0.7 * static_cast<double>(i)));
      // Cumulative log-decays along the rows, per channel: G[r, d] <= G[r - 1, d].
      g[i] = -0.05f * static_cast<float>(i / D) * static_cast<float>(1 + i % 3);
    }
  }
  double want(int64_t r, int64_t c) const {
    if (r < c) return 0;
    double s = 0;
    for (int64_t d = 0; d < D; ++d)
      s += static_cast<double>(q[r * D + d]) * k[c * D + d] * std::exp(static_cast<double>(g[r * D + d]) - g[c * D + d]);
    return s;
  }
};

double worst_error(rt::Device device) {
  Inputs in;
  std::vector<float> a(BT * BT, -7.0f);
  auto kernel = decayed_scores();
  CHECK(rt::run(*kernel, rt::Grid{1},
                {{"q", rt::TensorView::of(in.q.data(), {BT, D})}, {"k", rt::TensorView::of(in.k.data(), {BT, D})},
                 {"g", rt::TensorView::of(in.g.data(), {BT, D})}, {"a", rt::TensorView::of(a.data(), {BT, BT})}},
                device) == device);
  double worst = 0;
  for (int64_t r = 0; r < BT; ++r)
    for (int64_t c = 0; c < BT; ++c) worst = std::max(worst, std::abs(a[r * BT + c] - in.want(r, c)));
  return worst;
}

}  // namespace

TEST_CASE("rank 3: decayed scores as a broadcast product summed over d, on the interpreter") {
  CHECK(worst_error(rt::Device::cpu) < 1e-5);
}

TEST_CASE("rank 3: the product is fused into its sum on both targets, never held") {
  auto kernel = decayed_scores();
  for (rt::Arch arch : {rt::Arch::sm_80, rt::Arch::sm_90a}) {
    CAPTURE(static_cast<int>(arch));
    rt::Compiled c = rt::compile(*kernel, arch);
    CHECK(c.layouts.find("tile<16x16x32xf32> #fused") != std::string::npos);
    CHECK(c.smem_plan.find("16x16x32") == std::string::npos);  // no buffer of the rank-3 tile
    CHECK(c.ptx.find(".entry decayed_scores") != std::string::npos);
    CHECK(c.ptx.find("ex2.approx") != std::string::npos);  // exp, evaluated in the reduction's loop
  }
}

TEST_CASE("gpu: decayed scores as a broadcast product summed over d" * doctest::skip(test::no_gpu())) {
  CHECK(worst_error(rt::Device::gpu) < 1e-4);
}

TEST_CASE("rank 3: a tile the backend cannot fuse is an error at its DSL line") {
  KernelBuilder kb("held_rank3");
  Tensor q = kb.tensor("q", DType::f32, 2), o = kb.tensor("o", DType::f32, 2);
  Tile Q = load(q, {0, 0}, {BT, D});
  Tile terms = expand_dims(Q, 1) * expand_dims(Q, 0);  // [BT, BT, D]
  const unsigned line = __LINE__ - 1;
  // Summed, but also scanned: a scan keeps the rank, so the tile would have to be held.
  Tile s = cumsum(terms, 2);
  store(o, {0, 0}, {BT, BT}, sum(s, 2));
  auto kernel = kb.finish();
  try {
    rt::compile(*kernel, rt::Arch::sm_90a);
    FAIL("compiled a kernel holding a rank-3 tile");
  } catch (const UserError& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find("test_rank3_reduce.cpp:" + std::to_string(line)) != std::string::npos);
    CHECK(msg.find("rank 3") != std::string::npos);
    CHECK(msg.find("fused") != std::string::npos);
  }
}
