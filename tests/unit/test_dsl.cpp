// The DSL records the IR the user meant: ops, broadcasting, loop-carried values, source lines.
#include <doctest/doctest.h>

#include "compiler/ir/ir.h"
#include "linac/dsl.h"

using namespace linac;
using namespace linac::dsl;

namespace {
std::vector<ir::OpCode> opcodes(ir::Block& b) {
  std::vector<ir::OpCode> out;
  for (auto& op : b.ops) out.push_back(op->code);
  return out;
}
}  // namespace

TEST_CASE("dsl: parameters and numbers take the other operand's dtype") {
  KernelBuilder kb("k");
  Tensor x = kb.tensor("x", DType::bf16, 2);
  Tile s = kb.scalar("s", DType::f32);
  Tile t = load(x, {0, 0}, {kIndex, 32});
  Tile y = t.to(DType::f32) * 2 + s;
  CHECK(y.dtype() == DType::f32);
  CHECK(y.shape() == std::vector<int64_t>{32});
  auto k = kb.finish();
  REQUIRE(k->params.size() == 2);
  CHECK(k->params[0].name == "x");
  CHECK(k->params[0].value->type == ir::Type::tensor(DType::bf16, 2));
  CHECK(k->params[1].value->type == ir::Type::scalar(DType::f32));
}

TEST_CASE("dsl: load maps blocked dims to tile axes and fills limits with tensor dims") {
  KernelBuilder kb("k");
  Tensor q = kb.tensor("q", DType::f32, 4);
  Tile t = load(q, {0, 0, 1, 0}, {kIndex, 64, kIndex, 32});
  CHECK(t.shape() == std::vector<int64_t>{64, 32});
  Tile tt = load(q, {0, 0, 1, 0}, {kIndex, 64, kIndex, 32}, {.limits = {}, .transpose = true});
  CHECK(tt.shape() == std::vector<int64_t>{32, 64});
  ir::Op* op = tt.value()->def;
  CHECK(op->code == ir::OpCode::Load);
  CHECK(op->attrs.dims == std::vector<int64_t>{3, 1});
  CHECK(op->operands.size() == 1 + 4 + 4);
  for (int d = 0; d < 4; ++d) {
    ir::Op* lim = op->operands[5 + d]->def;
    REQUIRE(lim != nullptr);
    CHECK(lim->code == ir::OpCode::Dim);
    CHECK(lim->attrs.axis == d);
  }
}

TEST_CASE("dsl: scalars broadcast into tiles through splat, rank-1 rows through reshape+broadcast") {
  KernelBuilder kb("k");
  Tile a = zeros({4, 8}, DType::f32);
  Tile row = zeros({8}, DType::f32);
  Tile s = constant(3, DType::f32);
  Tile r = a + row;
  CHECK(r.shape() == std::vector<int64_t>{4, 8});
  Tile r2 = a * s;
  CHECK(r2.value()->def->operands[1]->def->code == ir::OpCode::Splat);
  Tile col = expand_dims(iota(4), 1) >= expand_dims(iota(8), 0);
  CHECK(col.shape() == std::vector<int64_t>{4, 8});
  CHECK(col.dtype() == DType::i1);
}

TEST_CASE("dsl: a loop turns reassigned variables into carried values") {
  KernelBuilder kb("k");
  Tensor o = kb.tensor("o", DType::f32, 1);
  Tile acc = zeros({16}, DType::f32);
  Tile count = constant(0, DType::i32);
  Tile before = acc;
  for_range(0, 10, [&](Tile i) {
    acc = acc + i.to(DType::f32);
    count = count + 1;
  }, acc, count);
  CHECK(acc.value() != before.value());
  ir::Op* loop = acc.value()->def;
  REQUIRE(loop->code == ir::OpCode::For);
  CHECK(loop->results.size() == 2);
  CHECK(loop->operands.size() == 3 + 2);
  REQUIRE(loop->regions.size() == 1);
  ir::Block& body = *loop->regions[0];
  CHECK(body.args.size() == 3);
  CHECK(body.ops.back()->code == ir::OpCode::Yield);
  store(o, {0}, {16}, acc);
  auto k = kb.finish();
  CHECK(opcodes(k->body).back() == ir::OpCode::Store);
}

TEST_CASE("dsl: for_range_carrying takes the carried variables as a list") {
  KernelBuilder kb("k");
  Tile a = zeros({16}, DType::f32), b = zeros({16}, DType::f32), untouched = zeros({16}, DType::f32);
  Tile a0 = a, untouched0 = untouched;
  for_range_carrying(0, 4, [&](Tile i) {
    a = a + i.to(DType::f32);
    b = b * 2.0f;
  }, {&a, &b});
  ir::Op* loop = a.value()->def;
  REQUIRE(loop->code == ir::OpCode::For);
  CHECK(loop->results.size() == 2);
  CHECK(b.value()->def == loop);
  CHECK(a.value() != a0.value());
  CHECK(untouched.value() == untouched0.value());
  kb.finish();
}

TEST_CASE("dsl: if with and without else yields in both branches") {
  KernelBuilder kb("k");
  Tile x = constant(1, DType::f32);
  Tile y = constant(2, DType::f32);
  Tile c = program_id(0) < 3;
  if_then(c, [&] { x = x * 2; }, x);
  if_then_else(c, [&] { y = y + 1; }, [&] { y = y - 1; }, y);
  ir::Op* op = y.value()->def;
  REQUIRE(op->code == ir::OpCode::If);
  CHECK(op->regions.size() == 2);
  CHECK(op->regions[0]->ops.back()->code == ir::OpCode::Yield);
  CHECK(op->regions[1]->ops.back()->code == ir::OpCode::Yield);
  CHECK(x.value()->def->regions[1]->ops.size() == 1);  // the empty else yields x unchanged
  kb.finish();
}

TEST_CASE("dsl: every op records the line of the DSL call") {
  KernelBuilder kb("k");
  unsigned line = __LINE__ + 1;
  Tile a = zeros({16, 16}, DType::bf16);
  Tile d = dot(a,
               a);  // the location of a call spanning lines is its first line
  CHECK(a.value()->def->loc.line == line);
  CHECK(d.value()->def->loc.line == line + 1);
  Tile e = exp(d);
  CHECK(e.value()->def->loc.line == __LINE__ - 1);
  Tile f = d + e;
  CHECK(f.value()->def->loc.line == __LINE__ - 1);
  CHECK(std::string(f.value()->def->loc.file).find("test_dsl.cpp") != std::string::npos);
}

TEST_CASE("dsl: reductions drop the axis and a rank-1 reduction is a scalar") {
  KernelBuilder kb("k");
  Tile a = zeros({4, 8}, DType::f32);
  CHECK(sum(a, 0).shape() == std::vector<int64_t>{8});
  CHECK(max(a, -1).shape() == std::vector<int64_t>{4});
  CHECK(sum(sum(a, 1), 0).is_scalar());
  CHECK(cumsum(a, 1, true).shape() == a.shape());
}

TEST_CASE("dsl: take drops the axis at a runtime index; the index must be an i32 scalar") {
  KernelBuilder kb("k");
  Tile a = zeros({4, 8}, DType::f32);
  CHECK(take(a, 1, 0).shape() == std::vector<int64_t>{8});
  CHECK(take(a, program_id(0), -1).shape() == std::vector<int64_t>{4});
  CHECK(take(take(a, 2, 0), 3, 0).is_scalar());
  CHECK_THROWS_AS(take(a, zeros({2}, DType::i32), 0), UserError);
  CHECK_THROWS_AS(take(a, 0, 2), UserError);
}

TEST_CASE("dsl: slice, concat and place keep the rank; a whole-axis slice and a one-part concat are no-ops") {
  KernelBuilder kb("k");
  Tile a = zeros({64, 32}, DType::f32);
  Tile rows = slice(a, 0, 16, 16);
  CHECK(rows.shape() == std::vector<int64_t>{16, 32});
  CHECK(rows.value()->def->code == ir::OpCode::Slice);
  CHECK(rows.value()->def->attrs.offsets == std::vector<int64_t>{16, 0});
  CHECK(slice(a, -1, 8, 8).value()->def->attrs.offsets == std::vector<int64_t>{0, 8});
  CHECK(slice(a, 1, 0, 32).value() == a.value());
  Tile wide = concat({a, a, slice(a, 1, 0, 16)}, 1);
  CHECK(wide.shape() == std::vector<int64_t>{64, 32 + 32 + 16});
  CHECK(concat({a, rows}, 0).shape() == std::vector<int64_t>{80, 32});
  CHECK(concat({a}, 0).value() == a.value());
  Tile placed = place(a, rows, {48, 0});
  CHECK(placed.shape() == a.shape());
  CHECK(placed.value()->def->code == ir::OpCode::Place);
  CHECK(placed.value()->def->attrs.offsets == std::vector<int64_t>{48, 0});
  kb.finish();
}
