// The building blocks of linac/blocks.h on the interpreter, each against its math computed here in
// double: a kernel loads f32 inputs, applies the block and stores its result.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/log_decay.h"
#include "linac/blocks.h"
#include "linac/dsl.h"
#include "linac/runtime.h"

using namespace linac;
using namespace linac::dsl;
namespace rt = linac::runtime;

namespace {

/// A row-major f32 host array with its shape.
struct Array {
  std::vector<int64_t> shape;
  std::vector<float> data;
  Array(std::vector<int64_t> s, float fill = 0.0f) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data.assign(static_cast<size_t>(n), fill);
  }
  float& operator()(int64_t i, int64_t j) { return data[static_cast<size_t>(i * shape[1] + j)]; }
  float& operator[](int64_t i) { return data[static_cast<size_t>(i)]; }
};

Array random_array(std::vector<int64_t> shape, double lo, double hi, uint64_t seed) {
  Array a(std::move(shape));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (float& x : a.data) x = static_cast<float>(u(rng));
  return a;
}

/// Records a kernel that loads each input whole (f32), applies `fn` to the tiles and stores the tiles
/// it returns into `outs` (their shapes given), then runs it on one program on the interpreter.
void run_block(std::vector<Array*> ins, std::vector<Array*> outs,
               const std::function<std::vector<Tile>(const std::vector<Tile>&)>& fn) {
  KernelBuilder kb("block_test");
  std::vector<Tensor> in_t, out_t;
  for (size_t i = 0; i < ins.size(); ++i)
    in_t.push_back(kb.tensor("in" + std::to_string(i), DType::f32, static_cast<int>(ins[i]->shape.size())));
  for (size_t i = 0; i < outs.size(); ++i)
    out_t.push_back(kb.tensor("out" + std::to_string(i), DType::f32, static_cast<int>(outs[i]->shape.size())));
  std::vector<Tile> tiles;
  for (size_t i = 0; i < ins.size(); ++i)
    tiles.push_back(load(in_t[i], std::vector<Operand>(ins[i]->shape.size(), 0), ins[i]->shape));
  std::vector<Tile> results = fn(tiles);
  REQUIRE(results.size() == outs.size());
  for (size_t i = 0; i < outs.size(); ++i)
    store(out_t[i], std::vector<Operand>(outs[i]->shape.size(), 0), outs[i]->shape, results[i]);
  auto kernel = kb.finish();
  rt::Args args;
  for (size_t i = 0; i < ins.size(); ++i)
    args.emplace("in" + std::to_string(i), rt::TensorView::of(ins[i]->data.data(), ins[i]->shape));
  for (size_t i = 0; i < outs.size(); ++i) {
    std::fill(outs[i]->data.begin(), outs[i]->data.end(), std::numeric_limits<float>::quiet_NaN());
    args.emplace("out" + std::to_string(i), rt::TensorView::of(outs[i]->data.data(), outs[i]->shape));
  }
  rt::run(*kernel, rt::Grid{1}, args, rt::Device::cpu);
}

/// (I + A)^-1 of a strictly lower triangular n x n matrix by forward substitution, in double.
std::vector<double> unit_lower_inverse_f64(Array& A) {
  const int64_t n = A.shape[0];
  std::vector<double> T(static_cast<size_t>(n * n), 0.0);
  for (int64_t c = 0; c < n; ++c) {
    T[c * n + c] = 1.0;
    for (int64_t r = c + 1; r < n; ++r) {
      double s = 0;
      for (int64_t m = c; m < r; ++m) s += double(A(r, m)) * T[m * n + c];
      T[r * n + c] = -s;
    }
  }
  return T;
}

/// A strictly lower triangular matrix with entries of size about 1 / n (a chunk's beta K K^T).
Array strictly_lower(int64_t n, uint64_t seed) {
  Array A = random_array({n, n}, -2.0 / double(n), 2.0 / double(n), seed);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = r; c < n; ++c) A(r, c) = 0.0f;
  return A;
}

/// max |x - want| over all elements, NaN counted as infinite.
double worst_error(const Array& x, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(double(x.data[i]) - want[i]);
    worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d);
  }
  return worst;
}

/// sum_d x_rd y_cd exp(G_rd - G_cd) for r >= c (r > c when strict), G = cumsum(g) by rows, in double.
std::vector<double> gated_scores_f64(Array& X, Array& Y, Array& g, bool strict) {
  const int64_t n = X.shape[0], K = X.shape[1];
  std::vector<double> G(static_cast<size_t>(n * K)), A(static_cast<size_t>(n * n), 0.0);
  for (int64_t d = 0; d < K; ++d)
    for (int64_t r = 0; r < n; ++r) G[r * K + d] = (r ? G[(r - 1) * K + d] : 0.0) + double(g(r, d));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < (strict ? r : r + 1); ++c) {
      double s = 0;
      for (int64_t d = 0; d < K; ++d) s += double(X(r, d)) * double(Y(c, d)) * std::exp(G[r * K + d] - G[c * K + d]);
      A[r * n + c] = s;
    }
  return A;
}

}  // namespace

TEST_CASE("blocks: unit_lower_inverse is (I + A)^-1") {
  for (int64_t n : {2, 16, 32, 64}) {
    CAPTURE(n);
    Array A = strictly_lower(n, 7 + n), T({n, n});
    run_block({&A}, {&T}, [](const std::vector<Tile>& t) { return std::vector<Tile>{blocks::unit_lower_inverse(t[0])}; });
    CHECK(worst_error(T, unit_lower_inverse_f64(A)) < 1e-5);
  }
}

TEST_CASE("blocks: unit_lower_inverse_blocks is (I + A)^-1, by 16-row blocks") {
  for (int64_t n : {16, 32, 64}) {
    CAPTURE(n);
    const int ns = static_cast<int>(n / 16);
    Array A = strictly_lower(n, 3 + n), T({n, n});
    run_block({&A}, {&T}, [&](const std::vector<Tile>& t) {
      std::vector<std::vector<Tile>> blk(ns);
      for (int i = 0; i < ns; ++i)
        for (int j = 0; j <= i; ++j) blk[i].push_back(slice(slice(t[0], 0, 16 * i, 16), 1, 16 * j, 16));
      std::vector<std::vector<Tile>> inv = blocks::unit_lower_inverse_blocks(blk);
      Tile out = zeros({n, n}, DType::f32);
      for (int i = 0; i < ns; ++i)
        for (int j = 0; j <= i; ++j) out = place(out, inv[i][j], {16 * i, 16 * j});
      return std::vector<Tile>{out};
    });
    CHECK(worst_error(T, unit_lower_inverse_f64(A)) < 1e-5);
  }
}

TEST_CASE("blocks: unit_lower_inverse_blocks with absent blocks: T block diagonal by the same groups") {
  // A block diagonal by two groups of two 16-row blocks, the blocks between the groups absent: each
  // group's T is its own inverse, the blocks between the groups come back absent (zero), and the four
  // diagonal blocks, inverted side by side (unit_lower_inverses), equal the inverses one at a time.
  const int64_t n = 64, ns = 4;
  Array A = strictly_lower(n, 29), T({n, n});
  for (int64_t r = 32; r < n; ++r)
    for (int64_t c = 0; c < 32; ++c) A(r, c) = 0.0f;
  bool absent_between = true, present_within = true;
  run_block({&A}, {&T}, [&](const std::vector<Tile>& t) {
    std::vector<std::vector<Tile>> blk(ns, std::vector<Tile>(ns));
    for (int i = 0; i < ns; ++i)
      for (int j = i / 2 * 2; j <= i; ++j) blk[i][j] = slice(slice(t[0], 0, 16 * i, 16), 1, 16 * j, 16);
    std::vector<std::vector<Tile>> inv = blocks::unit_lower_inverse_blocks(blk);
    Tile out = zeros({n, n}, DType::f32);
    for (int i = 0; i < ns; ++i)
      for (int j = 0; j <= i; ++j) {
        const bool within = i / 2 == j / 2;
        absent_between = absent_between && (within || !inv[i][j].valid());
        present_within = present_within && (!within || inv[i][j].valid());
        if (inv[i][j].valid()) out = place(out, inv[i][j], {16 * i, 16 * j});
      }
    return std::vector<Tile>{out};
  });
  CHECK(absent_between);
  CHECK(present_within);
  CHECK(worst_error(T, unit_lower_inverse_f64(A)) < 1e-5);

  Array B = strictly_lower(16, 31), C = strictly_lower(16, 37), TB({16, 16}), TC({16, 16}), TB1({16, 16});
  run_block({&B, &C}, {&TB, &TC, &TB1}, [](const std::vector<Tile>& t) {
    std::vector<Tile> both = blocks::unit_lower_inverses({t[0], t[1]});
    return std::vector<Tile>{both[0], both[1], blocks::unit_lower_inverse(t[0])};
  });
  CHECK(worst_error(TB, unit_lower_inverse_f64(B)) < 1e-5);
  CHECK(worst_error(TC, unit_lower_inverse_f64(C)) < 1e-5);
  CHECK(TB.data == TB1.data);
}

TEST_CASE("blocks: chunk_decays are the gates' sums between rows, to the row and to the chunk's end") {
  const int64_t n = 32;
  Array g = random_array({n}, -1.0, 0.0, 11), D({n, n}), R({n}), D1({n, n}), R1({n});
  g[5] = -1e4f;  // a steep gate: the sums around it keep the small ones (differences would not)
  run_block({&g}, {&D, &R, &D1, &R1}, [](const std::vector<Tile>& t) {
    blocks::ChunkDecays d = blocks::chunk_decays(t[0]);
    return std::vector<Tile>{d.D, d.R, blocks::decays_between_rows(t[0]), blocks::decays_to_chunk_end(t[0])};
  });
  std::vector<double> want_D(n * n, 0.0), want_R(n, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < r; ++c)
      for (int64_t t = c + 1; t <= r; ++t) want_D[r * n + c] += double(g[t]);
  for (int64_t c = 0; c < n; ++c)
    for (int64_t t = c + 1; t < n; ++t) want_R[c] += double(g[t]);
  // To n roundings of the entry's own size (4e-6 relative, 4e-6 absolute below 1): a sum that does not
  // span the -1e4 keeps its small gates, which a difference of cumulative sums rounds to ulp(1e4) = 1e-3.
  auto close = [](Array& x, const std::vector<double>& want) {
    for (size_t i = 0; i < want.size(); ++i)
      if (!(std::abs(double(x.data[i]) - want[i]) <= 4e-6 * std::max(1.0, std::abs(want[i])))) return false;
    return true;
  };
  CHECK(close(D, want_D));
  CHECK(close(R, want_R));
  CHECK(close(D1, want_D));
  CHECK(close(R1, want_R));
}

TEST_CASE("ChunkLogDecays: differences of the cumulative gates, gates below the floor set apart") {
  // kernels/common/log_decay.h. A -inf gate at row 9 and a -1e4 one at row 20 in a chunk of 32: a decay
  // whose span holds one is 0; the others are the gates between the rows, summed, as differences of
  // ordinary sums (floored to -128 instead, they would be differences of sums near -128 or -256, ulp
  // 1.5e-5 and 3e-5: the bound below fails then).
  const int64_t n = 32;
  Array g = random_array({n}, -1.0, 0.0, 13);
  g[9] = -std::numeric_limits<float>::infinity();
  g[20] = -1e4f;
  auto is_apart = [&](int64_t t) { return t == 9 || t == 20; };
  // exp(sum of g over rows (c, r]) in double, 0 across a gate below the floor.
  auto decay = [&](int64_t c, int64_t r) {
    double s = 0;
    for (int64_t t = c + 1; t <= r; ++t) {
      if (is_apart(t)) return 0.0;
      s += double(g[t]);
    }
    return std::exp(s);
  };
  std::vector<double> want_between(n * n), want_end(n), want_start(n);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < n; ++c) want_between[r * n + c] = r >= c ? decay(c, r) : 1.0;
  for (int64_t r = 0; r < n; ++r) {
    want_end[r] = decay(r, n - 1);
    want_start[r] = decay(-1, r);
  }
  Array between({n, n}), to_end({n}), from_start({n}), total({1});
  auto decays_of = [&](const std::vector<Tile>& t) {
    const ChunkLogDecays d = chunk_log_decays(t[0]);
    Tile row = expand_dims(iota(n), 1), col = expand_dims(iota(n), 0);
    return std::vector<Tile>{d.between(row >= col), d.to_end(), d.from_start(), zeros({1}, DType::f32) + d.total};
  };
  run_block({&g}, {&between, &to_end, &from_start, &total}, decays_of);
  // Relative to the decay's own size: rounding of the sums.
  auto close = [&](Array& x, const std::vector<double>& want) {
    for (size_t i = 0; i < want.size(); ++i)
      if (!(std::abs(double(x.data[i]) - want[i]) <= 2e-6 * want[i] + 1e-30)) return false;
    return true;
  };
  CHECK(close(between, want_between));
  CHECK(close(to_end, want_end));
  CHECK(close(from_start, want_start));
  CHECK(std::exp(total[0]) == 0.0f);  // in fp32, as the kernels take it: the chunk drops the state
  CHECK(total[0] <= kLogDecayFloor);
  // After both gates (rows 21..31) the decays are those of the ordinary gates alone, to rounding.
  double worst = 0;
  for (int64_t r = 21; r < n; ++r)
    for (int64_t c = 20; c <= r; ++c)
      worst = std::max(worst, std::abs(double(between(r, c)) / want_between[r * n + c] - 1.0));
  CHECK(worst < 2e-6);
  // NaN stays NaN in every decay that spans it (it is not below the floor).
  g[25] = std::numeric_limits<float>::quiet_NaN();
  run_block({&g}, {&between, &to_end, &from_start, &total}, decays_of);
  CHECK(std::isnan(between(25, 21)));
  CHECK(std::isnan(to_end[21]));
  CHECK(!std::isnan(between(24, 21)));
}

TEST_CASE("blocks: decays_to_chunk_end per channel") {
  const int64_t n = 32, K = 8;
  Array g = random_array({n, K}, -1.0, 0.0, 5), R({n, K});
  g(3, 2) = -1e4f;
  run_block({&g}, {&R}, [](const std::vector<Tile>& t) { return std::vector<Tile>{blocks::decays_to_chunk_end(t[0])}; });
  for (int64_t c = 0; c < n; ++c)
    for (int64_t d = 0; d < K; ++d) {
      double want = 0;
      for (int64_t t = c + 1; t < n; ++t) want += double(g(t, d));
      CAPTURE(c);
      CAPTURE(d);
      CHECK(std::abs(double(R(c, d)) - want) <= 4e-6 * std::max(1.0, std::abs(want)));
    }
}

TEST_CASE("blocks: the decays to the chunk's end from the gates one row ahead, and from the first row") {
  const int64_t n = 32, K = 8;
  Array g = random_array({n, K}, -1.0, 0.0, 21);
  g(3, 2) = -1e4f;
  g(9, 0) = -1e4f;
  // The gates one row ahead, as a kernel loads them from the chunk's first row + 1: the last row is the
  // next chunk's first (here a value that would show if it were used).
  Array next({n, K}, -7.0f), g1({n}), next1({n}, -7.0f);
  for (int64_t r = 0; r + 1 < n; ++r)
    for (int64_t d = 0; d < K; ++d) next(r, d) = g(r + 1, d);
  for (int64_t r = 0; r < n; ++r) g1[r] = g(r, 0), next1[r] = r + 1 < n ? g(r + 1, 0) : -7.0f;
  Array R({n, K}), R1({n}), F({n, K}), F1({n});
  run_block({&next, &next1, &g, &g1}, {&R, &R1, &F, &F1}, [](const std::vector<Tile>& t) {
    return std::vector<Tile>{blocks::decays_to_chunk_end_from_next(t[0]), blocks::decays_to_chunk_end_from_next(t[1]),
                             blocks::decays_from_first_row(t[2]), blocks::decays_from_first_row(t[3])};
  });
  auto close = [](double x, double want) { return std::abs(x - want) <= 4e-6 * std::max(1.0, std::abs(want)); };
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < K; ++d) {
      double to_end = 0, from_first = 0;
      for (int64_t t = r + 1; t < n; ++t) to_end += double(g(t, d));
      for (int64_t t = 1; t <= r; ++t) from_first += double(g(t, d));
      CAPTURE(r);
      CAPTURE(d);
      CHECK(close(R(r, d), to_end));
      CHECK(close(F(r, d), from_first));
      if (d == 0) {
        CHECK(close(R1[r], to_end));
        CHECK(close(F1[r], from_first));
      }
    }
  KernelBuilder kb("decay_errors");
  CHECK_THROWS_AS(blocks::decays_to_chunk_end_from_next(zeros({n}, DType::i32)), UserError);
  CHECK_THROWS_AS(blocks::decays_from_first_row(zeros({2, n, K}, DType::f32)), UserError);
}

TEST_CASE("blocks: gated scores, factored and elementwise, with and without the diagonal") {
  const int64_t K = 24;
  // Mild gates take the factored form; steep ones (-6 per row in a channel: a spread of 90 over 16
  // rows) the elementwise one: steep in the first 16 rows only, so that a chunk's blocks differ.
  for (double steep : {0.0, -6.0}) {
    for (int64_t n : {16, 32, 64}) {
      for (bool strict : {false, true}) {
        CAPTURE(steep);
        CAPTURE(n);
        CAPTURE(strict);
        Array X = random_array({n, K}, -1, 1, 1 + n), Y = random_array({n, K}, -1, 1, 2 + n);
        Array g = random_array({n, K}, -0.5, 0.0, 3 + n), A({n, n}), Ad({16, 16});
        if (steep != 0)
          for (int64_t r = 0; r < 16; ++r) g(r, 1) = static_cast<float>(steep);
        run_block({&X, &Y, &g}, {&A, &Ad}, [&](const std::vector<Tile>& t) {
          Tile X0 = slice(t[0], 0, 0, 16), Y0 = slice(t[1], 0, 0, 16), g0 = slice(t[2], 0, 0, 16);
          Tile diag = blocks::gated_scores_diagonal(X0, Y0, cumsum(g0, 0), blocks::rows_of(Y0, g0), strict);
          return std::vector<Tile>{blocks::gated_scores(t[0], t[1], t[2], strict), diag};
        });
        const std::vector<double> want = gated_scores_f64(X, Y, g, strict);
        double worst = 0, scale = 0;
        for (int64_t i = 0; i < n * n; ++i) {
          const double d = std::abs(double(A[i]) - want[i]);
          worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d);
          scale = std::max(scale, std::abs(want[i]));
        }
        CHECK(worst <= 1e-5 * scale);
        double worst_d = 0;
        for (int64_t r = 0; r < 16; ++r)
          for (int64_t c = 0; c < 16; ++c) worst_d = std::max(worst_d, std::abs(double(Ad(r, c)) - want[r * n + c]));
        CHECK(worst_d <= 1e-5 * scale);
      }
    }
  }
}

TEST_CASE("blocks: the gradients of a diagonal block of gated scores, factored and elementwise") {
  const int64_t n = 16, K = 24;
  // Mild gates take the factored form, steep ones (-6 per row in a channel) the elementwise one; a gate
  // of -1e4 in the steep case checks that the exponents are sums of gates, not differences of L.
  for (double steep : {0.0, -6.0}) {
    for (bool strict : {false, true}) {
      for (bool transposed : {false, true}) {
        CAPTURE(steep);
        CAPTURE(strict);
        CAPTURE(transposed);
        Array X = random_array({n, K}, -1, 1, 31), Y = random_array({n, K}, -1, 1, 32);
        Array g = random_array({n, K}, -0.5, 0.0, 33), dA = random_array({n, n}, -1, 1, 34), dAT({n, n});
        if (steep != 0) {
          for (int64_t r = 0; r < n; ++r) g(r, 1) = static_cast<float>(steep);
          g(5, 2) = -1e4f;
        }
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = 0; c < n; ++c)
            if (strict ? c >= r : c > r) dA(r, c) = 0.0f;
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = 0; c < n; ++c) dAT(c, r) = dA(r, c);
        Array A({n, n}), dX({n, K}), dY({n, K});
        run_block({&X, &Y, &g, &dA, &dAT}, {&A, &dX, &dY}, [&](const std::vector<Tile>& t) {
          blocks::GatedScoresGrads gr = blocks::gated_scores_diagonal_grads(
              t[0], t[1], cumsum(t[2], 0), t[3], blocks::rows_of(t[0], t[1], t[2]), strict, transposed ? t[4] : Tile());
          return std::vector<Tile>{gr.A, gr.dX, gr.dY};
        });
        // In double: E[r][c][d] = exp(g_{c+1,d} + ... + g_{r,d}) for r >= c.
        auto decay = [&](int64_t r, int64_t c, int64_t d) {
          double e = 0;
          for (int64_t t = c + 1; t <= r; ++t) e += double(g(t, d));
          return std::exp(e);
        };
        std::vector<double> want_A(n * n, 0.0), want_dX(n * K, 0.0), want_dY(n * K, 0.0);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = 0; c < (strict ? r : r + 1); ++c)
            for (int64_t d = 0; d < K; ++d) {
              const double e = decay(r, c, d);
              want_A[r * n + c] += double(X(r, d)) * Y(c, d) * e;
              want_dX[r * K + d] += double(dA(r, c)) * Y(c, d) * e;
              want_dY[c * K + d] += double(dA(r, c)) * X(r, d) * e;
            }
        auto relative = [](Array& x, const std::vector<double>& want) {
          double worst = 0, scale = 0;
          for (size_t i = 0; i < want.size(); ++i) {
            const double d = std::abs(double(x.data[i]) - want[i]);
            worst = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(worst, d);
            scale = std::max(scale, std::abs(want[i]));
          }
          return worst / scale;
        };
        CHECK(relative(A, want_A) < 1e-5);
        CHECK(relative(dX, want_dX) < 1e-5);
        CHECK(relative(dY, want_dY) < 1e-5);
      }
    }
  }
  KernelBuilder kb("grads_errors");
  Tile Z = zeros({n, K}, DType::f32), dA0 = zeros({n, n}, DType::f32);
  CHECK_THROWS_AS(blocks::gated_scores_diagonal_grads(Z, Z, Z, dA0, blocks::rows_of(Z, Z)), UserError);  // no x_row
  CHECK_THROWS_AS(blocks::gated_scores_diagonal_grads(Z, Z, Z, Z, blocks::rows_of(Z, Z, Z)), UserError);  // dA [n, K]
}

TEST_CASE("blocks: state_update, without a decay, per head and per key channel, in either order") {
  const int64_t BT = 32, K = 16, V = 24;
  Array S = random_array({K, V}, -1, 1, 41), Kt = random_array({BT, K}, -1, 1, 42), Vt = random_array({BT, V}, -1, 1, 43);
  Array d = random_array({K}, -2.0, 0.0, 44), none({K, V}), head({K, V}), channel({K, V}), in_place({K, V}), half({K, V});
  Array transposed({K, V}), transposed_in_place({K, V});
  run_block({&S, &Kt, &Vt, &d}, {&none, &head, &channel, &in_place, &half, &transposed, &transposed_in_place},
            [](const std::vector<Tile>& t) {
    return std::vector<Tile>{blocks::state_update(t[0], t[1], t[2]),
                             blocks::state_update(t[0], t[1], t[2], take(t[3], 0, 0)),
                             blocks::state_update(t[0], t[1], t[2], t[3]),
                             blocks::state_update(t[0], t[1], t[2], t[3], /*in_place=*/true),
                             // 16-bit values: K (f32) is rounded to V's dtype for the product
                             blocks::state_update(t[0], t[1], t[2].to(DType::bf16), t[3]),
                             // the keys given as K^T [K, BT]
                             blocks::state_update_transposed_keys(t[0], t[1].T(), t[2], t[3]),
                             blocks::state_update_transposed_keys(t[0], t[1].T(), t[2], t[3], /*in_place=*/true)};
  });
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < V; ++j) {
      double kv = 0;
      for (int64_t r = 0; r < BT; ++r) kv += double(Kt(r, i)) * Vt(r, j);
      const double per_channel = std::exp(double(d[i])) * S(i, j) + kv;
      CAPTURE(i);
      CAPTURE(j);
      CHECK(std::abs(none(i, j) - (S(i, j) + kv)) <= 1e-5);
      CHECK(std::abs(head(i, j) - (std::exp(double(d[0])) * S(i, j) + kv)) <= 1e-5);
      CHECK(std::abs(channel(i, j) - per_channel) <= 1e-5);
      CHECK(std::abs(in_place(i, j) - per_channel) <= 1e-5);
      CHECK(std::abs(half(i, j) - per_channel) <= 0.1);  // bf16 inputs: 8 bits, 32 terms
      CHECK(std::abs(transposed(i, j) - per_channel) <= 1e-5);
      CHECK(std::abs(transposed_in_place(i, j) - per_channel) <= 1e-5);
    }
  KernelBuilder kb("state_update_errors");
  Tile S0 = zeros({K, V}, DType::f32), K0 = zeros({BT, K}, DType::f32), V0 = zeros({BT, V}, DType::f32);
  CHECK_THROWS_AS(blocks::state_update(S0, V0, K0), UserError);
  CHECK_THROWS_AS(blocks::state_update(S0, K0, V0, zeros({V}, DType::f32)), UserError);
  CHECK_THROWS_AS(blocks::state_update_transposed_keys(S0, K0, V0), UserError);  // K [BT, K], not [K, BT]
  CHECK_NOTHROW(blocks::state_update_transposed_keys(S0, K0.T(), V0));
}

TEST_CASE("blocks: inverse_norms and l2normalize, of rows and of a vector") {
  const int64_t n = 16, D = 24;
  Array x = random_array({n, D}, -2, 2, 9), inv({n}), rows({n, D}), vec({D});
  const double eps = 1e-6;
  run_block({&x}, {&inv, &rows, &vec}, [&](const std::vector<Tile>& t) {
    return std::vector<Tile>{blocks::inverse_norms(t[0], 1, eps), blocks::l2normalize(t[0], 1, eps),
                             blocks::l2normalize(take(t[0], 3, 0), 0, eps)};
  });
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += double(x(r, d)) * x(r, d);
    const double want = 1 / std::sqrt(ss + eps);
    CHECK(std::abs(inv[r] - want) <= 1e-6 * want);
    for (int64_t d = 0; d < D; ++d) {
      CHECK(std::abs(rows(r, d) - x(r, d) * want) <= 1e-6);
      if (r == 3) CHECK(std::abs(vec[d] - x(r, d) * want) <= 1e-6);
    }
  }
}

TEST_CASE("blocks: a wrong shape is a user error at the caller's line") {
  KernelBuilder kb("block_errors");
  Tile A = zeros({24, 24}, DType::f32);
  const unsigned line = __LINE__ + 2;
  try {
    blocks::unit_lower_inverse(A);
    FAIL("expected a UserError");
  } catch (const UserError& e) {
    CHECK(e.loc().line == line);
    CHECK(std::string(e.what()).find("power-of-two") != std::string::npos);
  }
  Tile g = zeros({16, 8}, DType::f32), X = zeros({16, 4}, DType::f32);
  CHECK_THROWS_AS(blocks::gated_scores(X, X, g), UserError);
  CHECK_THROWS_AS(blocks::chunk_decays(g), UserError);
  CHECK_THROWS_AS(blocks::gated_scores(zeros({24, 8}, DType::f32), zeros({24, 8}, DType::f32), zeros({24, 8}, DType::f32)),
                  UserError);
}
