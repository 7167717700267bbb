// Interpreter tests, part 2: whole kernels. Memory (masking, transposed and strided views, storage
// formats), control flow, the grid and its threads, argument checks, and a chunked linear-attention
// kernel checked against its recurrent form.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "interp_test_util.h"

using namespace interp_test;

TEST_SUITE("interp") {
  // ---------------------------------------------------------------------------------------------
  // Load and store

  namespace {

  /// A [5,7] f32 tensor holding 100 + 10 * row + col, so every element is non-zero and identifiable.
  std::vector<float> grid57() {
    std::vector<float> x(35);
    for (int r = 0; r < 5; ++r)
      for (int c = 0; c < 7; ++c) x[r * 7 + c] = static_cast<float>(100 + 10 * r + c);
    return x;
  }

  /// Loads a [rows, cols] block of a rank-2 f32 tensor with the given addressing and returns it.
  std::vector<float> load_block(TensorArg src, std::vector<int64_t> offsets, std::vector<int64_t> limits,
                                std::vector<int64_t> dims, std::vector<int64_t> shape) {
    Builder b;
    Value* in = b.k.add_param("in", Type::tensor(DType::f32, static_cast<int>(src.shape.size())));
    Value* out = b.k.add_param("out", Type::tensor(DType::f32, static_cast<int>(shape.size())));
    Value* x = b.load(in, b.i32s(offsets), b.i32s(limits), dims, shape);
    std::vector<int64_t> out_dims;
    for (size_t a = 0; a < shape.size(); ++a) out_dims.push_back(static_cast<int64_t>(a));
    b.store(out, b.i32s(std::vector<int64_t>(shape.size(), 0)), b.i32s(shape), out_dims, x);
    std::vector<float> result(static_cast<size_t>(Type::tile(DType::f32, shape).numel()), -1.0f);
    std::vector<Arg> args{src, view(result.data(), DType::f32, shape)};
    interp::run(b.k, Grid{}, args);
    return result;
  }

  }  // namespace

  TEST_CASE("load masks against min(limit, dim), including negative offsets") {
    std::vector<float> x = grid57();
    TensorArg t = view(x.data(), DType::f32, {5, 7});
    // Rows 3..6 limited to < 4, cols 5..8 limited by the tensor's 7 columns.
    auto r = load_block(t, {3, 5}, {4, 100}, {0, 1}, {4, 4});
    CHECK(r == std::vector<float>{135, 136, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    // Negative offsets: tile (i, j) reads (i - 2, j - 1).
    r = load_block(t, {-2, -1}, {5, 7}, {0, 1}, {4, 3});
    CHECK(r == std::vector<float>{0, 0, 0, 0, 0, 0, 0, 100, 101, 0, 110, 111});
    // Everything out of bounds.
    r = load_block(t, {5, 0}, {5, 7}, {0, 1}, {2, 2});
    CHECK(r == std::vector<float>(4, 0));
    r = load_block(t, {0, 0}, {0, 7}, {0, 1}, {2, 2});
    CHECK(r == std::vector<float>(4, 0));
  }

  TEST_CASE("transposed and strided loads") {
    std::vector<float> x = grid57();
    // dims = [1, 0]: tile axis 0 walks the tensor's columns.
    auto r = load_block(view(x.data(), DType::f32, {5, 7}), {1, 2}, {5, 7}, {1, 0}, {3, 2});
    CHECK(r == std::vector<float>{112, 122, 113, 123, 114, 124});
    // A view of every other column: shape [5, 4], strides [7, 2].
    TensorArg every_other{x.data(), DType::f32, {5, 4}, {7, 2}};
    r = load_block(every_other, {1, 2}, {5, 4}, {0, 1}, {2, 3});
    CHECK(r == std::vector<float>{114, 116, 0, 124, 126, 0});
  }

  TEST_CASE("a tensor dim outside the tile stays at its offset and masks the whole block") {
    std::vector<float> x(2 * 3 * 4);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i + 1);
    TensorArg t = view(x.data(), DType::f32, {2, 3, 4});
    auto r = load_block(t, {0, 1, 0}, {2, 3, 4}, {0, 2}, {2, 4});  // t[:, 1, :]
    CHECK(r == std::vector<float>{5, 6, 7, 8, 17, 18, 19, 20});
    CHECK(load_block(t, {0, 3, 0}, {2, 3, 4}, {0, 2}, {2, 4}) == std::vector<float>(8, 0));
    CHECK(load_block(t, {0, 1, 0}, {2, 1, 4}, {0, 2}, {2, 4}) == std::vector<float>(8, 0));
    CHECK(load_block(t, {0, -1, 0}, {2, 3, 4}, {0, 2}, {2, 4}) == std::vector<float>(8, 0));
  }

  TEST_CASE("take: the row or column at a runtime index; an index outside the axis is an error") {
    std::vector<float> x = grid57();
    auto run_take = [&](int64_t axis, int64_t index) {
      Builder b;
      Value* in = b.k.add_param("in", Type::tensor(DType::f32, 2));
      Value* o = b.k.add_param("out", Type::tensor(DType::f32, 1));
      Value* t = b.load(in, b.i32s({0, 0}), b.i32s({5, 7}), {0, 1}, {4, 8});  // [4, 8], zero past col 6
      Attrs a;
      a.axis = axis;
      const int64_t n = axis == 0 ? 8 : 4;
      Value* slice = b.op(OpCode::Take, {t, b.i32(index)}, Type::tile(DType::f32, {n}), a);
      b.store(o, b.i32s({0}), b.i32s({n}), {0}, slice);
      std::vector<float> out(static_cast<size_t>(n), -1.0f);
      std::vector<Arg> args{view(x.data(), DType::f32, {5, 7}), view(out.data(), DType::f32, {n})};
      interp::run(b.k, Grid{}, args);
      return out;
    };
    CHECK(run_take(0, 2) == std::vector<float>{120, 121, 122, 123, 124, 125, 126, 0});
    CHECK(run_take(1, 6) == std::vector<float>{106, 116, 126, 136});
    CHECK_THROWS_WITH_AS(run_take(0, 4), doctest::Contains("take: index 4 is outside axis 0 of size 4"), UserError);
    CHECK_THROWS_AS(run_take(1, -1), UserError);
  }

  namespace {

  /// Runs `make` (which builds a tile from the [4, 8] block of grid57, zero past column 6) and returns
  /// the tile as stored, row-major.
  std::vector<float> run_assembly(const std::function<Value*(Builder&, Value*)>& make) {
    std::vector<float> x = grid57();
    Builder b;
    Value* in = b.k.add_param("in", Type::tensor(DType::f32, 2));
    Value* t = b.load(in, b.i32s({0, 0}), b.i32s({5, 7}), {0, 1}, {4, 8});
    Value* r = make(b, t);
    const std::vector<int64_t> shape = r->type.shape;
    std::vector<int64_t> dims;
    for (size_t d = 0; d < shape.size(); ++d) dims.push_back(static_cast<int64_t>(d));
    Value* o = b.k.add_param("out", Type::tensor(DType::f32, static_cast<int>(shape.size())));
    b.store(o, b.i32s(std::vector<int64_t>(shape.size(), 0)), b.i32s(shape), dims, r);
    std::vector<float> out(static_cast<size_t>(r->type.numel()), -1.0f);
    std::vector<Arg> args{view(x.data(), DType::f32, {5, 7}), view(out.data(), DType::f32, shape)};
    interp::run(b.k, Grid{}, args);
    return out;
  }

  Value* slice_op(Builder& b, Value* x, std::vector<int64_t> offsets, std::vector<int64_t> shape) {
    Attrs a;
    a.offsets = std::move(offsets);
    return b.op(OpCode::Slice, {x}, Type::tile(x->type.dtype, std::move(shape)), a);
  }

  }  // namespace

  TEST_CASE("slice: the block at static offsets, any rank") {
    // Rows 1..2, columns 2..4 of 100 + 10 r + c.
    CHECK(run_assembly([](Builder& b, Value* t) { return slice_op(b, t, {1, 2}, {2, 3}); }) ==
          std::vector<float>{112, 113, 114, 122, 123, 124});
    // The last column of the block is past the tensor (zero filled).
    CHECK(run_assembly([](Builder& b, Value* t) { return slice_op(b, t, {3, 5}, {1, 3}); }) ==
          std::vector<float>{135, 136, 0});
    // A 1-D slice of row 3.
    CHECK(run_assembly([](Builder& b, Value* t) {
            Value* row = b.op(OpCode::Take, {t, b.i32(3)}, Type::tile(DType::f32, {8}), [] {
              Attrs a;
              a.axis = 0;
              return a;
            }());
            return slice_op(b, row, {4}, {2});
          }) == std::vector<float>{134, 135});
  }

  TEST_CASE("concat: parts one after another along the axis") {
    auto along = [](int64_t axis) {
      return run_assembly([axis](Builder& b, Value* t) {
        Value* top_left = slice_op(b, t, {0, 0}, {2, 2});      // 100 101 / 110 111
        Value* bottom_right = slice_op(b, t, {2, 2}, {2, 2});  // 122 123 / 132 133
        Value* one = slice_op(b, t, {3, 0}, {1, 2});           // 130 131
        Attrs a;
        a.axis = axis;
        if (axis == 0)
          return b.op(OpCode::Concat, {top_left, bottom_right, one}, Type::tile(DType::f32, {5, 2}), a);
        return b.op(OpCode::Concat, {top_left, bottom_right}, Type::tile(DType::f32, {2, 4}), a);
      });
    };
    CHECK(along(0) == std::vector<float>{100, 101, 110, 111, 122, 123, 132, 133, 130, 131});
    CHECK(along(1) == std::vector<float>{100, 101, 122, 123, 110, 111, 132, 133});
  }

  TEST_CASE("place: a block written over a copy of the tile") {
    auto out = run_assembly([](Builder& b, Value* t) {
      Value* block = b.constant(DType::f32, -1, {2, 3});
      Attrs a;
      a.offsets = {1, 5};
      return b.op(OpCode::Place, {t, block}, t->type, a);
    });
    CHECK(out == std::vector<float>{100, 101, 102, 103, 104, 105, 106, 0,   //
                                    110, 111, 112, 113, 114, -1,  -1,  -1,  //
                                    120, 121, 122, 123, 124, -1,  -1,  -1,  //
                                    130, 131, 132, 133, 134, 135, 136, 0});
    // A 1-D place at the start; the operand itself is unchanged (the result is a new value).
    auto row = run_assembly([](Builder& b, Value* t) {
      Attrs take;
      take.axis = 0;
      Value* r = b.op(OpCode::Take, {t, b.i32(0)}, Type::tile(DType::f32, {8}), take);
      Attrs a;
      a.offsets = {0};
      Value* placed = b.op(OpCode::Place, {r, b.constant(DType::f32, 7, {2})}, r->type, a);
      Attrs c;
      c.axis = 0;
      return b.op(OpCode::Concat, {placed, r}, Type::tile(DType::f32, {16}), c);
    });
    CHECK(row == std::vector<float>{7, 7, 102, 103, 104, 105, 106, 0, 100, 101, 102, 103, 104, 105, 106, 0});
  }

  TEST_CASE("scalar load and store (no tile dims)") {
    std::vector<float> x = grid57(), out{-1, -1};
    Builder b;
    Value* in = b.k.add_param("in", Type::tensor(DType::f32, 2));
    Value* o = b.k.add_param("out", Type::tensor(DType::f32, 1));
    Value* inside = b.load(in, b.i32s({1, 2}), b.i32s({5, 7}), {}, {});
    Value* outside = b.load(in, b.i32s({1, 7}), b.i32s({5, 7}), {}, {});
    CHECK(inside->type.is_scalar());
    b.store(o, b.i32s({0}), b.i32s({2}), {}, inside);
    b.store(o, b.i32s({1}), b.i32s({2}), {}, outside);
    b.store(o, b.i32s({2}), b.i32s({2}), {}, inside);  // out of bounds: skipped
    std::vector<Arg> args{view(x.data(), DType::f32, {5, 7}), view(out.data(), DType::f32, {2})};
    interp::run(b.k, Grid{}, args);
    CHECK(out == std::vector<float>{112, 0});
  }

  TEST_CASE("store skips masked elements") {
    std::vector<float> out(3 * 5, -1);
    Builder b;
    Value* o = b.k.add_param("out", Type::tensor(DType::f32, 2));
    Value* tile = b.op(OpCode::Iota, {}, Type::tile(DType::i32, {16}));
    Attrs a;
    a.shape = {4, 4};
    tile = b.cast(b.op(OpCode::Reshape, {tile}, Type::tile(DType::i32, {4, 4}), a), DType::f32);
    b.store(o, b.i32s({1, 3}), b.i32s({3, 100}), {0, 1}, tile);  // rows 1..2, cols 3..4
    b.store(o, b.i32s({-3, -2}), b.i32s({3, 5}), {0, 1}, tile);  // tile (3, 2) and (3, 3) land on row 0
    std::vector<Arg> args{view(out.data(), DType::f32, {3, 5})};
    interp::run(b.k, Grid{}, args);
    CHECK(out == std::vector<float>{14, 15, -1, -1, -1,  //
                                    -1, -1, -1, 0, 1,    //
                                    -1, -1, -1, 4, 5});
  }

  TEST_CASE("load and store in every storage format") {
    // Each tensor is copied through a tile of its own dtype; bytes must come back unchanged.
    std::vector<uint8_t> b1{0, 1, 1, 0};
    std::vector<int32_t> i32v{-2147483647 - 1, -1, 7, 2147483647};
    std::vector<int64_t> i64v{-5, 1LL << 40, 3, 0};
    std::vector<uint16_t> f16v{0x3C00, 0x0001, 0xFC00, 0x7BFF}, bf16v{0x3F80, 0x0001, 0xFF80, 0x4049};
    std::vector<float> f32v{0.1f, -2, 1e-40f, 3e38f};
    std::vector<double> f64v{0.1, -2, 1e-300, 1e300};
    auto roundtrip = [](void* data, size_t bytes, DType t) {
      std::vector<uint8_t> copy(bytes, 0xAB);
      Builder b;
      Value* in = b.k.add_param("in", Type::tensor(t, 1));
      Value* out = b.k.add_param("out", Type::tensor(t, 1));
      b.store(out, b.i32s({0}), b.i32s({4}), {0}, b.load(in, b.i32s({0}), b.i32s({4}), {0}, {4}));
      std::vector<Arg> args{view(data, t, {4}), view(copy.data(), t, {4})};
      interp::run(b.k, Grid{}, args);
      return std::memcmp(copy.data(), data, bytes) == 0;
    };
    CHECK(roundtrip(b1.data(), 4, DType::i1));
    CHECK(roundtrip(i32v.data(), 16, DType::i32));
    CHECK(roundtrip(i64v.data(), 32, DType::i64));
    CHECK(roundtrip(f16v.data(), 8, DType::f16));
    CHECK(roundtrip(bf16v.data(), 8, DType::bf16));
    CHECK(roundtrip(f32v.data(), 16, DType::f32));
    CHECK(roundtrip(f64v.data(), 32, DType::f64));
  }

  TEST_CASE("store converts to the tensor's format") {
    std::vector<float> src{1.00390625f, 2.7f, -2.7f, 65520.f};
    std::vector<uint16_t> bf(4), h(4);
    std::vector<int32_t> i(4);
    std::vector<uint8_t> flag(4);
    Builder b;
    Value* in = b.k.add_param("in", Type::tensor(DType::f32, 1));
    Value* x = b.load(in, b.i32s({0}), b.i32s({4}), {0}, {4});
    for (auto [name, t] : {std::pair{"bf", DType::bf16}, {"h", DType::f16}, {"i", DType::i32}, {"flag", DType::i1}})
      b.store(b.k.add_param(name, Type::tensor(t, 1)), b.i32s({0}), b.i32s({4}), {0}, x);
    std::vector<Arg> args{view(src.data(), DType::f32, {4}), view(bf.data(), DType::bf16, {4}),
                          view(h.data(), DType::f16, {4}), view(i.data(), DType::i32, {4}),
                          view(flag.data(), DType::i1, {4})};
    interp::run(b.k, Grid{}, args);
    CHECK(bf[0] == 0x3F80);
    CHECK(interp::from_bf16_bits(bf[1]) == 2.703125);
    CHECK(h[3] == 0x7C00);
    CHECK(i == std::vector<int32_t>{1, 2, -2, 65520});
    CHECK(flag == std::vector<uint8_t>{1, 1, 1, 1});
  }

  // ---------------------------------------------------------------------------------------------
  // Control flow

  namespace {

  /// Runs a kernel whose only parameter is an f64 output of `n` elements; returns the output.
  std::vector<double> run_out(Builder& b, size_t n) {
    std::vector<double> o(n, -1);
    std::vector<Arg> args{view(o.data(), DType::f64, {static_cast<int64_t>(n)})};
    interp::run(b.k, Grid{}, args);
    return o;
  }

  void store_scalars(Builder& b, Value* out, std::vector<Value*> vs) {
    for (size_t i = 0; i < vs.size(); ++i)
      b.store(out, b.i32s({static_cast<int64_t>(i)}), b.i32s({static_cast<int64_t>(vs.size())}), {},
              b.cast(vs[i], DType::f64));
  }

  }  // namespace

  TEST_CASE("for: carried values, step, iv") {
    Builder b;
    Value* out = b.k.add_param("out", Type::tensor(DType::f64, 1));
    // Fibonacci: (a, b) -> (b, a + b), ten times; and the sum of iv over 0, 3, 6, 9.
    auto fib = b.for_loop(b.i32(0), b.i32(10), b.i32(1), {b.i32(0), b.i32(1)}, [&](Value*, std::vector<Value*> c) {
      return std::vector<Value*>{c[1], b.binary(OpCode::Add, c[0], c[1])};
    });
    auto sum = b.for_loop(b.i32(0), b.i32(10), b.i32(3), {b.i32(0)}, [&](Value* iv, std::vector<Value*> c) {
      return std::vector<Value*>{b.binary(OpCode::Add, c[0], iv)};
    });
    // Zero iterations (lo == hi and lo > hi): the results are the inits.
    auto none = b.for_loop(b.i32(5), b.i32(5), b.i32(1), {b.i32(7)}, [&](Value*, std::vector<Value*> c) {
      return std::vector<Value*>{b.binary(OpCode::Add, c[0], b.i32(1))};
    });
    auto back = b.for_loop(b.i32(5), b.i32(-5), b.i32(1), {b.i32(8)}, [&](Value*, std::vector<Value*> c) {
      return std::vector<Value*>{b.binary(OpCode::Add, c[0], b.i32(1))};
    });
    // Nested: sum over i < 3, j < 4 of i * j, with a tile carried through the outer loop.
    Value* zeros = b.constant(DType::f32, 0, {2});
    auto nested = b.for_loop(b.i32(0), b.i32(3), b.i32(1), {b.i32(0), zeros}, [&](Value* i, std::vector<Value*> c) {
      auto inner = b.for_loop(b.i32(0), b.i32(4), b.i32(1), {c[0]}, [&](Value* j, std::vector<Value*> ci) {
        return std::vector<Value*>{b.binary(OpCode::Add, ci[0], b.binary(OpCode::Mul, i, j))};
      });
      return std::vector<Value*>{inner[0], b.binary(OpCode::Add, c[1], b.constant(DType::f32, 0.5, {2}))};
    });
    Attrs sum_axis;
    Value* tile_sum = b.op(OpCode::Reduce, {nested[1]}, Type::scalar(DType::f32), sum_axis);
    store_scalars(b, out, {fib[0], fib[1], sum[0], none[0], back[0], nested[0], tile_sum});
    CHECK(run_out(b, 7) == std::vector<double>{55, 89, 18, 7, 8, 18, 3});
  }

  TEST_CASE("for: a step that is not positive is a user error at the loop") {
    for (int64_t step : {0, -1}) {
      Builder b;
      Value* out = b.k.add_param("out", Type::tensor(DType::f64, 1));
      auto r =
          b.for_loop(b.i32(0), b.i32(4), b.i32(step), {b.i32(0)}, [&](Value*, std::vector<Value*> c) { return c; });
      store_scalars(b, out, {r[0]});
      std::string msg = user_error([&] { run_out(b, 1); });
      CHECK(contains(msg, "user_kernel.cpp:42"));
      CHECK(contains(msg, "step must be positive"));
    }
  }

  TEST_CASE("if: both branches") {
    auto run_if = [](double flag) {
      Builder b;
      Value* cond_in = b.k.add_param("flag", Type::scalar(DType::f32));
      Value* out = b.k.add_param("out", Type::tensor(DType::f64, 1));
      Value* cond = b.cmp(ir::CmpPred::gt, cond_in, b.constant(DType::f32, 0));
      ir::Op* op = ir::append_op(b.k, *b.block, OpCode::If, {cond},
                                 {Type::scalar(DType::i32), Type::tile(DType::f32, {2})}, {}, kLoc);
      b.region(op, {}, [&](std::vector<Value*>) {
        return std::vector<Value*>{b.i32(1), b.constant(DType::f32, 10, {2})};
      });
      b.region(op, {}, [&](std::vector<Value*>) {
        return std::vector<Value*>{
            b.i32(2), b.binary(OpCode::Mul, b.constant(DType::f32, 3, {2}), b.constant(DType::f32, 7, {2}))};
      });
      Attrs sum_axis;
      store_scalars(b, out,
                    {op->results[0], b.op(OpCode::Reduce, {op->results[1]}, Type::scalar(DType::f32), sum_axis)});
      std::vector<double> o(2, -1);
      std::vector<Arg> args{flag, view(o.data(), DType::f64, {2})};
      interp::run(b.k, Grid{}, args);
      return o;
    };
    CHECK(run_if(1.0) == std::vector<double>{1, 20});
    CHECK(run_if(-1.0) == std::vector<double>{2, 42});
  }

  // ---------------------------------------------------------------------------------------------
  // The grid, arguments, malformed IR

  namespace {

  /// Each program (x, y, z) writes x + 10 y + 100 z + 1000 * (num_programs x + y + z) to out[z][y][x].
  void build_grid_kernel(Builder& b) {
    Value* out = b.k.add_param("out", Type::tensor(DType::i32, 3));
    Value* x = b.axis_op(OpCode::ProgramId, {}, 0);
    Value* y = b.axis_op(OpCode::ProgramId, {}, 1);
    Value* z = b.axis_op(OpCode::ProgramId, {}, 2);
    Value* n =
        b.binary(OpCode::Add, b.axis_op(OpCode::NumPrograms, {}, 0),
                 b.binary(OpCode::Add, b.axis_op(OpCode::NumPrograms, {}, 1), b.axis_op(OpCode::NumPrograms, {}, 2)));
    Value* v = b.binary(OpCode::Add, x, b.binary(OpCode::Mul, b.i32(10), y));
    v = b.binary(OpCode::Add, v, b.binary(OpCode::Mul, b.i32(100), z));
    v = b.binary(OpCode::Add, v, b.binary(OpCode::Mul, b.i32(1000), n));
    Value* big = b.i32(1 << 20);
    b.store(out, {z, y, x}, {big, big, big}, {}, v);
  }

  }  // namespace

  TEST_CASE("grid: every program runs once with its program_id, on any number of threads") {
    Builder b;
    build_grid_kernel(b);
    for (int threads : {1, 3, 16}) {
      CAPTURE(threads);
      std::vector<int32_t> out(2 * 2 * 3, -1);
      std::vector<Arg> args{view(out.data(), DType::i32, {2, 2, 3})};
      interp::run(b.k, Grid{3, 2, 2}, args, interp::RunOptions{threads});
      for (int z = 0; z < 2; ++z)
        for (int y = 0; y < 2; ++y)
          for (int x = 0; x < 3; ++x) CHECK(out[(z * 2 + y) * 3 + x] == x + 10 * y + 100 * z + 7000);
    }
    std::vector<int32_t> untouched(12, -1);
    std::vector<Arg> args{view(untouched.data(), DType::i32, {2, 2, 3})};
    interp::run(b.k, Grid{0, 2, 2}, args);  // an empty grid runs nothing
    CHECK(untouched == std::vector<int32_t>(12, -1));
  }

  TEST_CASE("grid: the error reported is the lowest failing program's, whatever the threads") {
    // Programs 3 and 6 divide by zero.
    Builder b;
    Value* out = b.k.add_param("out", Type::tensor(DType::i32, 1));
    Value* pid = b.axis_op(OpCode::ProgramId, {}, 0);
    Value* is_first = b.cast(b.cmp(ir::CmpPred::eq, pid, b.i32(0)), DType::i32);
    Value* divisor = b.binary(OpCode::Add, b.binary(OpCode::Rem, pid, b.i32(3)), is_first);
    Value* q = b.binary(OpCode::Div, b.i32(12), divisor);
    b.store(out, {pid}, {b.i32(8)}, {}, q);
    for (int threads : {1, 2, 4, 8}) {
      std::vector<int32_t> o(8);
      std::vector<Arg> args{view(o.data(), DType::i32, {8})};
      std::string msg = user_error([&] { interp::run(b.k, Grid{8}, args, interp::RunOptions{threads}); });
      CHECK(contains(msg, "program (3, 0, 0)"));
    }
  }

  TEST_CASE("arguments are checked against the parameters") {
    Builder b;
    b.k.name = "scale_rows";
    b.k.add_param("x", Type::tensor(DType::bf16, 2));
    b.k.add_param("s", Type::scalar(DType::f32));
    std::vector<uint16_t> data(6);
    TensorArg good = view(data.data(), DType::bf16, {2, 3});
    auto error = [&](std::vector<Arg> args, Grid grid = {}) {
      return user_error([&] { interp::run(b.k, grid, args); });
    };
    interp::run(b.k, Grid{}, std::vector<Arg>{good, 2.0});  // fine
    std::string msg = error({good});
    CHECK(contains(msg, "'scale_rows' takes 2 arguments, got 1"));
    msg = error({2.0, 2.0});
    CHECK(contains(msg, "parameter 'x'"));
    CHECK(contains(msg, "got a scalar"));
    msg = error({good, good});
    CHECK(contains(msg, "parameter 's'"));
    CHECK(contains(msg, "got a tensor"));
    msg = error({view(data.data(), DType::f16, {2, 3}), 2.0});
    CHECK(contains(msg, "got a f16 tensor"));
    msg = error({view(data.data(), DType::bf16, {6}), 2.0});
    CHECK(contains(msg, "1 dims"));
    msg = error({TensorArg{data.data(), DType::bf16, {2, 3}, {3}}, 2.0});
    CHECK(contains(msg, "1 strides"));
    msg = error({TensorArg{nullptr, DType::bf16, {2, 3}, {3, 1}}, 2.0});
    CHECK(contains(msg, "parameter 'x'"));
    CHECK(contains(msg, "null"));
    interp::run(b.k, Grid{}, std::vector<Arg>{TensorArg{nullptr, DType::bf16, {0, 3}, {3, 1}}, 2.0});  // empty: fine
    msg = error({TensorArg{data.data(), DType::bf16, {-2, 3}, {3, 1}}, 2.0});
    CHECK(contains(msg, "negative"));
    msg = error({good, 2.0}, Grid{-1, 1, 1});
    CHECK(contains(msg, "negative size"));
  }

  TEST_CASE("malformed IR is an internal error, not a crash") {
    Builder b;
    Value* out = b.k.add_param("out", Type::tensor(DType::f64, 1));
    Value* undefined = b.k.new_value(Type::scalar(DType::f64));
    b.store(out, b.i32s({0}), b.i32s({1}), {}, undefined);
    std::vector<double> o(1);
    std::vector<Arg> args{view(o.data(), DType::f64, {1})};
    CHECK_THROWS_AS(interp::run(b.k, Grid{}, args), InternalError);
  }

  // ---------------------------------------------------------------------------------------------
  // A whole kernel: chunked causal linear attention, o_t = q_t sum_{s <= t} k_s^T v_s

  namespace {

  constexpr int64_t kB = 2, kT = 1000, kH = 2, kD = 64, kChunk = 64;

  /// q, k, v: bf16 [B, T, H, D]; o: f32 [B, T, H, D]; grid (H, B). Per chunk of 64 steps:
  /// o = q S + tril(q k^T) v, then S += k^T v, with S carried through the loop.
  void build_linear_attention(Builder& b) {
    Value* q = b.k.add_param("q", Type::tensor(DType::bf16, 4));
    Value* k = b.k.add_param("k", Type::tensor(DType::bf16, 4));
    Value* v = b.k.add_param("v", Type::tensor(DType::bf16, 4));
    Value* o = b.k.add_param("o", Type::tensor(DType::f32, 4));
    Value* h = b.axis_op(OpCode::ProgramId, {}, 0);
    Value* bi = b.axis_op(OpCode::ProgramId, {}, 1);
    std::vector<Value*> limits;
    for (int d = 0; d < 4; ++d) limits.push_back(b.axis_op(OpCode::Dim, {q}, d));
    // The causal mask: row >= col.
    Value* iota = b.op(OpCode::Iota, {}, Type::tile(DType::i32, {kChunk}));
    Attrs rows_at, cols_at, full;
    rows_at.axis = 1;
    cols_at.axis = 0;
    full.shape = {kChunk, kChunk};
    Value* rows = b.op(OpCode::ExpandDims, {iota}, Type::tile(DType::i32, {kChunk, 1}), rows_at);
    Value* cols = b.op(OpCode::ExpandDims, {iota}, Type::tile(DType::i32, {1, kChunk}), cols_at);
    rows = b.op(OpCode::Broadcast, {rows}, Type::tile(DType::i32, {kChunk, kChunk}), full);
    cols = b.op(OpCode::Broadcast, {cols}, Type::tile(DType::i32, {kChunk, kChunk}), full);
    Value* causal = b.cmp(ir::CmpPred::ge, rows, cols);
    Value* zeros = b.constant(DType::f32, 0, {kChunk, kChunk});

    b.for_loop(b.i32(0), limits[1], b.i32(kChunk), {b.constant(DType::f32, 0, {kD, kD})},
               [&](Value* t0, std::vector<Value*> carried) {
                 Value* state = carried[0];
                 std::vector<Value*> offsets{bi, t0, h, b.i32(0)};
                 auto chunk = [&](Value* x) {
                   return b.cast(b.load(x, offsets, limits, {1, 3}, {kChunk, kD}), DType::f32);
                 };
                 Value *qc = chunk(q), *kc = chunk(k), *vc = chunk(v);
                 Value* kt = b.transpose(kc, {1, 0});
                 Value* scores = b.op(OpCode::Select, {causal, b.dot(qc, kt), zeros}, zeros->type);
                 Value* out = b.binary(OpCode::Add, b.dot(qc, state), b.dot(scores, vc));
                 b.store(o, offsets, limits, {1, 3}, out);
                 return std::vector<Value*>{b.binary(OpCode::Add, state, b.dot(kt, vc))};
               });
  }

  }  // namespace

  TEST_CASE("chunked linear attention matches the recurrent form, on one thread and several") {
    Builder b;
    build_linear_attention(b);
    const size_t n = static_cast<size_t>(kB * kT * kH * kD);
    std::mt19937 rng(3);
    std::uniform_real_distribution<double> dist(-1, 1);
    std::vector<uint16_t> q(n), k(n), v(n);
    for (size_t i = 0; i < n; ++i) {
      q[i] = interp::bf16_bits(dist(rng) * 0.125);
      k[i] = interp::bf16_bits(dist(rng));
      v[i] = interp::bf16_bits(dist(rng));
    }
    std::vector<float> o1(n, -1), o2(n, -1);
    const std::vector<int64_t> shape{kB, kT, kH, kD};
    std::vector<Arg> args{view(q.data(), DType::bf16, shape), view(k.data(), DType::bf16, shape),
                          view(v.data(), DType::bf16, shape), view(o1.data(), DType::f32, shape)};
    interp::run(b.k, Grid{kH, kB}, args, interp::RunOptions{1});
    args[3] = view(o2.data(), DType::f32, shape);
    interp::run(b.k, Grid{kH, kB}, args);
    CHECK(std::memcmp(o1.data(), o2.data(), n * sizeof(float)) == 0);

    // The recurrent form in double: S_t = S_{t-1} + k_t^T v_t, o_t = q_t S_t.
    double max_err = 0, max_ref = 0;
    std::vector<double> state(kD * kD);
    for (int64_t bi = 0; bi < kB; ++bi)
      for (int64_t h = 0; h < kH; ++h) {
        std::fill(state.begin(), state.end(), 0.0);
        for (int64_t t = 0; t < kT; ++t) {
          const size_t row = static_cast<size_t>(((bi * kT + t) * kH + h) * kD);
          for (int64_t i = 0; i < kD; ++i)
            for (int64_t j = 0; j < kD; ++j)
              state[i * kD + j] += interp::from_bf16_bits(k[row + i]) * interp::from_bf16_bits(v[row + j]);
          for (int64_t j = 0; j < kD; ++j) {
            double ref = 0;
            for (int64_t i = 0; i < kD; ++i) ref += interp::from_bf16_bits(q[row + i]) * state[i * kD + j];
            max_err = std::max(max_err, std::fabs(ref - o1[row + j]));
            max_ref = std::max(max_ref, std::fabs(ref));
          }
        }
      }
    CHECK(max_ref > 1);
    CHECK(max_err < 1e-5 * max_ref);
  }

}  // TEST_SUITE
