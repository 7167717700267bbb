// Error tests: each case is a DSL program that makes one mistake. Each must raise a UserError (never
// an InternalError or a crash) whose location is the line of the mistake in this file.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <string>

#include "linac/dsl.h"
#include "linac/runtime.h"

using namespace linac;
using namespace linac::dsl;

namespace {

/// Runs `fn`, which must throw a UserError located at `line` of this file whose message contains
/// `needle`.
template <class F>
void expect_user_error(F&& fn, unsigned line, const std::string& needle) {
  try {
    fn();
    FAIL("no error was raised");
  } catch (const UserError& e) {
    INFO("message: " << e.what());
    CHECK(e.loc().line == line);
    CHECK(std::string(e.loc().file).find("test_dsl_errors.cpp") != std::string::npos);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
    CHECK(std::string(e.what()).find("test_dsl_errors.cpp:" + std::to_string(line)) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("error: dot with mismatched inner dimensions") {
  KernelBuilder kb("e");
  Tile a = zeros({64, 32}, DType::bf16), b = zeros({64, 64}, DType::bf16);
  expect_user_error([&] { dot(a, b); }, __LINE__, "inner");
}

TEST_CASE("error: dot with operands of different dtypes") {
  KernelBuilder kb("e");
  Tile a = zeros({64, 64}, DType::bf16), b = zeros({64, 64}, DType::f16);
  expect_user_error([&] { dot(a, b); }, __LINE__, "dot");
}

TEST_CASE("error: dot of a rank-1 tile") {
  KernelBuilder kb("e");
  Tile a = zeros({64}, DType::bf16), b = zeros({64, 64}, DType::bf16);
  expect_user_error([&] { dot(a, b); }, __LINE__, "dot");
}

TEST_CASE("error: adding tiles of different dtypes") {
  KernelBuilder kb("e");
  Tile a = zeros({16, 16}, DType::f32), b = zeros({16, 16}, DType::bf16);
  expect_user_error([&] { (void)(a + b); }, __LINE__, "`+`: operands have different types");
}

TEST_CASE("error: load with the wrong number of offsets for the tensor's rank") {
  KernelBuilder kb("e");
  Tensor q = kb.tensor("q", DType::bf16, 4);
  expect_user_error([&] { load(q, {0, 0, 0}, {kIndex, 64, kIndex, 64}); }, __LINE__, "rank 4");
}

TEST_CASE("error: prefetch on a store or on a scalar load") {
  KernelBuilder kb("e");
  Tensor q = kb.tensor("q", DType::bf16, 2);
  Tile x = zeros({16, 16}, DType::bf16);
  AccessOptions prefetched;
  prefetched.prefetch = true;
  expect_user_error([&] { store(q, {0, 0}, {16, 16}, x, prefetched); }, __LINE__, "store: prefetch");
  expect_user_error([&] { load(q, {0, 0}, {kIndex, kIndex}, prefetched); }, __LINE__, "scalar");
}

TEST_CASE("error: loop-carried value changes shape") {
  KernelBuilder kb("e");
  Tile s = zeros({64, 64}, DType::f32);
  Tile wide = zeros({64, 32}, DType::f32);
  expect_user_error([&] { for_range(0, 4, [&](Tile) { s = wide; }, s); }, __LINE__, "changes type");
}

TEST_CASE("error: if branch changes a variable's type") {
  KernelBuilder kb("e");
  Tile s = zeros({16}, DType::f32);
  Tile c = program_id(0) == 0;
  expect_user_error([&] { if_then(c, [&] { s = s.to(DType::bf16); }, s); }, __LINE__, "if");
}

TEST_CASE("error: shapes that do not broadcast") {
  KernelBuilder kb("e");
  Tile a = zeros({64}, DType::f32), b = zeros({32}, DType::f32);
  expect_user_error([&] { (void)(a * b); }, __LINE__, "broadcast");
}

TEST_CASE("error: reduction axis out of range") {
  KernelBuilder kb("e");
  Tile a = zeros({8, 8}, DType::f32);
  expect_user_error([&] { sum(a, 2); }, __LINE__, "axis");
}

TEST_CASE("error: where with a float condition") {
  KernelBuilder kb("e");
  Tile c = zeros({8}, DType::f32), a = zeros({8}, DType::f32);
  expect_user_error([&] { where(c, a, 1.0); }, __LINE__, "where: the condition must be i1");
}

TEST_CASE("error: exp of an integer tile") {
  KernelBuilder kb("e");
  Tile i = iota(16);
  expect_user_error([&] { exp(i); }, __LINE__, "exp");
}

TEST_CASE("error: storing a tile of another dtype than the tensor's") {
  KernelBuilder kb("e");
  Tensor o = kb.tensor("o", DType::bf16, 2);
  Tile x = zeros({16, 16}, DType::f32);
  expect_user_error([&] { store(o, {0, 0}, {16, 16}, x); }, __LINE__, "store");
}

TEST_CASE("error: storing a tile whose shape is not the block's") {
  KernelBuilder kb("e");
  Tensor o = kb.tensor("o", DType::f32, 2);
  Tile x = zeros({16, 32}, DType::f32);
  expect_user_error([&] { store(o, {0, 0}, {16, 16}, x); }, __LINE__, "store");
}

TEST_CASE("error: a fractional number mixed with an integer tile") {
  KernelBuilder kb("e");
  Tile i = iota(8);
  expect_user_error([&] { (void)(i * 0.5); }, __LINE__, "integer");
}

TEST_CASE("error: reshape to a different number of elements") {
  KernelBuilder kb("e");
  Tile a = zeros({8, 8}, DType::f32);
  expect_user_error([&] { reshape(a, {8, 4}); }, __LINE__, "reshape");
}

TEST_CASE("error: a value from inside a loop used after it") {
  KernelBuilder kb("e");
  Tensor o = kb.tensor("o", DType::f32, 1);
  Tile inner;
  for_range(0, 4, [&](Tile i) { inner = zeros({16}, DType::f32) + i.to(DType::f32); });
  store(o, {0}, {16}, inner);
  unsigned line = __LINE__ - 1;
  expect_user_error([&] { kb.finish(); }, line, "list the variable after the body");
}

TEST_CASE("error: an empty Tile used as an operand") {
  KernelBuilder kb("e");
  Tile never_assigned;
  expect_user_error([&] { sum(never_assigned, 0); }, __LINE__, "empty Tile");
}

TEST_CASE("error: DSL call outside of a kernel") {
  expect_user_error([&] { program_id(0); }, __LINE__, "outside of a kernel");
}

TEST_CASE("error: a transposed load of a 1-D block") {
  KernelBuilder kb("e");
  Tensor q = kb.tensor("q", DType::f32, 2);
  expect_user_error([&] { load(q, {0, 0}, {kIndex, 16}, {.limits = {}, .transpose = true}); }, __LINE__, "transpose");
}

TEST_CASE("error: program_id of a grid axis that does not exist") {
  KernelBuilder kb("e");
  expect_user_error([&] { program_id(3); }, __LINE__, "program_id");
}

TEST_CASE("error: a slice past the end of its axis") {
  KernelBuilder kb("e");
  Tile a = zeros({64, 32}, DType::f32);
  expect_user_error([&] { slice(a, 1, 24, 16); }, __LINE__, "slice: 16 elements from 24 do not fit axis 1");
}

TEST_CASE("error: a slice of a scalar, and of an axis the tile does not have") {
  KernelBuilder kb("e");
  Tile s = constant(1, DType::f32);
  expect_user_error([&] { slice(s, 0, 0, 1); }, __LINE__, "slice: the operand is a scalar");
  Tile a = zeros({8}, DType::f32);
  expect_user_error([&] { slice(a, 1, 0, 4); }, __LINE__, "slice: axis 1 is out of range");
}

TEST_CASE("error: concat of tiles that differ off the joined axis") {
  KernelBuilder kb("e");
  Tile a = zeros({16, 16}, DType::f32), b = zeros({16, 8}, DType::f32);
  expect_user_error([&] { concat({a, b}, 0); }, __LINE__, "concat: operand #1 is tile<16x8xf32>");
}

TEST_CASE("error: concat of tiles of two dtypes") {
  KernelBuilder kb("e");
  Tile a = zeros({16, 16}, DType::f32), b = zeros({16, 16}, DType::bf16);
  expect_user_error([&] { concat({a, b}, 1); }, __LINE__, "one dtype and rank");
}

TEST_CASE("error: concat of nothing") {
  KernelBuilder kb("e");
  expect_user_error([&] { concat({}, 0); }, __LINE__, "concat: no tiles");
}

TEST_CASE("error: place of a block that leaves the tile") {
  KernelBuilder kb("e");
  Tile big = zeros({32, 32}, DType::f32), blk = zeros({16, 16}, DType::f32);
  expect_user_error([&] { place(big, blk, {0, 24}); }, __LINE__, "place: the block [16, 16] at offsets [0, 24]");
}

TEST_CASE("error: place with one offset for a 2-D tile") {
  KernelBuilder kb("e");
  Tile big = zeros({32, 32}, DType::f32), blk = zeros({16, 16}, DType::f32);
  expect_user_error([&] { place(big, blk, {16}); }, __LINE__, "offsets [16] has 1 entries");
}

TEST_CASE("error: a rank-3 tile compiled for the GPU names the line that made it") {
  KernelBuilder kb("e");
  Tensor q = kb.tensor("q", DType::f32, 2);
  Tensor o = kb.tensor("o", DType::f32, 2);
  Tile Q = load(q, {0, 0}, {16, 32});
  Tile products = expand_dims(Q, 1) * expand_dims(Q, 0);  // [16, 16, 32]
  const unsigned line = __LINE__ - 1;
  // Summed directly, the product would be fused into the sum; scanned first, it would have to be held.
  Tile scores = sum(cumsum(products, 2), 2);
  store(o, {0, 0}, {16, 16}, scores);
  auto k = kb.finish();  // the interpreter runs any rank
  expect_user_error([&] { linac::runtime::compile(*k); }, line, "the GPU backend holds tiles of rank 1 or 2");
}

TEST_CASE("error: a kernel whose shared memory exceeds the target's names its largest buffer's line") {
  // The dot's f32 operands go through shared memory: 2 x 128 x 256 x 4 bytes = 256 KB > sm_90a's 227 KB
  // (and sm_80's 163 KB), known when compiling, with no GPU.
  KernelBuilder kb("e");
  Tensor a = kb.tensor("a", DType::f32, 2);
  Tensor b = kb.tensor("b", DType::f32, 2);
  Tensor o = kb.tensor("o", DType::f32, 2);
  Tile A = load(a, {0, 0}, {128, 256});
  Tile B = load(b, {0, 0}, {256, 128});
  const unsigned first = __LINE__ - 2;
  store(o, {0, 0}, {128, 128}, dot(A, B));
  auto k = kb.finish();
  for (auto arch : {linac::runtime::Arch::sm_90a, linac::runtime::Arch::sm_80}) {
    try {
      linac::runtime::compile(*k, arch);
      FAIL("no error was raised");
    } catch (const UserError& e) {
      const std::string msg = e.what();
      INFO("message: " << msg);
      CHECK((e.loc().line == first || e.loc().line == first + 1));
      CHECK(msg.find("needs") != std::string::npos);
      CHECK(msg.find("bytes of shared memory; " + std::string(arch == linac::runtime::Arch::sm_80 ? "sm_80" : "sm_90a") +
                     " gives a block at most") != std::string::npos);
      CHECK(msg.find("tile<128x256xf32> at ") != std::string::npos);
      CHECK(msg.find("test_dsl_errors.cpp:" + std::to_string(first)) != std::string::npos);
    }
  }
}

// ---- Tiles outlive their builder, or cross into another kernel -------------------------------------

namespace {
/// Records a kernel and returns one of its Tiles; the builder is gone when it returns.
Tile tile_of_a_finished_kernel() {
  KernelBuilder kb("gone");
  Tile t = zeros({16, 32}, DType::f32);
  kb.finish();
  return t;
}
}  // namespace

TEST_CASE("error: a Tile used after its builder is gone") {
  Tile stale = tile_of_a_finished_kernel();
  KernelBuilder kb("e");
  Tile fresh = zeros({16, 32}, DType::f32);
  expect_user_error([&] { (void)(fresh * stale); }, __LINE__, "whose KernelBuilder is gone");
  expect_user_error([&] { sum(stale, 0); }, __LINE__, "is a Tile whose KernelBuilder is gone");
  // Its type cannot be read either (it would read freed memory: "tile<94615877630018x32xf32>").
  expect_user_error([&] { (void)stale.shape(); }, __LINE__, "this is a Tile whose KernelBuilder is gone");
}

TEST_CASE("error: a Tile used after its builder is gone, with no builder alive") {
  Tile stale = tile_of_a_finished_kernel();
  expect_user_error([&] { (void)stale.dtype(); }, __LINE__, "KernelBuilder is gone");
}

TEST_CASE("error: a Tensor used after its builder is gone") {
  Tensor stale;
  {
    KernelBuilder old("old");
    stale = old.tensor("x", DType::f32, 2);
  }
  KernelBuilder kb("e");
  expect_user_error([&] { load(stale, {0, 0}, {16, 16}); }, __LINE__, "is a Tensor whose KernelBuilder is gone");
}

TEST_CASE("error: Tiles of two builders mixed") {
  KernelBuilder outer("outer");
  Tile mine = zeros({16}, DType::f32);
  KernelBuilder inner("inner");  // nested: records now
  Tile theirs = zeros({16}, DType::f32);
  expect_user_error([&] { (void)(theirs + mine); }, __LINE__, "is a Tile of kernel 'outer'");
  expect_user_error([&] { (void)(theirs + mine); }, __LINE__, "used in kernel 'inner'");
  // Reading its type is fine while its builder is alive.
  CHECK(mine.shape() == std::vector<int64_t>{16});
}

TEST_CASE("error: a Tile of another builder carried by a loop") {
  KernelBuilder outer("outer");
  Tile mine = zeros({16}, DType::f32);
  KernelBuilder inner("inner");
  expect_user_error([&] { for_range(0, 4, [&](Tile) {}, mine); }, __LINE__, "is a Tile of kernel 'outer'");
}

// ---- messages name the DSL's spelling, not the IR op ----------------------------------------------

TEST_CASE("error: messages name the DSL spelling") {
  KernelBuilder kb("e");
  Tile f = zeros({8}, DType::f32), b = zeros({8}, DType::bf16), i = iota(8);
  expect_user_error([&] { (void)(f * b); }, __LINE__, "`*`: operands have different types");
  expect_user_error([&] { (void)(f < b); }, __LINE__, "`<`: operands have different types");
  expect_user_error([&] { maximum(f, b); }, __LINE__, "maximum: operands");
  expect_user_error([&] { (void)(f % 2.0f); }, __LINE__, "`%`: operands must be i32 or i64");
  expect_user_error([&] { where(i > 2, f, b); }, __LINE__, "where: the two values have different types");
  expect_user_error([&] { sum(zeros({4, 4}, DType::i1), 0); }, __LINE__, "sum: cannot sum i1 values");
  expect_user_error([&] { cumsum(zeros({4}, DType::i1), 0); }, __LINE__, "cumsum: ");
  expect_user_error([&] { (void)(i + f); }, __LINE__, "`+`");
  Tile s = zeros({16}, DType::f32);
  expect_user_error([&] { for_range(0, 4, [&](Tile) { s = s.to(DType::bf16); }, s); }, __LINE__,
                    "for_range: loop-carried value #0 changes type");
}

TEST_CASE("error: a value from inside a loop used after it names the DSL spelling") {
  KernelBuilder kb("e");
  Tensor o = kb.tensor("o", DType::f32, 1);
  Tile inner;
  for_range(0, 4, [&](Tile i) { inner = zeros({16}, DType::f32) * i.to(DType::f32); });
  const std::string made = fmt::format("the result of `*` at {}:{}", __FILE__, __LINE__ - 1);
  store(o, {0}, {16}, inner);
  expect_user_error([&] { kb.finish(); }, __LINE__ - 1, "store: operand #3 (" + made);
}
