// Tile IR text format and verifier: print -> parse -> print is the identity, the printed lines have
// the documented form, malformed text is a located UserError (never a crash), and each typing rule
// of the verifier fires with an actionable message at the op's source line.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "compiler/ir/ir.h"
#include "compiler/ir/parser.h"
#include "compiler/ir/printer.h"
#include "compiler/ir/verifier.h"

using namespace linac;
using namespace linac::ir;

namespace {

Type scalar(DType t) {
  return Type::scalar(t);
}
Type tile(DType t, std::vector<int64_t> shape) {
  return Type::tile(t, std::move(shape));
}
constexpr DType kF32 = DType::f32, kBF16 = DType::bf16, kI32 = DType::i32, kI1 = DType::i1;

/// Attrs by name, e.g. A().axis(1).reduce(ReduceKind::max) (designated initializers would warn
/// about the fields left out).
struct A {
  Attrs a;
  A& axis(int64_t v) { return a.axis = v, *this; }
  A& ivalue(int64_t v) { return a.ivalue = v, *this; }
  A& fvalue(double v) { return a.fvalue = v, *this; }
  A& dtype(DType v) { return a.dtype = v, *this; }
  A& pred(CmpPred v) { return a.pred = v, *this; }
  A& reduce(ReduceKind v) { return a.reduce = v, *this; }
  A& reverse(bool v) { return a.reverse = v, *this; }
  A& shape(std::vector<int64_t> v) { return a.shape = std::move(v), *this; }
  A& dims(std::vector<int64_t> v) { return a.dims = std::move(v), *this; }
  A& perm(std::vector<int64_t> v) { return a.perm = std::move(v), *this; }
  A& offsets(std::vector<int64_t> v) { return a.offsets = std::move(v), *this; }
  operator Attrs() const { return a; }
};

/// Builds kernels op by op with append_op, as the DSL does; every op gets its own source line so
/// tests can check which op an error points at.
struct Builder {
  std::shared_ptr<Kernel> k = std::make_shared<Kernel>();
  Block* block = &k->body;
  unsigned next_line = 100;

  Builder() { k->name = "t"; }
  SourceLoc loc() { return {"k.cpp", next_line++, 5}; }
  Op* raw(OpCode c, std::vector<Value*> operands, std::vector<Type> types, Attrs a = {}) {
    return append_op(*k, *block, c, std::move(operands), std::move(types), std::move(a), loc());
  }
  Value* op(OpCode c, std::vector<Value*> operands, Type t, Attrs a = {}) {
    return raw(c, std::move(operands), {std::move(t)}, std::move(a))->result();
  }
  Value* i32(int64_t v) { return op(OpCode::Constant, {}, scalar(kI32), A().ivalue(v)); }
  Value* f32(double v) { return op(OpCode::Constant, {}, scalar(kF32), A().fvalue(v)); }
  Value* zeros(std::vector<int64_t> shape, DType t = kF32) { return op(OpCode::Constant, {}, tile(t, shape)); }
  void yield(std::vector<Value*> values) { raw(OpCode::Yield, std::move(values), {}); }
};

/// A region of `op` with block arguments of the given types, as the DSL's loop builder makes it.
Block* add_region(Kernel& k, Op* op, const std::vector<Type>& arg_types) {
  auto b = std::make_unique<Block>();
  b->parent = op;
  for (const Type& t : arg_types) {
    Value* v = k.new_value(t);
    v->owner = b.get();
    b->args.push_back(v);
  }
  op->regions.push_back(std::move(b));
  return op->regions.back().get();
}

/// The UserError `f` throws, or nothing (other exception types propagate and fail the test).
template <class F>
std::optional<UserError> user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e;
  }
  return std::nullopt;
}

std::string roundtrip(const std::string& text) {
  return print(*parse(text));
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), "cannot open " << p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The kernel of the example at the top of printer.h. Its block arguments are created before the
// ops so that Value::id order differs from text order: printing must number by appearance.
std::shared_ptr<Kernel> scale_rows() {
  Builder b;
  Kernel& k = *b.k;
  k.name = "scale_rows";
  k.loc = {"k.cpp", 9, 1};
  Value* x = k.add_param("x", Type::tensor(kF32, 2));
  Value* s = k.add_param("s", scalar(kF32));
  Type row = tile(kF32, {128});
  Value* iv = k.new_value(scalar(kI32));
  Value* c0 = k.new_value(row);
  Value* c1 = k.new_value(scalar(kF32));
  auto plain = [&](OpCode c, std::vector<Value*> ops, Type t, Attrs a = {}) {
    return append_op(k, k.body, c, std::move(ops), {std::move(t)}, std::move(a), {})->result();
  };
  Value* pid = append_op(k, k.body, OpCode::ProgramId, {}, {scalar(kI32)}, A().axis(0), {"k.cpp", 12, 3})->result();
  Value* zero = plain(OpCode::Constant, {}, scalar(kI32), A().ivalue(0));
  Value* cols = plain(OpCode::Dim, {x}, scalar(kI32), A().axis(1));
  Value* one = plain(OpCode::Constant, {}, scalar(kI32), A().ivalue(1));
  Value* end = plain(OpCode::Add, {pid, one}, scalar(kI32));
  Value* t = plain(OpCode::Load, {x, pid, zero, end, cols}, row, A().shape({128}).dims({1}));
  Value* st = plain(OpCode::Splat, {s}, row, A().shape({128}));
  Value* scaled = plain(OpCode::Mul, {t, st}, row);
  Op* loop = append_op(k, k.body, OpCode::For, {zero, cols, one, scaled, s}, {row, scalar(kF32)}, {}, {});
  auto body = std::make_unique<Block>();
  body->parent = loop;
  body->args = {iv, c0, c1};
  for (Value* a : body->args) a->owner = body.get();
  loop->regions.push_back(std::move(body));
  Block& lb = *loop->regions[0];
  Value* e = append_op(k, lb, OpCode::Exp, {c0}, {row}, {}, {})->result();
  append_op(k, lb, OpCode::Yield, {e, c1}, {}, {}, {});
  Value* lt = plain(OpCode::Cmp, {loop->results[1], s}, scalar(kI1), A().pred(CmpPred::lt));
  Op* branch = append_op(k, k.body, OpCode::If, {lt}, {scalar(kF32)}, {}, {});
  append_op(k, *add_region(k, branch, {}), OpCode::Yield, {loop->results[1]}, {}, {}, {});
  append_op(k, *add_region(k, branch, {}), OpCode::Yield, {s}, {}, {}, {});
  append_op(k, k.body, OpCode::Store, {x, pid, zero, end, cols, loop->results[0]}, {}, A().dims({1}), {});
  return b.k;
}

constexpr std::string_view kScaleRowsText =
    R"(kernel @scale_rows(%x: tensor<?x?xf32>, %s: f32) attributes {num_warps = 4, num_stages = 2} loc("k.cpp":9:1) {
  %0 = program_id {axis = 0} : i32 loc("k.cpp":12:3)
  %1 = constant 0 : i32
  %2 = dim %x {axis = 1} : i32
  %3 = constant 1 : i32
  %4 = add %0, %3 : i32
  %5 = load %x[%0, %1] limits[%4, %2] {dims = [1], shape = [128]} : tile<128xf32>
  %6 = splat %s {shape = [128]} : tile<128xf32>
  %7 = mul %5, %6 : tile<128xf32>
  %8, %9 = for %10 = %1 to %2 step %3 iter_args(%11 = %7, %12 = %s) : (tile<128xf32>, f32) {
    %13 = exp %11 : tile<128xf32>
    yield %13, %12
  }
  %14 = cmp %9, %s {pred = lt} : i1
  %15 = if %14 : (f32) {
    yield %9
  } else {
    yield %s
  }
  store %x[%0, %1] limits[%4, %2], %8 {dims = [1]}
}
)";

// A kernel using every opcode, nested control flow included.
std::shared_ptr<Kernel> every_opcode() {
  Builder b;
  Kernel& k = *b.k;
  k.name = "every_op";
  k.num_warps = 8;
  k.num_stages = 3;
  k.loc = {"every.cpp", 1, 1};
  Value* x = k.add_param("x", Type::tensor(kF32, 2));
  Value* y = k.add_param("y", Type::tensor(kBF16, 3));
  Value* s = k.add_param("s", scalar(kF32));
  Value* n = k.add_param("n", scalar(kI32));
  Value* flags = k.add_param("flags", Type::tensor(kI32, 1));
  Type v64 = tile(kF32, {64});
  Value* pid = b.op(OpCode::ProgramId, {}, scalar(kI32), A().axis(0));
  Value* np = b.op(OpCode::NumPrograms, {}, scalar(kI32), A().axis(2));
  Value* d1 = b.op(OpCode::Dim, {x}, scalar(kI32), A().axis(1));
  Value* c0 = b.i32(0);
  Value* c32 = b.i32(32);
  Value* big = b.op(OpCode::Constant, {}, scalar(DType::i64), A().ivalue(std::numeric_limits<int64_t>::min()));
  (void)big;
  Value* ci = b.op(OpCode::Iota, {}, tile(kI32, {64}));
  Value* c7 = b.op(OpCode::Constant, {}, tile(kI32, {64}), A().ivalue(7));
  Value* rem = b.op(OpCode::Rem, {ci, c7}, tile(kI32, {64}));
  Value* cf = b.op(OpCode::Cast, {rem}, v64, A().dtype(kF32));
  Value* half = b.op(OpCode::Constant, {}, v64, A().fvalue(0.5));
  Value* acc = cf;
  for (OpCode c : {OpCode::Add, OpCode::Sub, OpCode::Mul, OpCode::Div, OpCode::Max, OpCode::Min, OpCode::Pow})
    acc = b.op(c, {acc, half}, v64);
  for (OpCode c : {OpCode::Neg, OpCode::Exp, OpCode::Exp2, OpCode::Log, OpCode::Log2, OpCode::Sigmoid, OpCode::Sqrt,
                   OpCode::Rsqrt, OpCode::Abs})
    acc = b.op(c, {acc}, v64);
  Value* lt = b.op(OpCode::Cmp, {acc, half}, tile(kI1, {64}), A().pred(CmpPred::lt));
  Value* ne = b.op(OpCode::Cmp, {acc, cf}, tile(kI1, {64}), A().pred(CmpPred::ne));
  Value* both = b.op(OpCode::And, {lt, ne}, tile(kI1, {64}));
  Value* either = b.op(OpCode::Or, {lt, both}, tile(kI1, {64}));
  Value* neither = b.op(OpCode::Not, {either}, tile(kI1, {64}));
  Value* sel = b.op(OpCode::Select, {neither, acc, half}, v64);
  Value* ss = b.op(OpCode::Splat, {s}, v64, A().shape({64}));
  Value* sum = b.op(OpCode::Add, {sel, ss}, v64);
  Value* row = b.op(OpCode::ExpandDims, {sum}, tile(kF32, {1, 64}), A().axis(0));
  Value* mat = b.op(OpCode::Broadcast, {row}, tile(kF32, {32, 64}), A().shape({32, 64}));
  Value* rs = b.op(OpCode::Reshape, {mat}, tile(kF32, {64, 32}), A().shape({64, 32}));
  Value* tr = b.op(OpCode::Transpose, {rs}, tile(kF32, {32, 64}), A().perm({1, 0}));
  Value* red = b.op(OpCode::Reduce, {tr}, tile(kF32, {32}), A().axis(1).reduce(ReduceKind::max));
  Value* scan = b.op(OpCode::Scan, {red}, tile(kF32, {32}), A().axis(0).reduce(ReduceKind::sum).reverse(true));
  Value* total = b.op(OpCode::Reduce, {scan}, scalar(kF32), A().axis(0).reduce(ReduceKind::sum));
  Value* picked = b.op(OpCode::Take, {tr, c0}, tile(kF32, {64}), A().axis(0));
  (void)picked;
  Value* block = b.op(OpCode::Slice, {tr}, tile(kF32, {16, 64}), A().offsets({16, 0}));
  Value* joined = b.op(OpCode::Concat, {tr, block, block}, tile(kF32, {64, 64}), A().axis(0));
  Value* placed = b.op(OpCode::Place, {joined, block}, tile(kF32, {64, 64}), A().offsets({48, 0}));
  (void)placed;
  Value* a = b.op(OpCode::Load, {y, pid, c0, c0, n, c32, c32}, tile(kBF16, {32, 16}), A().shape({32, 16}).dims({1, 2}));
  Value* bt =
      b.op(OpCode::Load, {y, pid, c0, c0, n, c32, c32}, tile(kBF16, {16, 32}), A().shape({16, 32}).dims({2, 1}));
  Value* one = b.op(OpCode::Load, {y, pid, c0, c0, n, c32, c32}, scalar(kBF16), {});
  (void)one;
  Value* prod = b.op(OpCode::Dot, {a, bt}, tile(kF32, {32, 32}));
  // for %i = 0 to n step 32 iter_args(acc = prod, t = total) with a nested if inside.
  Op* loop = b.raw(OpCode::For, {c0, n, c32, prod, total}, {tile(kF32, {32, 32}), scalar(kF32)});
  Block* body = add_region(k, loop, {scalar(kI32), tile(kF32, {32, 32}), scalar(kF32)});
  b.block = body;
  Value* next = b.op(OpCode::Add, {body->args[1], body->args[1]}, tile(kF32, {32, 32}));
  Value* small = b.op(OpCode::Cmp, {body->args[0], np}, scalar(kI1), A().pred(CmpPred::ge));
  Op* branch = b.raw(OpCode::If, {small}, {scalar(kF32)});
  b.block = add_region(k, branch, {});
  Value* inner = b.op(OpCode::Mul, {body->args[2], s}, scalar(kF32));
  Op* nested = b.raw(OpCode::If, {small}, {});
  b.block = add_region(k, nested, {});
  b.op(OpCode::Sqrt, {inner}, scalar(kF32));
  b.yield({});
  b.block = add_region(k, nested, {});
  b.yield({});
  b.block = branch->regions[0].get();
  b.yield({inner});
  b.block = add_region(k, branch, {});
  b.yield({body->args[2]});
  b.block = body;
  b.yield({next, branch->result()});
  b.block = &k.body;
  b.raw(OpCode::Store, {x, pid, c0, d1, d1, loop->results[0]}, {}, A().dims({0, 1}));
  b.raw(OpCode::Store, {x, pid, c0, d1, d1, loop->results[1]}, {}, {});
  b.raw(OpCode::Signal, {flags, pid}, {}, {});
  b.raw(OpCode::Wait, {flags, c0, c32}, {}, {});
  return b.k;
}

/// Expects parse(text) to fail at line:col with a message containing `what`.
void check_parse_error(const std::string& text, unsigned line, unsigned col, std::string_view what) {
  CAPTURE(text);
  auto e = user_error([&] { parse(text); });
  REQUIRE_MESSAGE(e.has_value(), "parsed without error");
  std::string msg = e->what();
  CAPTURE(msg);
  CHECK(e->loc().file == "<input>");
  CHECK(e->loc().line == line);
  CHECK(e->loc().col == col);
  CHECK(msg.starts_with(fmt::format("<input>:{}:", line)));
  CHECK(msg.find("error: ") != std::string::npos);
  CHECK(msg.find(what) != std::string::npos);
}

// A kernel header and body around `body_lines` for the parse error tests (the body starts at line 2).
std::string in_kernel(std::string_view body_lines) {
  return fmt::format("kernel @k(%x: tensor<?x?xf32>, %s: f32, %n: i32) {{\n{}}}\n", body_lines);
}

}  // namespace

TEST_CASE("ir text: the printer.h example is what print() writes") {
  auto k = scale_rows();
  verify(*k);
  CHECK(print(*k) == kScaleRowsText);
  CHECK(roundtrip(std::string(kScaleRowsText)) == kScaleRowsText);
}

TEST_CASE("ir text: every opcode prints, parses and prints the same") {
  auto k = every_opcode();
  verify(*k);
  std::string text = print(*k);
  CAPTURE(text);
  auto parsed = parse(text, "every.tir");
  CHECK(print(*parsed) == text);
  CHECK(parsed->num_warps == 8);
  CHECK(parsed->num_stages == 3);
  CHECK(parsed->params.size() == 5);
  // Every opcode appears, and a few lines have their exact form (values numbered by appearance).
  for (int c = 0; c <= static_cast<int>(OpCode::Yield); ++c)
    CHECK_MESSAGE(text.find(fmt::format(" {} ", opcode_name(static_cast<OpCode>(c)))) != std::string::npos,
                  opcode_name(static_cast<OpCode>(c)));
  CHECK(
      text.starts_with("kernel @every_op(%x: tensor<?x?xf32>, %y: tensor<?x?x?xbf16>, %s: f32, %n: i32, "
                       "%flags: tensor<?xi32>) attributes {num_warps = 8, num_stages = 3} loc(\"every.cpp\":1:1) {\n"));
  CHECK(text.find("  %0 = program_id {axis = 0} : i32 loc(\"k.cpp\":100:5)\n") != std::string::npos);
  CHECK(text.find("  %5 = constant -9223372036854775808 : i64 loc(") != std::string::npos);
  CHECK(text.find(" = scan %") != std::string::npos);
  CHECK(text.find("{axis = 0, kind = sum, reverse = true} : tile<32xf32>") != std::string::npos);
  CHECK(text.find("{axis = 1, kind = max} : tile<32xf32>") != std::string::npos);
  CHECK(text.find("{dims = [2, 1], shape = [16, 32]} : tile<16x32xbf16>") != std::string::npos);
  CHECK(text.find("limits[%n, %4, %4] {dims = [], shape = []} : bf16") != std::string::npos);
  CHECK(text.find("{perm = [1, 0]} : tile<32x64xf32>") != std::string::npos);
  CHECK(text.find("      } else {\n        yield loc(") != std::string::npos);  // the nested if
  CHECK(text.find("store %x[%0, %3] limits[%2, %2], ") != std::string::npos);
  CHECK(text.find(" {dims = []} loc(\"k.cpp\"") != std::string::npos);
  CHECK(text.find("  signal %flags, %0 loc(") != std::string::npos);
  CHECK(text.ends_with(fmt::format("  wait %flags, %3, %4 loc(\"k.cpp\":{}:5)\n}}\n", k->body.ops.back()->loc.line)));
}

TEST_CASE("ir text: float constants round-trip bit for bit") {
  const double values[] = {0.1,
                           -0.0,
                           0.0,
                           1e30,
                           5e-324,
                           2.2250738585072014e-308,
                           std::numeric_limits<double>::max(),
                           static_cast<double>(0.1f),
                           -1.5,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           3};
  Builder b;
  for (double v : values) b.f32(v);
  b.f32(std::nan(""));
  b.op(OpCode::Constant, {}, tile(DType::f16, {8}), A().fvalue(65504));
  std::string text = print(*b.k);
  CAPTURE(text);
  CHECK(text.find("constant 0.1 : f32") != std::string::npos);
  CHECK(text.find("constant -0 : f32") != std::string::npos);
  CHECK(text.find("constant 1e+30 : f32") != std::string::npos);
  CHECK(text.find("constant -inf : f32") != std::string::npos);
  CHECK(text.find("constant nan : f32") != std::string::npos);
  auto k = parse(text);
  CHECK(print(*k) == text);
  const auto& ops = k->body.ops;
  REQUIRE(ops.size() == std::size(values) + 2);
  for (size_t i = 0; i < std::size(values); ++i)
    CHECK(std::bit_cast<uint64_t>(ops[i]->attrs.fvalue) == std::bit_cast<uint64_t>(values[i]));
  CHECK(std::isnan(ops[std::size(values)]->attrs.fvalue));
}

TEST_CASE("ir text: integer constants and the fields the parser fills") {
  auto k =
      parse(in_kernel("  %0 = constant -2147483648 : i32\n  %1 = constant 1 : i1\n"
                      "  %2 = constant 9223372036854775807 : i64\n  %3 = constant 2 : f32\n"));
  const auto& ops = k->body.ops;
  CHECK(ops[0]->attrs.ivalue == INT32_MIN);
  CHECK(ops[0]->attrs.fvalue == double(INT32_MIN));
  CHECK(ops[1]->attrs.ivalue == 1);
  CHECK(ops[2]->attrs.ivalue == std::numeric_limits<int64_t>::max());
  CHECK(ops[3]->attrs.fvalue == 2.0);
  CHECK(ops[3]->attrs.ivalue == 0);
}

TEST_CASE("ir text: hand-written names are renumbered, locations are escaped") {
  std::string text = R"(// a comment
kernel @odd(%acc: f32) attributes {num_stages = 1} loc("dir \"q\"\\f\x01\xc3\xa9.cpp":7:0) {
  %first = add %acc, %acc : f32   // trailing comment
  %i_2 = mul %first, %acc : f32 loc("":3:4)
}
)";
  auto k = parse(text);
  CHECK(k->loc.file == "dir \"q\"\\f\x01\xc3\xa9.cpp");
  CHECK(k->loc.line == 7);
  CHECK(k->num_warps == 4);  // defaults when not given
  CHECK(k->num_stages == 1);
  CHECK(print(*k) ==
        "kernel @odd(%acc: f32) attributes {num_warps = 4, num_stages = 1} "
        "loc(\"dir \\\"q\\\"\\\\f\\x01\\xc3\\xa9.cpp\":7:0) {\n"
        "  %0 = add %acc, %acc : f32\n"
        "  %1 = mul %0, %acc : f32 loc(\"\":3:4)\n"
        "}\n");
}

TEST_CASE("ir text: a name that is not an identifier prints quoted and is rejected when read") {
  Builder b;
  b.k->name = "odd name";
  std::string text = print(*b.k);
  CHECK(text.starts_with("kernel @\"odd name\"() attributes"));
  check_parse_error(text, 1, 8, "kernel: the name 'odd name' is not an identifier");
}

TEST_CASE("ir text: names are lexically scoped") {
  // Sibling regions may reuse names; a region's names are gone after it.
  std::string text = in_kernel(R"(  %c = cmp %s, %s {pred = eq} : i1
  %r = if %c : (f32) {
    %t = add %s, %s : f32
    yield %t
  } else {
    %t = mul %s, %s : f32
    yield %t
  }
  %u = add %t, %s : f32
)");
  check_parse_error(text, 10, 12, "use of undefined value %t");
}

TEST_CASE("ir text: tests/ir/roundtrip.tir parses and round-trips") {
  auto path = std::filesystem::path(__FILE__).parent_path().parent_path() / "ir" / "roundtrip.tir";
  std::string text = read_file(path);
  auto k = parse(text, path.string());
  CHECK(k->name == "gla_fwd_chunk");
  CHECK(k->params.size() == 7);
  std::string printed = print(*k);
  CAPTURE(printed);
  CHECK(roundtrip(printed) == printed);
  // The structure survived: one loop carrying an f32 state tile, with dots, scans and stores.
  const Op* loop = nullptr;
  int dots = 0, scans = 0, stores = 0;
  walk(k->body, [&](Op& op) {
    if (op.code == OpCode::For) loop = &op;
    dots += op.code == OpCode::Dot;
    scans += op.code == OpCode::Scan;
    stores += op.code == OpCode::Store;
  });
  REQUIRE(loop != nullptr);
  REQUIRE(loop->results.size() == 1);
  CHECK(loop->results[0]->type == tile(kF32, {64, 64}));
  CHECK(dots == 4);
  CHECK(scans == 1);
  CHECK(stores == 2);
  CHECK(loop->loc.file == "kernels/gla.cpp");
  CHECK(loop->loc.line == 28);
}

TEST_CASE("ir text: parse errors point at the offending token") {
  check_parse_error("", 1, 1, "expected 'kernel' at the start of the input");
  check_parse_error(in_kernel("  %0 = frobnicate %s : f32\n"), 2, 8, "unknown op 'frobnicate'");
  check_parse_error("kernel @k(%x: tile<4x0xf32>) {\n}\n", 1, 22, "tile dimensions must be positive");
  check_parse_error("kernel @k(%x: tensor<?x8xf32>) {\n}\n", 1, 24, "tensor dimensions are written '?'");
  check_parse_error("kernel @k(%x: f31) {\n}\n", 1, 15, "unknown type 'f31'");
  check_parse_error(in_kernel("  %0 = add %s, %t : f32\n"), 2, 16, "use of undefined value %t");
  check_parse_error(in_kernel("  %0 = constant 1 : i32\n  %0 = constant 2 : i32\n"), 3, 3,
                    "%0 is already defined (at 2:3)");
  check_parse_error("kernel @k(%s: f32, %s: i32) {\n}\n", 1, 20, "%s is already defined");
  check_parse_error("kernel @k(%s: f32) {\n  %0 = add %s, %s : f32\n", 3, 1, "unexpected end of input");
  check_parse_error("kernel @k(%s: f32) {\n  %0 = add %s, %s : f3", 2, 21, "unknown type 'f3'");
  check_parse_error(in_kernel("  %0 = program_id {axis = 0, foo = 1} : i32\n"), 2, 30,
                    "program_id has no attribute 'foo' (it takes axis)");
  check_parse_error(in_kernel("  %0 = program_id : i32\n"), 2, 8, "program_id needs the attribute 'axis'");
  // prefetch: optional, on loads only, true or false.
  check_parse_error(in_kernel("  %0 = load %x[%n, %n] limits[%n, %n] {dims = [0, 1], shape = [4, 4], prefetch = 1} : "
                              "tile<4x4xf32>\n"),
                    2, 71, "attribute 'prefetch' must be true or false");
  check_parse_error(in_kernel("  store %x[%n, %n] limits[%n, %n], %s {dims = [0, 1], prefetch = true}\n"), 2, 55,
                    "store has no attribute 'prefetch' (it takes dims)");
  check_parse_error(in_kernel("  %0 = program_id {axis = 0, axis = 1} : i32\n"), 2, 30, "given twice");
  check_parse_error(in_kernel("  %0 = program_id {axis = 99999999999999999999} : i32\n"), 2, 27, "out of range");
  check_parse_error(in_kernel("  %0 = cmp %s, %s {pred = olt} : i1\n"), 2, 20, "unknown predicate 'olt'");
  check_parse_error(in_kernel("  %0 = constant 1.5 : i32\n"), 2, 17, "expected an integer constant for i32");
  check_parse_error(in_kernel("  %0 = constant 1e999 : f32\n"), 2, 17, "out of range");
  check_parse_error(in_kernel("  %0 = add %s, %s : f32 loc(\"k.cpp:3:4)\n"), 2, 29, "unterminated string");
  check_parse_error(in_kernel("  %0 = add %s, %s # f32\n"), 2, 19, "unexpected character '#'");
  check_parse_error(in_kernel("  %0 = add %s, %s 64x64\n"), 2, 19, "malformed number '64x'");
  check_parse_error(in_kernel("  add %s, %s : f32\n"), 2, 3, "add has 0 result names but 1 result type");
  check_parse_error(in_kernel("  %0 = load %x[%n, %n] limits[%n] {dims = [], shape = []} : f32\n"), 2, 24,
                    "load has 2 offsets but 1 limits");
  check_parse_error(in_kernel("  %r = for %i = %n to %n step %n iter_args(%a = %s) {\n    yield %a\n  }\n"), 2, 53,
                    "for has 1 iter_args but 0 result types");
  check_parse_error(in_kernel("  %c = cmp %s, %s {pred = eq} : i1\n  if %c {\n    yield\n  }\n"), 6, 1,
                    "expected 'else'");
  check_parse_error(in_kernel("") + "kernel", 3, 1, "expected end of input after the kernel");
  // Verifier findings are located at the op's name in the text, not at its DSL location.
  check_parse_error(in_kernel("  %0 = add %s : f32 loc(\"dsl.cpp\":40:1)\n"), 2, 8, "add: expects 2 operands, got 1");
  check_parse_error(in_kernel("  %0 = add %s, %n : f32\n"), 2, 8, "add: operands have different types: f32 and i32");
  check_parse_error(in_kernel("  yield %s\n"), 2, 3, "yield: only allowed as the last op of a for or if body");
  check_parse_error("kernel @k() attributes {num_warps = 3} {\n}\n", 1, 8, "num_warps must be a power of two");
  check_parse_error("kernel @k() attributes {tensor_core_f32 = 2} {\n}\n", 1, 25,
                    "kernel attribute 'tensor_core_f32' must be 0 or 1");
  check_parse_error("kernel @k() attributes {fast = 1} {\n}\n", 1, 25, "unknown kernel attribute 'fast'");
}

TEST_CASE("ir text: deep nesting is an error, not a stack overflow") {
  std::string text = "kernel @k(%c: i1) {\n";
  for (int i = 0; i < 150; ++i) text += "if %c {\n";
  auto e = user_error([&] { parse(text); });
  REQUIRE(e.has_value());
  CHECK(std::string(e->what()).find("nested more than 100 deep") != std::string::npos);
}

TEST_CASE("ir text: truncated or corrupted text never crashes the parser") {
  // Every prefix and many one-byte corruptions of valid IR: each either parses (and then prints
  // canonically) or is a UserError. Anything else (InternalError, a crash) fails the test.
  // (Assertions only on failure: there are thousands of cases.)
  std::string text = print(*every_opcode());
  size_t valid_from = text.rfind('}') + 1;
  for (size_t i = 0; i < text.size(); ++i) {
    auto e = user_error([&] { parse(text.substr(0, i)); });
    if (i < valid_from && !e) FAIL_CHECK("the prefix of length " << i << " parsed");
  }
  const char replacements[] = {'%', '}', '{', 'x', '0', '9', '-', '"', ' ', '\0', '\xff', ':', ',', '<', '[', 'e'};
  std::string small(kScaleRowsText);
  int parsed = 0;
  for (size_t i = 0; i < small.size(); ++i) {
    for (char r : replacements) {
      std::string mutated = small;
      mutated[i] = r;
      std::shared_ptr<Kernel> k;
      if (user_error([&] { k = parse(mutated); })) continue;
      ++parsed;
      std::string printed = print(*k);
      if (roundtrip(printed) != printed) FAIL_CHECK("no round trip after mutating byte " << i << ":\n" << mutated);
    }
  }
  CHECK(parsed > 0);  // some corruptions are harmless (a digit in a loc), and those must round-trip
}

// ---- verifier ----

namespace {

/// Expects verify_op(op) and verify(k) to fail at the op's line with a message containing `what`.
void check_op_error(const Builder& b, const Op* op, std::string_view what) {
  auto e = user_error([&] { verify_op(*op); });
  REQUIRE_MESSAGE(e.has_value(), "verify_op accepted: " << print(*b.k));
  std::string msg = e->what();
  CAPTURE(msg);
  CHECK(msg.find(what) != std::string::npos);
  CHECK(e->loc().line == op->loc.line);
  CHECK(msg.starts_with(fmt::format("k.cpp:{}", op->loc.line)));
  auto whole = user_error([&] { verify(*b.k); });
  REQUIRE(whole.has_value());
  CHECK(std::string(whole->what()) == msg);
}

/// Expects verify(k) (not necessarily verify_op) to fail at `line` with a message containing `what`.
void check_kernel_error(const Builder& b, unsigned line, std::string_view what) {
  auto e = user_error([&] { verify(*b.k); });
  REQUIRE_MESSAGE(e.has_value(), "verify accepted: " << print(*b.k));
  std::string msg = e->what();
  CAPTURE(msg);
  CHECK(msg.find(what) != std::string::npos);
  CHECK(e->loc().line == line);
}

}  // namespace

TEST_CASE("verifier: elementwise typing rules") {
  SUBCASE("binary operands of different types") {
    Builder b;
    Value* s = b.f32(1);
    Value* t = b.zeros({64});
    check_op_error(b, b.raw(OpCode::Add, {s, t}, {scalar(kF32)}),
                   "add: operands have different types: f32 and tile<64xf32> (splat or broadcast one of them first)");
  }
  SUBCASE("binary result type differs") {
    Builder b;
    Value* t = b.zeros({64});
    check_op_error(b, b.raw(OpCode::Mul, {t, t}, {tile(kF32, {32})}),
                   "mul: result type is tile<32xf32>, expected tile<64xf32>");
  }
  SUBCASE("exp of integers") {
    Builder b;
    Value* t = b.zeros({64}, kI32);
    check_op_error(b, b.raw(OpCode::Exp, {t}, {tile(kI32, {64})}),
                   "exp: the operand must be a float, got tile<64xi32> (cast it first)");
  }
  SUBCASE("rem of floats") {
    Builder b;
    Value* s = b.f32(1);
    check_op_error(b, b.raw(OpCode::Rem, {s, s}, {scalar(kF32)}), "rem: operands must be i32 or i64, got f32");
  }
  SUBCASE("and of floats") {
    Builder b;
    Value* s = b.f32(1);
    check_op_error(b, b.raw(OpCode::And, {s, s}, {scalar(kF32)}), "and: operands must be i1, got f32");
  }
  SUBCASE("cmp result is not i1") {
    Builder b;
    Value* t = b.zeros({8});
    check_op_error(b, b.raw(OpCode::Cmp, {t, t}, {t->type}, A().pred(CmpPred::le)),
                   "cmp: result type is tile<8xf32>, expected tile<8xi1>");
  }
  SUBCASE("select condition shape") {
    Builder b;
    Value* c = b.zeros({4}, kI1);
    Value* t = b.zeros({8});
    check_op_error(b, b.raw(OpCode::Select, {c, t, t}, {t->type}),
                   "select: the condition tile<4xi1> and the values tile<8xf32> differ in shape");
  }
  SUBCASE("cast result dtype differs from attrs.dtype") {
    Builder b;
    Value* t = b.zeros({8});
    check_op_error(b, b.raw(OpCode::Cast, {t}, {tile(kF32, {8})}, A().dtype(kBF16)),
                   "cast: result type is tile<8xf32>, expected tile<8xbf16>");
  }
  SUBCASE("tensor used as a value") {
    Builder b;
    Value* x = b.k->add_param("x", Type::tensor(kF32, 1));
    check_op_error(b, b.raw(OpCode::Neg, {x}, {scalar(kF32)}),
                   "neg: the operand is a tensor (tensor<?xf32>); load a tile from it first");
  }
}

TEST_CASE("verifier: shape and reduction rules") {
  SUBCASE("splat of a tile") {
    Builder b;
    Value* t = b.zeros({8});
    check_op_error(b, b.raw(OpCode::Splat, {t}, {tile(kF32, {8})}, A().shape({8})),
                   "splat: the operand must be a scalar, got tile<8xf32>");
  }
  SUBCASE("broadcast of a non-unit dimension") {
    Builder b;
    Value* t = b.zeros({32, 1});
    check_op_error(b, b.raw(OpCode::Broadcast, {t}, {tile(kF32, {64, 64})}, A().shape({64, 64})),
                   "broadcast: cannot broadcast dimension #0 of tile<32x1xf32> from 32 to 64");
  }
  SUBCASE("expand_dims axis out of range") {
    Builder b;
    Value* t = b.zeros({8});
    check_op_error(b, b.raw(OpCode::ExpandDims, {t}, {tile(kF32, {8, 1})}, A().axis(2)),
                   "expand_dims: axis 2 is out of range [0, 1] for tile<8xf32>");
  }
  SUBCASE("reshape changes the element count") {
    Builder b;
    Value* t = b.zeros({8, 8});
    check_op_error(b, b.raw(OpCode::Reshape, {t}, {tile(kF32, {16, 8})}, A().shape({16, 8})),
                   "reshape: cannot reshape tile<8x8xf32> (64 elements) to [16, 8] (128 elements)");
  }
  SUBCASE("transpose with a non-permutation") {
    Builder b;
    Value* t = b.zeros({8, 4});
    check_op_error(b, b.raw(OpCode::Transpose, {t}, {tile(kF32, {8, 8})}, A().perm({0, 0})),
                   "transpose: perm [0, 0] is not a permutation of 0..1");
  }
  SUBCASE("reduce axis out of range") {
    Builder b;
    Value* t = b.zeros({8, 4});
    check_op_error(b, b.raw(OpCode::Reduce, {t}, {tile(kF32, {8})}, A().axis(2)),
                   "reduce: axis 2 is out of range for tile<8x4xf32> (rank 2)");
  }
  SUBCASE("reduce keeps the axis") {
    Builder b;
    Value* t = b.zeros({8, 4});
    check_op_error(b, b.raw(OpCode::Reduce, {t}, {tile(kF32, {8, 4})}, A().axis(1)),
                   "reduce: result type is tile<8x4xf32>, expected tile<8xf32>");
  }
  SUBCASE("scan max is not supported") {
    Builder b;
    Value* t = b.zeros({8});
    check_op_error(b, b.raw(OpCode::Scan, {t}, {t->type}, A().reduce(ReduceKind::max)),
                   "scan: only kind = sum is supported, got max");
  }
  SUBCASE("slice past the end of an axis") {
    Builder b;
    Value* t = b.zeros({8, 4});
    check_op_error(b, b.raw(OpCode::Slice, {t}, {tile(kF32, {4, 4})}, A().offsets({6, 0})),
                   "slice: the slice [4, 4] at offsets [6, 0] does not fit in tile<8x4xf32>: along axis 0 it starts "
                   "at 6 and has 4 elements, of 8");
  }
  SUBCASE("slice offsets for another rank, and a slice that changes the rank") {
    Builder b;
    Value* t = b.zeros({8, 4});
    check_op_error(b, b.raw(OpCode::Slice, {t}, {tile(kF32, {4, 4})}, A().offsets({0})),
                   "slice: offsets [0] has 1 entries, but tile<8x4xf32> has rank 2");
    Builder c;
    Value* u = c.zeros({8, 4});
    check_op_error(c, c.raw(OpCode::Slice, {u}, {tile(kF32, {4})}, A().offsets({0, 0})),
                   "slice: result type is tile<4xf32>, expected a tile of rank 2 and dtype f32 (a slice keeps the rank)");
  }
  SUBCASE("concat of parts that differ off the axis") {
    Builder b;
    Value* x = b.zeros({8, 4});
    Value* y = b.zeros({8, 2});
    check_op_error(b, b.raw(OpCode::Concat, {x, y}, {tile(kF32, {16, 4})}, A().axis(0)),
                   "concat: operand #1 is tile<8x2xf32>, but operand #0 is tile<8x4xf32>: the parts may differ only "
                   "along axis 0");
  }
  SUBCASE("concat of two dtypes, and a wrong joined type") {
    Builder b;
    Value* x = b.zeros({8, 4});
    Value* y = b.zeros({8, 4}, kI32);
    check_op_error(b, b.raw(OpCode::Concat, {x, y}, {tile(kF32, {8, 8})}, A().axis(1)),
                   "concat: operand #1 is tile<8x4xi32>, but operand #0 is tile<8x4xf32>: the parts must be tiles of "
                   "one dtype and rank");
    Builder c;
    Value* u = c.zeros({8, 4});
    check_op_error(c, c.raw(OpCode::Concat, {u, u}, {tile(kF32, {8, 4})}, A().axis(1)),
                   "concat: result type is tile<8x4xf32>, expected tile<8x8xf32>");
  }
  SUBCASE("place of a block that leaves the tile") {
    Builder b;
    Value* big = b.zeros({16, 16});
    Value* blk = b.zeros({8, 8});
    check_op_error(b, b.raw(OpCode::Place, {big, blk}, {tile(kF32, {16, 16})}, A().offsets({0, 12})),
                   "place: the block [8, 8] at offsets [0, 12] does not fit in tile<16x16xf32>: along axis 1 it "
                   "starts at 12 and has 8 elements, of 16");
  }
  SUBCASE("place of a block of another dtype, and a place that changes the type") {
    Builder b;
    Value* big = b.zeros({16, 16});
    Value* blk = b.zeros({8, 8}, kI32);
    check_op_error(b, b.raw(OpCode::Place, {big, blk}, {tile(kF32, {16, 16})}, A().offsets({0, 0})),
                   "place: the block tile<8x8xi32> and the tile tile<16x16xf32> must have one dtype and rank");
    Builder c;
    Value* big2 = c.zeros({16, 16});
    Value* blk2 = c.zeros({8, 8});
    check_op_error(c, c.raw(OpCode::Place, {big2, blk2}, {tile(kF32, {8, 8})}, A().offsets({0, 0})),
                   "place: result type is tile<8x8xf32>, expected tile<16x16xf32>");
  }
  SUBCASE("results with a zero dimension") {
    Builder b;
    check_op_error(b, b.raw(OpCode::Iota, {}, {tile(kI32, {0})}),
                   "iota: result #0 has type tile<0xi32>: dimension #0 is 0; tile dimensions must be positive");
  }
  SUBCASE("absurdly large tiles") {
    Builder b;
    check_op_error(b, b.raw(OpCode::Constant, {}, {tile(kF32, {1 << 20, 1 << 20})}), "the largest tile");
  }
}

TEST_CASE("verifier: dot, memory and index rules") {
  SUBCASE("dot inner dimensions") {
    Builder b;
    Value* a = b.zeros({64, 32}, kBF16);
    Value* c = b.zeros({64, 64}, kBF16);
    check_op_error(b, b.raw(OpCode::Dot, {a, c}, {tile(kF32, {64, 64})}),
                   "dot: inner dimensions differ: a is tile<64x32xbf16>, b is tile<64x64xbf16>");
  }
  SUBCASE("dot of mixed dtypes") {
    Builder b;
    Value* a = b.zeros({64, 32}, kBF16);
    Value* c = b.zeros({32, 64}, DType::f16);
    check_op_error(b, b.raw(OpCode::Dot, {a, c}, {tile(kF32, {64, 64})}),
                   "dot: a and b have different dtypes: a is tile<64x32xbf16>, b is tile<32x64xf16>");
  }
  SUBCASE("dot result is not f32") {
    Builder b;
    Value* a = b.zeros({16, 16}, kBF16);
    check_op_error(b, b.raw(OpCode::Dot, {a, a}, {tile(kBF16, {16, 16})}),
                   "dot: result type is tile<16x16xbf16>, expected tile<16x16xf32>");
  }
  SUBCASE("load with a repeated dim") {
    Builder b;
    Value* x = b.k->add_param("x", Type::tensor(kF32, 2));
    Value* i = b.i32(0);
    check_op_error(b, b.raw(OpCode::Load, {x, i, i, i, i}, {tile(kF32, {8, 8})}, A().shape({8, 8}).dims({1, 1})),
                   "load: dims [1, 1] names tensor dimension 1 twice");
  }
  SUBCASE("load with a float offset") {
    Builder b;
    Value* x = b.k->add_param("x", Type::tensor(kF32, 1));
    Value* i = b.i32(0);
    Value* f = b.f32(0);
    check_op_error(b, b.raw(OpCode::Load, {x, f, i}, {tile(kF32, {8})}, A().shape({8}).dims({0})),
                   "load: offset #0 must be an i32 or i64 scalar, got f32");
  }
  SUBCASE("load with too few indices") {
    Builder b;
    Value* x = b.k->add_param("x", Type::tensor(kF32, 2));
    Value* i = b.i32(0);
    check_op_error(b, b.raw(OpCode::Load, {x, i, i}, {tile(kF32, {8})}, A().shape({8}).dims({0})),
                   "load: expects 5 operands for tensor<?x?xf32> (the tensor, 2 offsets and 2 limits), got 3");
  }
  SUBCASE("load result dtype") {
    Builder b;
    Value* x = b.k->add_param("x", Type::tensor(kBF16, 1));
    Value* i = b.i32(0);
    check_op_error(b, b.raw(OpCode::Load, {x, i, i}, {tile(kF32, {8})}, A().shape({8}).dims({0})),
                   "load: result type is tile<8xf32>, expected tile<8xbf16>");
  }
  SUBCASE("store of the wrong dtype") {
    Builder b;
    Value* x = b.k->add_param("x", Type::tensor(kBF16, 1));
    Value* i = b.i32(0);
    Value* t = b.zeros({8});
    check_op_error(
        b, b.raw(OpCode::Store, {x, i, i, t}, {}, A().dims({0})),
        "store: the stored value tile<8xf32> has dtype f32, but the tensor is tensor<?xbf16> (cast it first)");
  }
  SUBCASE("store dims do not match the value's rank") {
    Builder b;
    Value* x = b.k->add_param("x", Type::tensor(kF32, 2));
    Value* i = b.i32(0);
    Value* t = b.zeros({8, 8});
    check_op_error(b, b.raw(OpCode::Store, {x, i, i, i, i, t}, {}, A().dims({1})),
                   "store: dims [1] has 1 entries, but the stored value tile<8x8xf32> has rank 2");
  }
  SUBCASE("program_id axis") {
    Builder b;
    check_op_error(b, b.raw(OpCode::ProgramId, {}, {scalar(kI32)}, A().axis(3)),
                   "program_id: axis must be 0, 1 or 2, got 3");
  }
  SUBCASE("dim of a scalar") {
    Builder b;
    Value* s = b.f32(0);
    check_op_error(b, b.raw(OpCode::Dim, {s}, {scalar(kI32)}), "dim: operand #0 must be a tensor, got f32");
  }
  SUBCASE("i32 constant out of range") {
    Builder b;
    check_op_error(b, b.raw(OpCode::Constant, {}, {scalar(kI32)}, A().ivalue(int64_t{1} << 40)),
                   "constant: value 1099511627776 does not fit in i32");
  }
}

TEST_CASE("verifier: control flow") {
  SUBCASE("loop-carried value changes type") {
    Builder b;
    Value* lo = b.i32(0);
    Value* s = b.f32(0);
    Value* acc = b.zeros({64, 64});
    Op* loop = b.raw(OpCode::For, {lo, lo, lo, s, acc}, {s->type, acc->type});
    Block* body = add_region(*b.k, loop, {scalar(kI32), s->type, acc->type});
    b.block = body;
    Value* narrow = b.zeros({64, 32});
    b.yield({body->args[1], narrow});
    const char* msg =
        "for: loop-carried value #1 changes type: it enters the loop as tile<64x64xf32> and the body yields "
        "tile<64x32xf32>";
    check_op_error(b, loop, msg);
    // The DSL checks the yield as it creates it, so the same mistake is also caught from there.
    auto e = user_error([&] { verify_op(*body->ops.back()); });
    REQUIRE(e.has_value());
    CHECK(std::string(e->what()).find("yield: loop-carried value #1 changes type") != std::string::npos);
  }
  SUBCASE("loop bounds must be i32") {
    Builder b;
    Value* lo = b.i32(0);
    Value* f = b.f32(4);
    Op* loop = b.raw(OpCode::For, {lo, f, lo}, {});
    b.block = add_region(*b.k, loop, {scalar(kI32)});
    b.yield({});
    check_op_error(b, loop, "for: the upper bound must be an i32 scalar, got f32");
  }
  SUBCASE("loop body without a yield") {
    Builder b;
    Value* lo = b.i32(0);
    Op* loop = b.raw(OpCode::For, {lo, lo, lo, lo}, {lo->type});
    b.block = add_region(*b.k, loop, {scalar(kI32), scalar(kI32)});
    b.i32(1);
    check_op_error(b, loop, "for: the body must end with a yield of 1 value");
  }
  SUBCASE("if condition is not i1") {
    Builder b;
    Value* c = b.i32(1);
    Op* branch = b.raw(OpCode::If, {c}, {});
    for (int r = 0; r < 2; ++r) {
      b.block = add_region(*b.k, branch, {});
      b.yield({});
    }
    check_op_error(b, branch, "if: the condition must be an i1 scalar, got i32");
  }
  SUBCASE("if branches yield the wrong type") {
    Builder b;
    Value* c = b.op(OpCode::Constant, {}, scalar(kI1), A().ivalue(1));
    Op* branch = b.raw(OpCode::If, {c}, {scalar(kF32)});
    b.block = add_region(*b.k, branch, {});
    b.yield({b.f32(1)});
    b.block = add_region(*b.k, branch, {});
    b.yield({b.i32(1)});
    check_op_error(b, branch, "if: the else branch yields i32 for result #0, but the if's result #0 is f32");
  }
  SUBCASE("a value used outside its loop") {
    Builder b;
    Value* lo = b.i32(0);
    Op* loop = b.raw(OpCode::For, {lo, lo, lo}, {});
    b.block = add_region(*b.k, loop, {scalar(kI32)});
    Value* inner = b.i32(5);
    b.yield({});
    b.block = &b.k->body;
    Op* use = b.raw(OpCode::Add, {inner, lo}, {scalar(kI32)});
    verify_op(*use);  // well typed: only the whole-kernel check sees the scope problem
    check_kernel_error(b, use->loc.line,
                       "add: operand #0 (the result of constant at k.cpp:102:5) is not defined before this op");
  }
  SUBCASE("use before definition") {
    Builder b;
    Op* add = b.raw(OpCode::Add, {nullptr, nullptr}, {scalar(kI32)});
    Value* later = b.i32(1);
    add->operands = {later, later};
    check_kernel_error(b, add->loc.line, "add: operand #0 (the result of constant at k.cpp:101:5)");
  }
  SUBCASE("yield in the kernel body") {
    Builder b;
    check_op_error(b, b.raw(OpCode::Yield, {}, {}), "yield: only allowed as the last op of a for or if body");
  }
  SUBCASE("yield that is not last") {
    Builder b;
    Value* lo = b.i32(0);
    Op* loop = b.raw(OpCode::For, {lo, lo, lo}, {});
    b.block = add_region(*b.k, loop, {scalar(kI32)});
    b.yield({});
    Op* early = b.block->ops.back().get();
    b.yield({});
    check_kernel_error(b, early->loc.line, "yield: must be the last op of its for body");
  }
}

TEST_CASE("verifier: kernel header") {
  SUBCASE("duplicate parameter names") {
    Builder b;
    b.k->loc = {"k.cpp", 7, 1};
    b.k->add_param("q", scalar(kF32));
    b.k->add_param("q", scalar(kI32));
    check_kernel_error(b, 7, "kernel @t: two parameters are named 'q'");
  }
  SUBCASE("tile parameters") {
    Builder b;
    b.k->loc = {"k.cpp", 7, 1};
    b.k->add_param("q", tile(kF32, {4}));
    check_kernel_error(b, 7, "kernel @t: parameter %q is a tile (tile<4xf32>); parameters are tensors or scalars");
  }
  SUBCASE("num_warps") {
    Builder b;
    b.k->loc = {"k.cpp", 7, 1};
    b.k->num_warps = 6;
    check_kernel_error(b, 7, "num_warps must be a power of two from 1 to 32, got 6");
  }
}
