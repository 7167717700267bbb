// Static slicing and assembly from the DSL (slice, concat, place): results on the interpreter against
// values computed here, and the GPU lowering's PTX, whose every global access is a load or the store
// of the kernel (no trip through global memory).
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "linac/dsl.h"
#include "linac/runtime.h"

using namespace linac;
using namespace linac::dsl;
namespace rt = linac::runtime;

namespace {

struct Lines {
  unsigned load = 0, store = 0;
};

/// Y = the halves of X [16, 16] swapped (rows 8..15 above rows 0..7) with 2 X[4:8, 2:6] placed at
/// (0, 12); out = [Y[:, 0:8]  -1] (the right half index math: a concat of data and a constant).
std::shared_ptr<ir::Kernel> swap_and_place(Lines* lines) {
  KernelBuilder kb("swap_and_place");
  Tensor x = kb.tensor("x", DType::f32, 2);
  Tensor o = kb.tensor("o", DType::f32, 2);
  Tile X = load(x, {0, 0}, {16, 16});
  lines->load = __LINE__ - 1;
  Tile swapped = concat({slice(X, 0, 8, 8), slice(X, 0, 0, 8)}, 0);
  Tile blk = slice(slice(X, 0, 4, 4), 1, 2, 4) * 2.0f;
  Tile Y = place(swapped, blk, {0, 12});
  Tile out = concat({slice(Y, 1, 0, 8), full({16, 8}, -1, DType::f32)}, 1);
  store(o, {0, 0}, {16, 16}, out);
  lines->store = __LINE__ - 1;
  return kb.finish();
}

/// O = diag(A0 A0^T, A1 A1^T) V with A0, A1 the 16-row halves of A [32, 16]: the block matrix is
/// assembled in the kernel from two products.
std::shared_ptr<ir::Kernel> block_diagonal(DType dt, Lines* lines) {
  KernelBuilder kb("block_diagonal");
  Tensor a = kb.tensor("a", dt, 2);
  Tensor v = kb.tensor("v", dt, 2);
  Tensor o = kb.tensor("o", DType::f32, 2);
  Tile A = load(a, {0, 0}, {32, 16});
  Tile V = load(v, {0, 0}, {32, 32});
  lines->load = __LINE__ - 2;
  Tile A0 = slice(A, 0, 0, 16), A1 = slice(A, 0, 16, 16);
  Tile M = place(place(zeros({32, 32}, DType::f32), dot(A0, A0.T()), {0, 0}), dot(A1, A1.T()), {16, 16});
  store(o, {0, 0}, {32, 32}, dot(M.to(dt), V));
  lines->store = __LINE__ - 1;
  return kb.finish();
}

/// Checks that every global load and store of the PTX comes from the given DSL lines (.loc 1 LINE).
void check_global_accesses(const std::string& ptx, const Lines& lines, bool loads_on_two_lines) {
  std::istringstream in(ptx);
  std::string line;
  unsigned at = 0;
  int stores = 0;
  while (std::getline(in, line)) {
    if (auto p = line.find(".loc\t1 "); p != std::string::npos) at = static_cast<unsigned>(std::stoul(line.substr(p + 7)));
    if (line.find("st.global") != std::string::npos) {
      CHECK_MESSAGE(at == lines.store, line);
      ++stores;
    }
    if (line.find("ld.global") != std::string::npos || line.find("cp.async.cg") != std::string::npos ||
        line.find("cp.async.ca") != std::string::npos)
      CHECK_MESSAGE((at == lines.load || (loads_on_two_lines && at == lines.load + 1)), line);
  }
  CHECK(stores > 0);
}

}  // namespace

TEST_CASE("dsl assembly: slice, concat and place on the interpreter") {
  Lines lines;
  auto k = swap_and_place(&lines);
  std::vector<float> x(16 * 16), o(16 * 16, 0.0f);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) x[r * 16 + c] = static_cast<float>(100 * r + c);
  rt::run(*k, rt::Grid{1}, {{"x", rt::TensorView::of(x.data(), {16, 16})}, {"o", rt::TensorView::of(o.data(), {16, 16})}},
          rt::Device::cpu);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      float want = c >= 8 ? -1.0f : x[((r + 8) % 16) * 16 + c];  // only columns 0..7 of Y are kept, and
      CAPTURE(r);                                                // the placed block covers 12..15
      CAPTURE(c);
      CHECK(o[r * 16 + c] == want);
    }
}

TEST_CASE("dsl assembly: a placed block is read where it lies") {
  // Y's right half, which swap_and_place drops, checked through a kernel that keeps it.
  KernelBuilder kb("place_kept");
  Tensor x = kb.tensor("x", DType::f32, 2);
  Tensor o = kb.tensor("o", DType::f32, 2);
  Tile X = load(x, {0, 0}, {16, 16});
  Tile Y = place(concat({slice(X, 0, 8, 8), slice(X, 0, 0, 8)}, 0), slice(slice(X, 0, 4, 4), 1, 2, 4) * 2.0f, {0, 12});
  store(o, {0, 0}, {16, 16}, Y);
  auto k = kb.finish();
  std::vector<float> xs(16 * 16), out(16 * 16, 0.0f);
  for (int i = 0; i < 256; ++i) xs[i] = static_cast<float>(100 * (i / 16) + i % 16);
  rt::run(*k, rt::Grid{1}, {{"x", rt::TensorView::of(xs.data(), {16, 16})}, {"o", rt::TensorView::of(out.data(), {16, 16})}},
          rt::Device::cpu);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      float want = r < 4 && c >= 12 ? 2 * xs[(4 + r) * 16 + (2 + c - 12)] : xs[((r + 8) % 16) * 16 + c];
      CAPTURE(r);
      CAPTURE(c);
      CHECK(out[r * 16 + c] == want);
    }
}

TEST_CASE("dsl assembly: a block-diagonal matrix assembled from products, on the interpreter") {
  Lines lines;
  auto k = block_diagonal(DType::f32, &lines);
  std::vector<float> a(32 * 16), v(32 * 32), o(32 * 32, 0.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i)));
  rt::run(*k, rt::Grid{1},
          {{"a", rt::TensorView::of(a.data(), {32, 16})}, {"v", rt::TensorView::of(v.data(), {32, 32})},
           {"o", rt::TensorView::of(o.data(), {32, 32})}},
          rt::Device::cpu);
  double worst = 0;
  for (int r = 0; r < 32; ++r)
    for (int c = 0; c < 32; ++c) {
      double want = 0;
      const int half = r / 16;
      for (int j = 16 * half; j < 16 * half + 16; ++j) {  // M[r, j] is zero outside r's diagonal block
        double m = 0;
        for (int t = 0; t < 16; ++t) m += static_cast<double>(a[r * 16 + t]) * a[j * 16 + t];
        want += static_cast<double>(static_cast<float>(m)) * v[j * 32 + c];
      }
      worst = std::max(worst, std::abs(o[r * 32 + c] - want));
    }
  CHECK(worst < 1e-4);
}

TEST_CASE("dsl assembly: the GPU lowering touches global memory only at the loads and the store") {
  for (rt::Arch arch : {rt::Arch::sm_80, rt::Arch::sm_90a}) {
    CAPTURE(static_cast<int>(arch));
    Lines lines;
    auto k = swap_and_place(&lines);
    rt::Compiled c = rt::compile(*k, arch);
    CHECK(c.ptx.find(".entry swap_and_place") != std::string::npos);
    check_global_accesses(c.ptx, lines, false);
    for (DType dt : {DType::bf16, DType::f32}) {
      Lines dl;
      auto bd = block_diagonal(dt, &dl);
      rt::Compiled cb = rt::compile(*bd, arch);
      CHECK(cb.ptx.find(".entry block_diagonal") != std::string::npos);
      if (dt == DType::bf16) CHECK(cb.ptx.find("mma.sync") != std::string::npos);
      check_global_accesses(cb.ptx, dl, true);
    }
  }
}

TEST_CASE("dsl assembly: the guide's block matrix, on the interpreter and to PTX") {
  // docs/dsl-guide.md, "Slicing and assembling tiles": A [32, 32] from 16-row blocks of Q and K.
  KernelBuilder kb("guide_blocks");
  Tensor q = kb.tensor("q", DType::f32, 2);
  Tensor k = kb.tensor("k", DType::f32, 2);
  Tensor a_out = kb.tensor("a", DType::f32, 2);
  Tensor cols_out = kb.tensor("cols", DType::f32, 2);
  const int64_t BT = 32, BK = 16;
  Tile Q = load(q, {0, 0}, {BT, BK}), K = load(k, {0, 0}, {BT, BK});
  Tile D10 = full({16, 16}, 0.5, DType::f32);
  Tile Q0 = slice(Q, 0, 0, 16), Q1 = slice(Q, 0, 16, 16);
  Tile K0 = slice(K, 0, 0, 16), K1 = slice(K, 0, 16, 16);
  Tile A = zeros({BT, BT}, DType::f32);
  A = place(A, dot(Q0, K0.T()), {0, 0});
  A = place(A, dot(Q1, K1.T()), {16, 16});
  A = place(A, dot(Q1, K0.T()) * D10, {16, 0});
  Tile cols = concat({slice(A, 1, 0, 16), slice(A, 1, 16, 16)}, 0);
  store(a_out, {0, 0}, {BT, BT}, A);
  store(cols_out, {0, 0}, {2 * BT, 16}, cols);
  auto kernel = kb.finish();

  std::vector<float> qs(BT * BK), ks(BT * BK), a(BT * BT, -7.0f), c(2 * BT * 16, -7.0f);
  for (size_t i = 0; i < qs.size(); ++i) qs[i] = static_cast<float>(std::sin(0.3 * static_cast<double>(i)));
  for (size_t i = 0; i < ks.size(); ++i) ks[i] = static_cast<float>(std::cos(0.7 * static_cast<double>(i)));
  rt::run(*kernel, rt::Grid{1},
          {{"q", rt::TensorView::of(qs.data(), {BT, BK})}, {"k", rt::TensorView::of(ks.data(), {BT, BK})},
           {"a", rt::TensorView::of(a.data(), {BT, BT})}, {"cols", rt::TensorView::of(c.data(), {2 * BT, 16})}},
          rt::Device::cpu);
  auto want = [&](int r, int col) {
    if (r < 16 && col >= 16) return 0.0;  // above the diagonal blocks: the zeros A started as
    double s = 0;
    for (int t = 0; t < BK; ++t) s += static_cast<double>(qs[r * BK + t]) * ks[col * BK + t];
    return r >= 16 && col < 16 ? 0.5 * static_cast<double>(static_cast<float>(s)) : s;
  };
  double worst = 0;
  for (int r = 0; r < BT; ++r)
    for (int col = 0; col < BT; ++col) {
      worst = std::max(worst, std::abs(a[r * BT + col] - want(r, col)));
      // cols stacks A's column blocks: row r of block b is A[r, 16 b ..].
      const int b = col / 16;
      worst = std::max(worst, std::abs(c[(b * BT + r) * 16 + col % 16] - want(r, col)));
    }
  CHECK(worst < 1e-5);
  CHECK(rt::compile(*kernel, rt::Arch::sm_90a).ptx.find(".entry guide_blocks") != std::string::npos);
}

namespace {

/// Block m of o ([n * 16, 16]) is X * roll_left(X, m) for m < n (the poly kernel's degree-2 features):
/// the roll is a slice of [X X] at a start known at run time, inside a loop.
std::shared_ptr<ir::Kernel> rolled_products() {
  KernelBuilder kb("rolled_products");
  Tensor x = kb.tensor("x", DType::f32, 2);
  Tensor o = kb.tensor("o", DType::f32, 2);
  Tile X = load(x, {0, 0}, {16, 16});
  Tile XX = concat({X, X}, 1);
  for_range(0, o.dim(0) / 16, [&](Tile m) { store(o, {m * 16, 0}, {16, 16}, X * slice(XX, 1, m, 16)); });
  return kb.finish();
}

}  // namespace

TEST_CASE("dsl assembly: a slice at a start known at run time rolls a tile, on the interpreter and to PTX") {
  auto k = rolled_products();
  std::vector<float> x(16 * 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.41 * static_cast<double>(i)));
  std::vector<float> o(18 * 16 * 16, -7.0f);
  auto run_blocks = [&](int64_t blocks) {
    rt::run(*k, rt::Grid{1},
            {{"x", rt::TensorView::of(x.data(), {16, 16})}, {"o", rt::TensorView::of(o.data(), {blocks * 16, 16})}},
            rt::Device::cpu);
  };
  run_blocks(17);  // m = 16 is the last start inside [X X]
  for (int m = 0; m < 17; ++m)
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        CAPTURE(m);
        CAPTURE(r);
        CAPTURE(c);
        CHECK(o[(m * 16 + r) * 16 + c] == x[r * 16 + c] * x[r * 16 + (c + m) % 16]);
      }
  // m = 17 starts the slice one column past [X X]'s last 16: the interpreter names the slice.
  CHECK_THROWS_WITH_AS(run_blocks(18), doctest::Contains("slice: 16 elements from 17 leave axis 1 of size 32"),
                       UserError);

  // On the GPU the slice reads X's shared-memory copy, written once before the loop: the loop body
  // (from the first label after that copy to the last branch) reads shared memory and has no barrier.
  for (rt::Arch arch : {rt::Arch::sm_80, rt::Arch::sm_90a}) {
    rt::Compiled c = rt::compile(*k, arch);
    const std::string& ptx = c.ptx;
    const size_t st_shared = ptx.find("st.shared");
    REQUIRE(st_shared != std::string::npos);
    const size_t loop = ptx.find("$L__BB0_", st_shared);
    REQUIRE(loop != std::string::npos);
    const size_t back = ptx.rfind("bra.uni");
    REQUIRE(back != std::string::npos);
    REQUIRE(back > loop);
    const std::string body = ptx.substr(loop, back - loop);
    CHECK(body.find("ld.shared") != std::string::npos);
    CHECK_MESSAGE(body.find("bar.sync") == std::string::npos, body);
  }
}
