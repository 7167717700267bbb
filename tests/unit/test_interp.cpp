// Interpreter tests, part 1: number formats and the semantics of each op (leaves, elementwise, shape
// ops, reductions, scans, dot). Expected values are computed by hand or by plain C++: float arithmetic
// is correctly rounded, so it is an independent reference for f32 ops.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "interp_test_util.h"

using namespace interp_test;

TEST_SUITE("interp") {
  // ---------------------------------------------------------------------------------------------
  // Number formats

  TEST_CASE("round_to: bf16 and f16 round to nearest even") {
    CHECK(round_to(DType::bf16, 1.00390625) == 1.0);       // 1 + 2^-8: a tie, 1.0 is even
    CHECK(round_to(DType::bf16, 1.01171875) == 1.015625);  // 1 + 3*2^-8: a tie, rounds up to even
    CHECK(round_to(DType::bf16, 1.0039063) == 1.0078125);  // just above the tie
    CHECK(round_to(DType::bf16, -1.00390625) == -1.0);
    CHECK(round_to(DType::f16, 1.0 + std::ldexp(1.0, -11)) == 1.0);
    CHECK(round_to(DType::f16, 1.0 + 3 * std::ldexp(1.0, -11)) == 1.0 + std::ldexp(1.0, -9));
    CHECK(round_to(DType::f16, 0.1) == 0.0999755859375);
    CHECK(round_to(DType::f32, 1.0 + std::ldexp(1.0, -24)) == 1.0);
    CHECK(round_to(DType::f32, 0.1) == static_cast<double>(0.1f));
  }

  TEST_CASE("round_to: overflow, subnormals, NaN") {
    CHECK(round_to(DType::f16, 65504) == 65504);
    CHECK(round_to(DType::f16, 65519) == 65504);
    CHECK(round_to(DType::f16, 65520) == kInf);  // the tie above the largest finite rounds to inf
    CHECK(round_to(DType::f16, -1e10) == -kInf);
    const double bf16_max = std::ldexp(255.0, 120);  // (2 - 2^-7) * 2^127
    CHECK(round_to(DType::bf16, 3.39e38) == bf16_max);
    CHECK(round_to(DType::bf16, 3.4e38) == kInf);  // past max + half an ulp (3.3961e38)
    const double f16_min_sub = std::ldexp(1.0, -24), bf16_min_sub = std::ldexp(1.0, -133);
    CHECK(round_to(DType::f16, f16_min_sub) == f16_min_sub);
    CHECK(round_to(DType::f16, f16_min_sub / 2) == 0.0);  // tie to even (zero)
    CHECK(round_to(DType::f16, f16_min_sub * 0.75) == f16_min_sub);
    CHECK(round_to(DType::f16, f16_min_sub * 2.5) == f16_min_sub * 2);  // tie between 2 and 3 quanta
    CHECK(round_to(DType::f16, std::ldexp(1.0, -15) + f16_min_sub * 0.4) == std::ldexp(1.0, -15));
    CHECK(round_to(DType::bf16, bf16_min_sub * 1.5) == bf16_min_sub * 2);
    CHECK(round_to(DType::bf16, bf16_min_sub * 0.5) == 0.0);
    CHECK(std::signbit(round_to(DType::bf16, -bf16_min_sub * 0.25)));  // rounds to -0
    CHECK(std::isnan(round_to(DType::bf16, kNaN)));
    CHECK(std::isnan(round_to(DType::f16, kNaN)));
    CHECK(round_to(DType::f16, kInf) == kInf);
  }

  TEST_CASE("round_to: integers truncate and wrap like C casts") {
    CHECK(round_to(DType::i32, -3.7) == -3);
    CHECK(round_to(DType::i32, 3.7) == 3);
    CHECK(round_to(DType::i32, 2147483648.0) == -2147483648.0);
    CHECK(round_to(DType::i32, 3e9) == -1294967296.0);
    CHECK(round_to(DType::i32, kNaN) == 0);
    CHECK(round_to(DType::i64, -1e30) == static_cast<double>(std::numeric_limits<int64_t>::min()));
    CHECK(round_to(DType::i1, 2) == 1);
    CHECK(round_to(DType::i1, 0) == 0);
    CHECK(round_to(DType::f64, 0.1) == 0.1);
  }

  TEST_CASE("16-bit float bit patterns") {
    CHECK(interp::f16_bits(1.0) == 0x3C00);
    CHECK(interp::f16_bits(-2.0) == 0xC000);
    CHECK(interp::f16_bits(65504) == 0x7BFF);
    CHECK(interp::f16_bits(65520) == 0x7C00);
    CHECK(interp::f16_bits(-0.0) == 0x8000);
    CHECK(interp::f16_bits(std::ldexp(1.0, -24)) == 0x0001);
    CHECK(interp::f16_bits(std::ldexp(1.0, -14)) == 0x0400);     // smallest normal
    CHECK(interp::f16_bits(std::ldexp(1023.0, -24)) == 0x03FF);  // largest subnormal
    CHECK(interp::f16_bits(kNaN) == 0x7E00);
    CHECK(interp::bf16_bits(1.0) == 0x3F80);
    CHECK(interp::bf16_bits(1.00390625) == 0x3F80);
    CHECK(interp::bf16_bits(-kInf) == 0xFF80);
    CHECK(interp::bf16_bits(std::ldexp(1.0, -133)) == 0x0001);
    CHECK(interp::from_bf16_bits(0x4049) == 3.140625);
    CHECK(interp::from_f16_bits(0x3555) == 0.333251953125);

    // Every pattern decodes to a value that encodes back to it (NaNs to a NaN).
    for (uint32_t bits = 0; bits < 0x10000; ++bits) {
      auto b16 = static_cast<uint16_t>(bits);
      double h = interp::from_f16_bits(b16), bf = interp::from_bf16_bits(b16);
      if (std::isnan(h)) {
        CHECK(std::isnan(interp::from_f16_bits(interp::f16_bits(h))));
      } else if (interp::f16_bits(h) != b16) {
        FAIL_CHECK("f16 pattern does not round-trip: " << bits);
      }
      if (std::isnan(bf)) {
        CHECK(std::isnan(interp::from_bf16_bits(interp::bf16_bits(bf))));
      } else if (interp::bf16_bits(bf) != b16) {
        FAIL_CHECK("bf16 pattern does not round-trip: " << bits);
      }
    }
  }

  TEST_CASE("bf16 fast rounding agrees with the generic one") {
    // Random bit patterns over every exponent (normals, subnormals, overflow, NaN, inf), exact ties
    // and the values next to them, and the largest bf16 with and without the carry into inf.
    std::mt19937_64 rng(42);
    auto check = [](double x) {
      uint16_t fast = interp::bf16_bits(x), slow = interp::bf16_bits_generic(x);
      if (std::isnan(x)) {
        CHECK(std::isnan(interp::from_bf16_bits(fast)));
      } else if (fast != slow) {
        FAIL_CHECK("bf16 of " << x << ": fast " << fast << ", generic " << slow);
      }
    };
    for (int i = 0; i < 2000000; ++i) check(std::bit_cast<double>(rng()));
    for (int i = 0; i < 200000; ++i) {
      // Doubles near bf16's range: exponent in [-140, 130], fraction random, ties forced sometimes.
      uint64_t u = rng();
      int64_t e = static_cast<int64_t>(u % 271) - 140;
      uint64_t frac = rng() & ((uint64_t{1} << 52) - 1);
      if (i % 3 == 0) frac = (frac & ~((uint64_t{1} << 45) - 1)) | (uint64_t{1} << 44);  // an exact tie
      double x = std::bit_cast<double>((static_cast<uint64_t>(e + 1023) << 52) | frac) * ((u >> 63) ? -1 : 1);
      check(x);
      check(std::nextafter(x, 0.0));
      check(std::nextafter(x, kInf));
      check(static_cast<float>(x));
    }
    const double max_bf16 = std::ldexp(255.0, 120);
    check(max_bf16);
    check(max_bf16 + std::ldexp(1.0, 119));                       // the tie above it: rounds to inf
    check(std::nextafter(max_bf16 + std::ldexp(1.0, 119), 0.0));  // just below the tie: max_bf16
  }

  TEST_CASE("16-bit rounding agrees with independent references on random values") {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> mant(1.0, 2.0);
    std::uniform_int_distribution<int> expo(-30, 18);
    int mismatches = 0;
    for (int i = 0; i < 200000; ++i) {
      double x = std::ldexp(mant(rng), expo(rng)) * (i % 2 ? -1 : 1);
      // bf16 of a float: the classic bit trick (add 0x7FFF plus the lowest kept bit, truncate).
      float xf = static_cast<float>(x);
      uint32_t u;
      std::memcpy(&u, &xf, 4);
      auto expected_bf16 = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
      if (interp::bf16_bits(xf) != expected_bf16) ++mismatches;
#ifdef __FLT16_MANT_DIG__
      // f16 of a double: the compiler's own conversion.
      if (interp::f16_bits(x) != std::bit_cast<uint16_t>(static_cast<_Float16>(x))) ++mismatches;
#endif
    }
    CHECK(mismatches == 0);
  }

  // ---------------------------------------------------------------------------------------------
  // Leaves and elementwise ops

  TEST_CASE("constant, iota, dim") {
    auto r = apply({}, DType::f32, [](Builder& b, std::vector<Value*>) { return b.constant(DType::f32, 0.1, {2, 2}); });
    CHECK(r.data == std::vector<double>(4, f32(0.1)));
    r = apply({}, DType::f32, [](Builder& b, std::vector<Value*>) { return b.constant(DType::bf16, 1.00390625); });
    CHECK(r.shape.empty());
    CHECK(r.data == std::vector<double>{1.0});
    r = apply({}, DType::f32, [](Builder& b, std::vector<Value*>) { return b.constant(DType::i32, 2147483648.0); });
    CHECK(r.data == std::vector<double>{-2147483648.0});
    r = apply({}, DType::f32,
              [](Builder& b, std::vector<Value*>) { return b.op(OpCode::Iota, {}, Type::tile(DType::i32, {5})); });
    CHECK(r.data == std::vector<double>{0, 1, 2, 3, 4});
    r = apply({{{2, 3}, std::vector<double>(6)}}, DType::f64, [](Builder& b, std::vector<Value*>) {
      Value* t = b.k.params[0].value;
      return b.binary(OpCode::Add, b.axis_op(OpCode::Dim, {t}, 0),
                      b.binary(OpCode::Mul, b.i32(10), b.axis_op(OpCode::Dim, {t}, 1)));
    });
    CHECK(r.data == std::vector<double>{32});
  }

  TEST_CASE("f32 arithmetic matches float arithmetic") {
    std::vector<double> x{1, 0.1, -7.5, 7.5, 2}, y{3, 0.2, 2, -2, 0.5};
    std::vector<float> xf(x.begin(), x.end()), yf(y.begin(), y.end());
    auto each = [&](auto fn) {
      std::vector<double> out;
      for (size_t i = 0; i < x.size(); ++i) out.push_back(static_cast<float>(fn(xf[i], yf[i])));
      return out;
    };
    CHECK(binary(OpCode::Add, DType::f32, x, y) == each([](float a, float b) { return a + b; }));
    CHECK(binary(OpCode::Sub, DType::f32, x, y) == each([](float a, float b) { return a - b; }));
    CHECK(binary(OpCode::Mul, DType::f32, x, y) == each([](float a, float b) { return a * b; }));
    CHECK(binary(OpCode::Div, DType::f32, x, y) == each([](float a, float b) { return a / b; }));
    CHECK(binary(OpCode::Rem, DType::f32, x, y) == each([](float a, float b) { return std::fmod(a, b); }));
    CHECK(binary(OpCode::Max, DType::f32, x, y) == std::vector<double>{3, f32(0.2), 2, 7.5, 2});
    CHECK(binary(OpCode::Min, DType::f32, x, y) == std::vector<double>{1, f32(0.1), -7.5, -2, 0.5});
    CHECK(binary(OpCode::Pow, DType::f32, {2, 2, 9}, {10, 0.5, 0.5}) ==
          std::vector<double>{1024, f32(std::sqrt(2.0)), 3});
    CHECK(binary(OpCode::Max, DType::f32, {kNaN, 1}, {1, kNaN}) == std::vector<double>{1, 1});
    CHECK(binary(OpCode::Div, DType::f32, {1, -1}, {0, 0}) == std::vector<double>{kInf, -kInf});
  }

  TEST_CASE("f32 math functions are computed in double and rounded once") {
    CHECK(unary(OpCode::Neg, DType::f32, {3, -0.5}) == std::vector<double>{-3, 0.5});
    CHECK(unary(OpCode::Abs, DType::f32, {-2, 2}) == std::vector<double>{2, 2});
    CHECK(unary(OpCode::Exp, DType::f32, {0, 1}) == std::vector<double>{1, 2.7182817459106445});
    CHECK(unary(OpCode::Exp2, DType::f32, {3, -1}) == std::vector<double>{8, 0.5});
    CHECK(unary(OpCode::Log, DType::f32, {1, 0}) == std::vector<double>{0, -kInf});
    CHECK(unary(OpCode::Log2, DType::f32, {8, 0.25}) == std::vector<double>{3, -2});
    CHECK(unary(OpCode::Sqrt, DType::f32, {4, 2}) == std::vector<double>{2, 1.4142135381698608});
    CHECK(unary(OpCode::Rsqrt, DType::f32, {4, 2}) == std::vector<double>{0.5, f32(1 / std::sqrt(2.0))});
    CHECK(unary(OpCode::Sigmoid, DType::f32, {0, 2, -100}) ==
          std::vector<double>{0.5, f32(1 / (1 + std::exp(-2.0))), f32(1 / (1 + std::exp(100.0)))});
    auto nan = unary(OpCode::Sqrt, DType::f32, {-1});
    CHECK(std::isnan(nan[0]));
  }

  TEST_CASE("bf16 and f16 arithmetic rounds each result") {
    CHECK(binary(OpCode::Add, DType::bf16, {1, 256}, {0.00390625, 3}) == std::vector<double>{1, 260});
    CHECK(binary(OpCode::Mul, DType::f16, {300, 2}, {300, 3}) == std::vector<double>{kInf, 6});
    CHECK(binary(OpCode::Div, DType::bf16, {1}, {3}) == std::vector<double>{0.333984375});
  }

  TEST_CASE("i32 arithmetic wraps and truncates like C") {
    CHECK(binary(OpCode::Add, DType::i32, {2147483647, -5}, {1, 3}) == std::vector<double>{-2147483648.0, -2});
    CHECK(binary(OpCode::Sub, DType::i32, {-2147483648.0}, {1}) == std::vector<double>{2147483647});
    CHECK(binary(OpCode::Mul, DType::i32, {46341, 65536}, {46341, 65536}) == std::vector<double>{-2147479015, 0});
    CHECK(binary(OpCode::Div, DType::i32, {-7, 7, 7, -2147483648.0}, {2, -2, 2, -1}) ==
          std::vector<double>{-3, -3, 3, -2147483648.0});
    CHECK(binary(OpCode::Rem, DType::i32, {-7, 7, 7, -2147483648.0}, {3, -3, 3, -1}) ==
          std::vector<double>{-1, 1, 1, 0});
    CHECK(binary(OpCode::Max, DType::i32, {-1, 5}, {2, 3}) == std::vector<double>{2, 5});
    CHECK(binary(OpCode::Min, DType::i32, {-1, 5}, {2, 3}) == std::vector<double>{-1, 3});
    CHECK(binary(OpCode::Pow, DType::i32, {2, 3}, {10, 2}) == std::vector<double>{1024, 9});
    CHECK(binary(OpCode::And, DType::i32, {12, -1}, {10, 6}) == std::vector<double>{8, 6});
    CHECK(binary(OpCode::Or, DType::i32, {12, -8}, {10, 1}) == std::vector<double>{14, -7});
    CHECK(unary(OpCode::Not, DType::i32, {5, -1}) == std::vector<double>{-6, 0});
    CHECK(unary(OpCode::Neg, DType::i32, {5, -2147483648.0}) == std::vector<double>{-5, -2147483648.0});
    CHECK(unary(OpCode::Abs, DType::i32, {-5, 7}) == std::vector<double>{5, 7});
    CHECK(binary(OpCode::Add, DType::i64, {4294967296.0}, {4294967296.0}) == std::vector<double>{8589934592.0});
  }

  TEST_CASE("i1 logic") {
    CHECK(binary(OpCode::And, DType::i1, {0, 0, 1, 1}, {0, 1, 0, 1}) == std::vector<double>{0, 0, 0, 1});
    CHECK(binary(OpCode::Or, DType::i1, {0, 0, 1, 1}, {0, 1, 0, 1}) == std::vector<double>{0, 1, 1, 1});
    CHECK(unary(OpCode::Not, DType::i1, {0, 1}) == std::vector<double>{1, 0});
  }

  TEST_CASE("integer division by zero is a user error at the op") {
    std::string msg = user_error([] { binary(OpCode::Div, DType::i32, {1, 2}, {1, 0}); });
    CHECK(contains(msg, "user_kernel.cpp:42"));
    CHECK(contains(msg, "division by zero"));
    CHECK(contains(msg, "program (0, 0, 0)"));
    msg = user_error([] { binary(OpCode::Rem, DType::i32, {1}, {0}); });
    CHECK(contains(msg, "remainder by zero"));
  }

  TEST_CASE("cmp yields i1, with NaN unordered") {
    std::vector<double> x{1, 2, 3, kNaN}, y{2, 2, 2, 1};
    auto cmp = [&](ir::CmpPred p) {
      return apply({{{4}, x}, {{4}, y}}, DType::f32,
                   [p](Builder& b, std::vector<Value*> v) { return b.cmp(p, v[0], v[1]); });
    };
    auto lt = cmp(ir::CmpPred::lt);
    CHECK(lt.data == std::vector<double>{1, 0, 0, 0});
    CHECK(cmp(ir::CmpPred::le).data == std::vector<double>{1, 1, 0, 0});
    CHECK(cmp(ir::CmpPred::gt).data == std::vector<double>{0, 0, 1, 0});
    CHECK(cmp(ir::CmpPred::ge).data == std::vector<double>{0, 1, 1, 0});
    CHECK(cmp(ir::CmpPred::eq).data == std::vector<double>{0, 1, 0, 0});
    CHECK(cmp(ir::CmpPred::ne).data == std::vector<double>{1, 0, 1, 1});
  }

  TEST_CASE("select and scalar operands") {
    auto r = apply({{{3}, {1, 0, 1}}, {{3}, {10, 20, 30}}, {{3}, {-1, -2, -3}}}, DType::f32,
                   [](Builder& b, std::vector<Value*> v) {
                     return b.op(OpCode::Select, {b.cast(v[0], DType::i1), v[1], v[2]}, v[1]->type);
                   });
    CHECK(r.data == std::vector<double>{10, -2, 30});
    // A scalar operand applies to every element.
    r = apply({{{3}, {1, 2, 3}}, {{}, {0.5}}}, DType::f32,
              [](Builder& b, std::vector<Value*> v) { return b.binary(OpCode::Mul, v[0], v[1]); });
    CHECK(r.data == std::vector<double>{0.5, 1, 1.5});
  }

  TEST_CASE("cast") {
    auto cast = [](DType from, DType to, std::vector<double> x) {
      auto n = static_cast<int64_t>(x.size());
      return apply({{{n}, x}}, from, [to](Builder& b, std::vector<Value*> v) { return b.cast(v[0], to); }).data;
    };
    CHECK(cast(DType::f32, DType::i32, {-2.7, 2.7, 3e9}) == std::vector<double>{-2, 2, -1294967296});
    CHECK(cast(DType::i32, DType::bf16, {257, 259, -3}) == std::vector<double>{256, 260, -3});
    CHECK(cast(DType::f32, DType::i1, {0, 0.5, -2}) == std::vector<double>{0, 1, 1});
    CHECK(cast(DType::f32, DType::f16, {65520, 0.1}) == std::vector<double>{kInf, 0.0999755859375});
    CHECK(cast(DType::bf16, DType::f32, {1.00390625}) == std::vector<double>{1});
    CHECK(cast(DType::f64, DType::f32, {0.1}) == std::vector<double>{f32(0.1)});
  }

  // ---------------------------------------------------------------------------------------------
  // Shape ops, reductions, scans, dot

  TEST_CASE("splat, broadcast, expand_dims, reshape") {
    auto r = apply({{{}, {7}}}, DType::f32, [](Builder& b, std::vector<Value*> v) {
      Attrs a;
      a.shape = {2, 2};
      return b.op(OpCode::Splat, {v[0]}, Type::tile(DType::f32, {2, 2}), a);
    });
    CHECK(r.shape == std::vector<int64_t>{2, 2});
    CHECK(r.data == std::vector<double>(4, 7));
    auto bcast = [](std::vector<int64_t> from, std::vector<double> x) {
      return apply({{from, x}}, DType::f32,
                   [](Builder& b, std::vector<Value*> v) {
                     Attrs a;
                     a.shape = {2, 3};
                     return b.op(OpCode::Broadcast, {v[0]}, Type::tile(DType::f32, {2, 3}), a);
                   })
          .data;
    };
    CHECK(bcast({1, 3}, {1, 2, 3}) == std::vector<double>{1, 2, 3, 1, 2, 3});
    CHECK(bcast({2, 1}, {1, 2}) == std::vector<double>{1, 1, 1, 2, 2, 2});
    r = apply({{{3}, {1, 2, 3}}}, DType::f32, [](Builder& b, std::vector<Value*> v) {
      Attrs a;
      a.axis = 1;
      return b.op(OpCode::ExpandDims, {v[0]}, Type::tile(DType::f32, {3, 1}), a);
    });
    CHECK(r.shape == std::vector<int64_t>{3, 1});
    CHECK(r.data == std::vector<double>{1, 2, 3});
    r = apply({{{2, 3}, {0, 1, 2, 3, 4, 5}}}, DType::f32, [](Builder& b, std::vector<Value*> v) {
      Attrs a;
      a.shape = {3, 2};
      return b.op(OpCode::Reshape, {v[0]}, Type::tile(DType::f32, {3, 2}), a);
    });
    CHECK(r.shape == std::vector<int64_t>{3, 2});
    CHECK(r.data == std::vector<double>{0, 1, 2, 3, 4, 5});
  }

  TEST_CASE("transpose") {
    auto r = apply({{{2, 3}, {0, 1, 2, 3, 4, 5}}}, DType::f32, [](Builder& b, std::vector<Value*> v) {
      return b.transpose(v[0], {1, 0});
    });
    CHECK(r.shape == std::vector<int64_t>{3, 2});
    CHECK(r.data == std::vector<double>{0, 3, 1, 4, 2, 5});
    std::vector<double> x(24);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i);
    r = apply({{{2, 3, 4}, x}}, DType::f32, [](Builder& b, std::vector<Value*> v) {
      return b.transpose(v[0], {2, 0, 1});
    });
    REQUIRE(r.shape == std::vector<int64_t>{4, 2, 3});
    // result[i][j][l] = x[j][l][i]
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j)
        for (int l = 0; l < 3; ++l) CHECK(r.data[(i * 2 + j) * 3 + l] == x[(j * 3 + l) * 4 + i]);
  }

  TEST_CASE("reduce") {
    auto reduce = [](std::vector<int64_t> shape, std::vector<double> x, ir::ReduceKind kind, int64_t axis,
                     DType t = DType::f32) {
      return apply({{shape, x}}, t, [&](Builder& b, std::vector<Value*> v) {
        Attrs a;
        a.axis = axis;
        a.reduce = kind;
        std::vector<int64_t> out = v[0]->type.shape;
        out.erase(out.begin() + axis);
        return b.op(OpCode::Reduce, {v[0]}, Type::value(t, out), a);
      });
    };
    std::vector<double> x{1, 5, 3, 4, 2, 6};
    CHECK(reduce({2, 3}, x, ir::ReduceKind::sum, 0).data == std::vector<double>{5, 7, 9});
    CHECK(reduce({2, 3}, x, ir::ReduceKind::sum, 1).data == std::vector<double>{9, 12});
    CHECK(reduce({2, 3}, x, ir::ReduceKind::max, 1).data == std::vector<double>{5, 6});
    CHECK(reduce({2, 3}, x, ir::ReduceKind::min, 0).data == std::vector<double>{1, 2, 3});
    auto s = reduce({3}, {1, 2, 3}, ir::ReduceKind::sum, 0);
    CHECK(s.shape.empty());
    CHECK(s.data == std::vector<double>{6});
    // Accumulated in double, rounded once: a float accumulator would lose both small terms.
    const double tiny = std::ldexp(1.0, -24);
    CHECK(reduce({3}, {1, tiny, tiny}, ir::ReduceKind::sum, 0).data == std::vector<double>{1 + 2 * tiny});
    CHECK(reduce({3}, {-7, 2, 3}, ir::ReduceKind::max, 0, DType::i32).data == std::vector<double>{3});
  }

  TEST_CASE("scan: inclusive prefix and suffix sums") {
    auto scan = [](std::vector<int64_t> shape, std::vector<double> x, int64_t axis, bool reverse,
                   DType t = DType::f32) {
      return apply({{shape, x}}, t,
                   [&](Builder& b, std::vector<Value*> v) {
                     Attrs a;
                     a.axis = axis;
                     a.reverse = reverse;
                     return b.op(OpCode::Scan, {v[0]}, v[0]->type, a);
                   })
          .data;
    };
    std::vector<double> x{1, 2, 3, 4, 5, 6};
    CHECK(scan({2, 3}, x, 1, false) == std::vector<double>{1, 3, 6, 4, 9, 15});
    CHECK(scan({2, 3}, x, 1, true) == std::vector<double>{6, 5, 3, 15, 11, 6});
    CHECK(scan({2, 3}, x, 0, false) == std::vector<double>{1, 2, 3, 5, 7, 9});
    CHECK(scan({2, 3}, x, 0, true) == std::vector<double>{5, 7, 9, 4, 5, 6});
    // Each output is rounded, the running sum is not: 257 rounds to 256 in bf16, yet 256+1+1 = 258.
    CHECK(scan({3}, {256, 1, 1}, 0, false, DType::bf16) == std::vector<double>{256, 256, 258});
  }

  TEST_CASE("dot 64x64x64 matches a naive double reference") {
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> dist(-1, 1);
    for (DType t : {DType::f32, DType::bf16}) {
      CAPTURE(dtype_name(t));
      std::vector<double> a(64 * 64), bm(64 * 64);
      for (auto& e : a) e = dist(rng);
      for (auto& e : bm) e = dist(rng);
      auto r = apply({{{64, 64}, a}, {{64, 64}, bm}}, t,
                     [](Builder& b, std::vector<Value*> v) { return b.dot(v[0], v[1]); });
      REQUIRE(r.shape == std::vector<int64_t>{64, 64});
      int wrong = 0;
      for (int i = 0; i < 64; ++i)
        for (int j = 0; j < 64; ++j) {
          double acc = 0;
          for (int k = 0; k < 64; ++k) acc += round_to(t, a[i * 64 + k]) * round_to(t, bm[k * 64 + j]);
          if (r.data[i * 64 + j] != f32(acc)) ++wrong;
        }
      CHECK(wrong == 0);
    }
  }

}  // TEST_SUITE
