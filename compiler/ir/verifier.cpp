#include "compiler/ir/verifier.h"

#include <fmt/format.h>

#include <unordered_set>
#include <utility>

#include "compiler/ir/printer.h"

namespace linac::ir {
namespace {

// Thrown by the checks below and turned into a UserError (verify, verify_op) or a Diagnostic
// (find_error) at the public entry points, which decide where the error is located.
struct Finding {
  const Op* op;  // null for the kernel header
  std::string message;
};

std::string int_list(const std::vector<int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

// What is wrong with a tile shape, or "" if nothing. Bounding the element count here is what lets
// every later check multiply dimensions without overflow.
std::string shape_problem(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = shape[i];
    if (d <= 0) return fmt::format("dimension #{} is {}; tile dimensions must be positive", i, d);
    if (d > kMaxTileElements || n > kMaxTileElements / d)
      return fmt::format("more than {} elements, the largest tile linac supports", kMaxTileElements);
    n *= d;
  }
  return {};
}

// What is wrong with a type itself, independent of the op using it, or "" if nothing.
std::string type_problem(const Type& t) {
  switch (t.kind) {
    case Type::Kind::Scalar:
      return t.shape.empty() ? "" : "a scalar type must not have a shape";
    case Type::Kind::Tile:
      if (t.shape.empty()) return "a tile needs at least one dimension (use a scalar type instead)";
      return shape_problem(t.shape);
    case Type::Kind::Tensor:
      for (int64_t d : t.shape)
        if (d != -1) return "a tensor's shape is a runtime value; its static shape must be all '?'";
      return {};
  }
  return "unknown type kind";
}

bool is_i32_scalar(const Type& t) {
  return t.is_scalar() && t.dtype == DType::i32;
}
bool is_index_scalar(const Type& t) {
  return t.is_scalar() && (t.dtype == DType::i32 || t.dtype == DType::i64);
}
bool is_dot_dtype(DType d) {
  return d == DType::f16 || d == DType::bf16 || d == DType::f32;
}

// An op named for an error message.
std::string op_name(const Op& op, Spelling spelling) {
  return spelling == Spelling::dsl ? dsl_spelling(op) : std::string(opcode_name(op.code));
}

// A value named for an error message; values have no stable text name outside the printer.
std::string describe(const Value* v, Spelling spelling) {
  if (v->def) return fmt::format("the result of {} at {}", op_name(*v->def, spelling), v->def->loc.str());
  if (v->owner && v->owner->parent) return fmt::format("an argument of a {} body", op_name(*v->owner->parent, spelling));
  if (!v->name.empty()) return "%" + v->name;
  return "a value with no definition";
}

/// Checks the typing rules of one op.
class OpChecker {
 public:
  OpChecker(const Op& op, Spelling spelling) : op_(op), spelling_(spelling), name_(op_name(op, spelling)) {}

  void run() {
    check_common();
    switch (op_.code) {
      case OpCode::Constant:
        return check_constant();
      case OpCode::ProgramId:
      case OpCode::NumPrograms:
        return check_program_index();
      case OpCode::Dim:
        return check_dim();
      case OpCode::Iota:
        return check_iota();
      case OpCode::Add:
      case OpCode::Sub:
      case OpCode::Mul:
      case OpCode::Div:
      case OpCode::Rem:
      case OpCode::Max:
      case OpCode::Min:
      case OpCode::Pow:
      case OpCode::And:
      case OpCode::Or:
        return check_binary();
      case OpCode::Neg:
      case OpCode::Exp:
      case OpCode::Exp2:
      case OpCode::Log:
      case OpCode::Log2:
      case OpCode::Sigmoid:
      case OpCode::Sqrt:
      case OpCode::Rsqrt:
      case OpCode::Abs:
      case OpCode::Not:
        return check_unary();
      case OpCode::Cmp:
        return check_cmp();
      case OpCode::Select:
        return check_select();
      case OpCode::Cast:
        return check_cast();
      case OpCode::Splat:
        return check_splat();
      case OpCode::Broadcast:
        return check_broadcast();
      case OpCode::ExpandDims:
        return check_expand_dims();
      case OpCode::Reshape:
        return check_reshape();
      case OpCode::Transpose:
        return check_transpose();
      case OpCode::Reduce:
        return check_reduce();
      case OpCode::Scan:
        return check_scan();
      case OpCode::Take:
        return check_take();
      case OpCode::Slice:
        return check_slice();
      case OpCode::Concat:
        return check_concat();
      case OpCode::Place:
        return check_place();
      case OpCode::Dot:
        return check_dot();
      case OpCode::Load:
        return check_load();
      case OpCode::Store:
        return check_store();
      case OpCode::Signal:
      case OpCode::Wait:
        return check_flag_op();
      case OpCode::For:
        return check_for();
      case OpCode::If:
        return check_if();
      case OpCode::Yield:
        return check_yield_op();
    }
    fail("unknown opcode");
  }

 private:
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw Finding{&op_, fmt::format("{}: {}", name_, fmt::format(f, std::forward<Args>(args)...))};
  }

  // Counts, null pointers, result types and regions: what every op needs before its own rules can
  // index operands and results safely.
  void check_common() {
    for (size_t i = 0; i < op_.operands.size(); ++i)
      if (!op_.operands[i]) fail("operand #{} is null", i);
    for (size_t i = 0; i < op_.results.size(); ++i) {
      if (!op_.results[i]) fail("result #{} is null", i);
      const Type& t = op_.results[i]->type;
      if (std::string p = type_problem(t); !p.empty()) fail("result #{} has type {}: {}", i, t.str(), p);
      if (t.is_tensor()) fail("result #{} is a tensor; only kernel parameters are tensors", i);
    }
    size_t regions = op_.code == OpCode::For ? 1 : op_.code == OpCode::If ? 2 : 0;
    if (op_.regions.size() != regions) fail("expects {} regions, got {}", regions, op_.regions.size());
    for (const auto& r : op_.regions)
      if (!r) fail("has a null region");
  }

  void expect_operands(size_t n) const {
    if (op_.operands.size() != n) fail("expects {} operand{}, got {}", n, n == 1 ? "" : "s", op_.operands.size());
  }
  void expect_results(size_t n) const {
    if (op_.results.size() != n) fail("expects {} result{}, got {}", n, n == 1 ? "" : "s", op_.results.size());
  }
  void expect_counts(size_t operands, size_t results) const {
    expect_operands(operands);
    expect_results(results);
  }
  const Type& result_type() const { return op_.results[0]->type; }
  void expect_result(const Type& want) const {
    if (result_type() != want) fail("result type is {}, expected {}", result_type().str(), want.str());
  }

  // A scalar or tile operand: tensors only feed dim, load and store.
  const Type& value_operand(size_t i, std::string_view what) const {
    const Type& t = op_.operands[i]->type;
    if (t.is_tensor()) fail("{} is a tensor ({}); load a tile from it first", what, t.str());
    return t;
  }
  const Type& tile_operand(std::string_view hint) const {
    const Type& t = value_operand(0, "the operand");
    if (!t.is_tile()) fail("the operand must be a tile, got {}{}", t.str(), hint);
    return t;
  }
  const Type& tensor_operand() const {
    const Type& t = op_.operands[0]->type;
    if (!t.is_tensor()) fail("operand #0 must be a tensor, got {}", t.str());
    return t;
  }

  void check_attr_shape(std::string_view key, const std::vector<int64_t>& shape) const {
    if (shape.empty()) fail("{} is empty; a tile needs at least one dimension", key);
    if (std::string p = shape_problem(shape); !p.empty()) fail("{} {}: {}", key, int_list(shape), p);
  }
  void check_axis(int64_t axis, int rank, const Type& t) const {
    if (axis < 0 || axis >= rank) fail("axis {} is out of range for {} (rank {})", axis, t.str(), rank);
  }
  void check_dtype_enum(DType d) const {
    if (static_cast<int>(d) > static_cast<int>(DType::f64)) fail("invalid dtype");
  }

  void check_constant() {
    expect_counts(0, 1);
    const Type& t = result_type();
    check_dtype_enum(t.dtype);
    int64_t v = op_.attrs.ivalue;
    if (t.dtype == DType::i1 && v != 0 && v != 1) fail("an i1 constant must be 0 or 1, got {}", v);
    if (t.dtype == DType::i32 && (v < INT32_MIN || v > INT32_MAX)) fail("value {} does not fit in i32", v);
  }

  void check_program_index() {
    expect_counts(0, 1);
    if (op_.attrs.axis < 0 || op_.attrs.axis > 2) fail("axis must be 0, 1 or 2, got {}", op_.attrs.axis);
    expect_result(Type::scalar(DType::i32));
  }

  void check_dim() {
    expect_counts(1, 1);
    const Type& t = tensor_operand();
    check_axis(op_.attrs.axis, t.rank(), t);
    expect_result(Type::scalar(DType::i32));
  }

  void check_iota() {
    expect_counts(0, 1);
    const Type& t = result_type();
    if (!t.is_tile() || t.rank() != 1 || t.dtype != DType::i32)
      fail("result must be a rank-1 i32 tile, got {}", t.str());
  }

  void check_binary() {
    expect_counts(2, 1);
    const Type& a = value_operand(0, "operand #0");
    const Type& b = value_operand(1, "operand #1");
    if (a != b)
      fail("operands have different types: {} and {} ({})", a.str(), b.str(),
           a.kind == b.kind && a.shape == b.shape ? "cast one of them first" : "splat or broadcast one of them first");
    check_dtype_enum(a.dtype);
    DType d = a.dtype;
    switch (op_.code) {
      case OpCode::And:
      case OpCode::Or:
        if (d != DType::i1) fail("operands must be i1, got {}", a.str());
        break;
      case OpCode::Rem:
        if (!is_int(d) || d == DType::i1) fail("operands must be i32 or i64, got {}", a.str());
        break;
      case OpCode::Pow:
        if (!is_float(d)) fail("operands must be floats, got {} (cast them first)", a.str());
        break;
      case OpCode::Max:
      case OpCode::Min:
        break;
      default:
        if (d == DType::i1)
          fail("operands are i1; arithmetic needs numbers (use {} on i1)", spell("and/or/not", "`&`, `|` and `!`"));
        break;
    }
    expect_result(a);
  }

  void check_unary() {
    expect_counts(1, 1);
    const Type& a = value_operand(0, "the operand");
    check_dtype_enum(a.dtype);
    switch (op_.code) {
      case OpCode::Not:
        if (a.dtype != DType::i1) fail("the operand must be i1, got {}", a.str());
        break;
      case OpCode::Neg:
      case OpCode::Abs:
        if (a.dtype == DType::i1) fail("the operand is i1; use {} on i1", spell("not", "`!`"));
        break;
      default:
        if (!is_float(a.dtype)) fail("the operand must be a float, got {} (cast it first)", a.str());
        break;
    }
    expect_result(a);
  }

  void check_cmp() {
    expect_counts(2, 1);
    const Type& a = value_operand(0, "operand #0");
    const Type& b = value_operand(1, "operand #1");
    if (a != b) fail("operands have different types: {} and {}", a.str(), b.str());
    if (static_cast<int>(op_.attrs.pred) > static_cast<int>(CmpPred::ne)) fail("invalid predicate");
    expect_result(a.with_dtype(DType::i1));
  }

  void check_select() {
    expect_counts(3, 1);
    const Type& c = value_operand(0, "the condition");
    const Type& a = value_operand(1, "operand #1");
    const Type& b = value_operand(2, "operand #2");
    if (c.dtype != DType::i1) fail("the condition must be i1, got {}", c.str());
    if (a != b) fail("the two values have different types: {} and {}", a.str(), b.str());
    if (c.kind != a.kind || c.shape != a.shape)
      fail("the condition {} and the values {} differ in shape", c.str(), a.str());
    expect_result(a);
  }

  void check_cast() {
    expect_counts(1, 1);
    const Type& a = value_operand(0, "the operand");
    check_dtype_enum(op_.attrs.dtype);
    expect_result(a.with_dtype(op_.attrs.dtype));
  }

  void check_splat() {
    expect_counts(1, 1);
    const Type& a = value_operand(0, "the operand");
    if (!a.is_scalar()) fail("the operand must be a scalar, got {} (use broadcast for tiles)", a.str());
    check_attr_shape("shape", op_.attrs.shape);
    expect_result(Type::tile(a.dtype, op_.attrs.shape));
  }

  void check_broadcast() {
    expect_counts(1, 1);
    const Type& a = tile_operand(" (use splat for scalars)");
    const auto& shape = op_.attrs.shape;
    check_attr_shape("shape", shape);
    if (static_cast<int>(shape.size()) != a.rank())
      fail("shape {} has rank {}, but the operand {} has rank {} (use expand_dims first)", int_list(shape),
           shape.size(), a.str(), a.rank());
    for (size_t i = 0; i < shape.size(); ++i)
      if (a.shape[i] != shape[i] && a.shape[i] != 1)
        fail("cannot broadcast dimension #{} of {} from {} to {} (only size-1 dimensions broadcast)", i, a.str(),
             a.shape[i], shape[i]);
    expect_result(Type::tile(a.dtype, shape));
  }

  void check_expand_dims() {
    expect_counts(1, 1);
    const Type& a = value_operand(0, "the operand");
    int64_t axis = op_.attrs.axis;
    if (axis < 0 || axis > a.rank()) fail("axis {} is out of range [0, {}] for {}", axis, a.rank(), a.str());
    std::vector<int64_t> shape = a.shape;
    shape.insert(shape.begin() + axis, 1);
    expect_result(Type::tile(a.dtype, std::move(shape)));
  }

  void check_reshape() {
    expect_counts(1, 1);
    const Type& a = tile_operand(" (use splat for scalars)");
    check_attr_shape("shape", op_.attrs.shape);
    Type want = Type::tile(a.dtype, op_.attrs.shape);
    if (want.numel() != a.numel())
      fail("cannot reshape {} ({} elements) to {} ({} elements)", a.str(), a.numel(), int_list(op_.attrs.shape),
           want.numel());
    expect_result(want);
  }

  void check_transpose() {
    expect_counts(1, 1);
    const Type& a = tile_operand("");
    const auto& perm = op_.attrs.perm;
    if (static_cast<int>(perm.size()) != a.rank())
      fail("perm {} has {} entries, but the operand {} has rank {}", int_list(perm), perm.size(), a.str(), a.rank());
    std::vector<bool> seen(perm.size(), false);
    std::vector<int64_t> shape;
    for (int64_t p : perm) {
      if (p < 0 || p >= a.rank() || seen[p])
        fail("perm {} is not a permutation of 0..{}", int_list(perm), a.rank() - 1);
      seen[p] = true;
      shape.push_back(a.shape[p]);
    }
    expect_result(Type::tile(a.dtype, std::move(shape)));
  }

  // Shared by reduce and scan: a numeric tile and an axis inside it.
  const Type& check_along_axis() {
    expect_counts(1, 1);
    const Type& a = tile_operand("");
    check_axis(op_.attrs.axis, a.rank(), a);
    if (a.dtype == DType::i1) fail("cannot {} i1 values (cast them to i32 first)", name_);
    if (static_cast<int>(op_.attrs.reduce) > static_cast<int>(ReduceKind::min)) fail("invalid kind");
    return a;
  }

  void check_reduce() {
    const Type& a = check_along_axis();
    std::vector<int64_t> shape = a.shape;
    shape.erase(shape.begin() + op_.attrs.axis);
    expect_result(Type::value(a.dtype, std::move(shape)));
  }

  void check_scan() {
    const Type& a = check_along_axis();
    if (op_.attrs.reduce != ReduceKind::sum)
      fail("only kind = sum is supported, got {}", reduce_kind_name(op_.attrs.reduce));
    expect_result(a);
  }

  void check_take() {
    expect_counts(2, 1);
    const Type& a = value_operand(0, "x");
    if (!a.is_tile()) fail("x must be a tile, got {}", a.str());
    if (op_.attrs.axis < 0 || op_.attrs.axis >= a.rank()) fail("axis {} is out of range for {}", op_.attrs.axis, a.str());
    const Type& i = value_operand(1, "index");
    if (!i.is_scalar() || i.dtype != DType::i32) fail("index must be an i32 scalar, got {}", i.str());
    std::vector<int64_t> shape = a.shape;
    shape.erase(shape.begin() + op_.attrs.axis);
    expect_result(Type::value(a.dtype, std::move(shape)));
  }

  // A block of `block_shape` at `offsets` must lie inside `outer` (slice reads it, place writes it).
  void check_block_inside(const Type& outer, const std::vector<int64_t>& block_shape, std::string_view block) const {
    const auto& off = op_.attrs.offsets;
    if (static_cast<int>(off.size()) != outer.rank())
      fail("offsets {} has {} entries, but {} has rank {}", int_list(off), off.size(), outer.str(), outer.rank());
    for (size_t d = 0; d < off.size(); ++d)
      if (off[d] < 0 || off[d] > outer.shape[d] - block_shape[d])
        fail("{} {} at offsets {} does not fit in {}: along axis {} it starts at {} and has {} elements, of {}",
             block, int_list(block_shape), int_list(off), outer.str(), d, off[d], block_shape[d], outer.shape[d]);
  }

  // Operands: the tile, then either nothing or one i32 start per axis added to `offsets` at run time
  // (the static part must lie inside; the interpreter checks the whole, the GPU does not).
  void check_slice() {
    expect_results(1);
    if (op_.operands.empty()) expect_operands(1);
    const Type& a = tile_operand("");
    if (op_.operands.size() != 1 && static_cast<int>(op_.operands.size()) != 1 + a.rank())
      fail("takes the tile and either no starts or one per axis ({}), got {} operands", a.rank(), op_.operands.size());
    for (size_t d = 1; d < op_.operands.size(); ++d) {
      const Type& s = value_operand(d, "a start");
      if (!s.is_scalar() || s.dtype != DType::i32) fail("start {} must be an i32 scalar, got {}", d - 1, s.str());
    }
    const Type& r = result_type();
    if (!r.is_tile() || r.rank() != a.rank() || r.dtype != a.dtype)
      fail("result type is {}, expected a tile of rank {} and dtype {} (a slice keeps the rank)", r.str(), a.rank(),
           dtype_name(a.dtype));
    check_block_inside(a, r.shape, "the slice");
  }

  void check_concat() {
    if (op_.operands.empty()) fail("expects at least one operand");
    expect_results(1);
    const Type& first = value_operand(0, "operand #0");
    if (!first.is_tile()) fail("operand #0 must be a tile, got {}", first.str());
    check_axis(op_.attrs.axis, first.rank(), first);
    const size_t axis = static_cast<size_t>(op_.attrs.axis);
    std::vector<int64_t> shape = first.shape;
    for (size_t i = 1; i < op_.operands.size(); ++i) {
      const Type& t = value_operand(i, fmt::format("operand #{}", i));
      if (!t.is_tile() || t.dtype != first.dtype || t.rank() != first.rank())
        fail("operand #{} is {}, but operand #0 is {}: the parts must be tiles of one dtype and rank", i, t.str(),
             first.str());
      for (size_t d = 0; d < shape.size(); ++d)
        if (d != axis && t.shape[d] != first.shape[d])
          fail("operand #{} is {}, but operand #0 is {}: the parts may differ only along axis {}", i, t.str(),
               first.str(), axis);
      shape[axis] += t.shape[axis];
    }
    if (std::string p = shape_problem(shape); !p.empty()) fail("the joined shape {}: {}", int_list(shape), p);
    expect_result(Type::tile(first.dtype, std::move(shape)));
  }

  void check_place() {
    expect_counts(2, 1);
    const Type& big = value_operand(0, "the tile placed into");
    const Type& block = value_operand(1, "the block");
    if (!big.is_tile()) fail("the tile placed into must be a tile, got {}", big.str());
    if (!block.is_tile()) fail("the block must be a tile, got {}", block.str());
    if (block.dtype != big.dtype || block.rank() != big.rank())
      fail("the block {} and the tile {} must have one dtype and rank", block.str(), big.str());
    check_block_inside(big, block.shape, "the block");
    expect_result(big);
  }

  void check_dot() {
    expect_counts(2, 1);
    const Type& a = value_operand(0, "a");
    const Type& b = value_operand(1, "b");
    if (!a.is_tile() || a.rank() != 2) fail("a must be a rank-2 tile, got {}", a.str());
    if (!b.is_tile() || b.rank() != 2) fail("b must be a rank-2 tile, got {}", b.str());
    if (a.dtype != b.dtype)
      fail("a and b have different dtypes: a is {}, b is {} (cast one of them first)", a.str(), b.str());
    if (!is_dot_dtype(a.dtype)) fail("inputs must be f16, bf16 or f32, got {}", a.str());
    if (a.shape[1] != b.shape[0]) fail("inner dimensions differ: a is {}, b is {}", a.str(), b.str());
    expect_result(Type::tile(DType::f32, {a.shape[0], b.shape[1]}));
  }

  // Offsets and limits of load/store: operands [1, 1 + rank) and [1 + rank, 1 + 2 rank).
  void check_indices(int rank) const {
    for (int i = 0; i < rank; ++i) {
      const Type& off = op_.operands[1 + i]->type;
      if (!is_index_scalar(off)) fail("offset #{} must be an i32 or i64 scalar, got {}", i, off.str());
      const Type& lim = op_.operands[1 + rank + i]->type;
      if (!is_index_scalar(lim)) fail("limit #{} must be an i32 or i64 scalar, got {}", i, lim.str());
    }
  }

  // dims maps tile axes to tensor dimensions; any order is allowed (dims = [3, 1] loads transposed).
  void check_dims(const Type& tensor) const {
    const auto& dims = op_.attrs.dims;
    std::vector<bool> seen(tensor.rank(), false);
    for (int64_t d : dims) {
      if (d < 0 || d >= tensor.rank())
        fail("dims {}: {} is not a dimension of {} (rank {})", int_list(dims), d, tensor.str(), tensor.rank());
      if (seen[d]) fail("dims {} names tensor dimension {} twice", int_list(dims), d);
      seen[d] = true;
    }
  }

  void check_load() {
    if (op_.operands.empty()) fail("expects a tensor operand");
    const Type& t = tensor_operand();
    size_t rank = t.shape.size();
    if (op_.operands.size() != 1 + 2 * rank)
      fail("expects {} operands for {} (the tensor, {} offsets and {} limits), got {}", 1 + 2 * rank, t.str(), rank,
           rank, op_.operands.size());
    check_indices(t.rank());
    check_dims(t);
    const auto& shape = op_.attrs.shape;
    if (op_.attrs.dims.size() != shape.size())
      fail("dims {} and shape {} have different lengths", int_list(op_.attrs.dims), int_list(shape));
    if (std::string p = shape_problem(shape); !p.empty()) fail("shape {}: {}", int_list(shape), p);
    expect_results(1);
    expect_result(Type::value(t.dtype, shape));
  }

  void check_store() {
    if (op_.operands.size() < 2) fail("expects a tensor, offsets, limits and a value");
    const Type& t = tensor_operand();
    size_t rank = t.shape.size();
    if (op_.operands.size() != 2 + 2 * rank)
      fail("expects {} operands for {} (the tensor, {} offsets, {} limits and the value), got {}", 2 + 2 * rank,
           t.str(), rank, rank, op_.operands.size());
    check_indices(t.rank());
    const Type& v = value_operand(op_.operands.size() - 1, "the stored value");
    if (v.dtype != t.dtype)
      fail("the stored value {} has dtype {}, but the tensor is {} (cast it first)", v.str(), dtype_name(v.dtype),
           t.str());
    check_dims(t);
    if (static_cast<int>(op_.attrs.dims.size()) != v.rank())
      fail("dims {} has {} entries, but the stored value {} has rank {}", int_list(op_.attrs.dims),
           op_.attrs.dims.size(), v.str(), v.rank());
    expect_results(0);
  }

  // signal (tensor, offsets) / wait (tensor, offsets, count) on an i32 tensor's element. Both hold a
  // barrier of the program's threads: none in an if, where not every thread may reach it.
  void check_flag_op() {
    if (op_.operands.empty()) fail("expects an i32 tensor operand");
    const Type& t = tensor_operand();
    if (t.dtype != DType::i32) fail("the flags tensor {} must be i32", t.str());
    const size_t rank = t.shape.size(), extra = op_.code == OpCode::Wait ? 1 : 0;
    if (op_.operands.size() != 1 + rank + extra)
      fail("expects {} operands for {} (the tensor, {} offsets{}), got {}", 1 + rank + extra, t.str(), rank,
           extra ? " and the count" : "", op_.operands.size());
    for (size_t i = 0; i < rank + extra; ++i) {
      const Type& x = op_.operands[1 + i]->type;
      if (!is_index_scalar(x))
        fail("{} must be an i32 or i64 scalar, got {}", i < rank ? fmt::format("offset #{}", i) : "the count", x.str());
    }
    expect_results(0);
    for (const Block* b = op_.parent; b && b->parent; b = b->parent->parent)
      if (b->parent->code == OpCode::If) fail("stands in an if: it holds a barrier every thread must reach");
  }

  // The region's terminator, or a failure naming what it should yield.
  const Op& terminator(size_t region, std::string_view what, size_t count) const {
    const Block& b = *op_.regions[region];
    if (b.ops.empty() || b.ops.back()->code != OpCode::Yield)
      fail("{} must end with a yield of {} value{}", what, count, count == 1 ? "" : "s");
    return *b.ops.back();
  }

  void check_for() {
    if (op_.operands.size() < 3)
      fail("expects a lower bound, an upper bound and a step, got {} operands", op_.operands.size());
    static constexpr std::string_view kBounds[] = {"the lower bound", "the upper bound", "the step"};
    for (size_t i = 0; i < 3; ++i)
      if (!is_i32_scalar(op_.operands[i]->type))
        fail("{} must be an i32 scalar, got {}", kBounds[i], op_.operands[i]->type.str());
    size_t n = op_.operands.size() - 3;
    for (size_t i = 0; i < n; ++i)
      if (init_type(i).is_tensor())
        fail("loop-carried value #{} is a tensor ({}); only tiles and scalars can be carried", i, init_type(i).str());
    const Block& body = *op_.regions[0];
    if (body.args.size() != 1 + n)
      fail("the body has {} arguments, expected {} (the induction variable and one per loop-carried value)",
           body.args.size(), 1 + n);
    for (const Value* a : body.args)
      if (!a) fail("the body has a null argument");
    if (!is_i32_scalar(body.args[0]->type))
      fail("the induction variable must be i32, got {}", body.args[0]->type.str());
    for (size_t i = 0; i < n; ++i)
      if (body.args[1 + i]->type != init_type(i))
        fail("loop-carried value #{} enters the loop as {} but the body argument is {}", i, init_type(i).str(),
             body.args[1 + i]->type.str());
    if (op_.results.size() != n) fail("has {} results but carries {} values", op_.results.size(), n);
    for (size_t i = 0; i < n; ++i)
      if (op_.results[i]->type != init_type(i))
        fail("result #{} is {} but loop-carried value #{} is {}", i, op_.results[i]->type.str(), i, init_type(i).str());
    check_yield(op_, terminator(0, "the body", n), 0);
  }

  const Type& init_type(size_t i) const { return op_.operands[3 + i]->type; }

  void check_if() {
    expect_operands(1);
    const Type& c = op_.operands[0]->type;
    if (!c.is_scalar() || c.dtype != DType::i1) fail("the condition must be an i1 scalar, got {}", c.str());
    for (size_t r = 0; r < 2; ++r) {
      if (!op_.regions[r]->args.empty()) fail("the {} branch must not have arguments", branch_name(r));
      check_yield(op_, terminator(r, fmt::format("the {} branch", branch_name(r)), op_.results.size()), r);
    }
  }

  static std::string_view branch_name(size_t region) { return region == 0 ? "then" : "else"; }

  // A yield against the for/if owning it (`region` says which branch of an if). Run from both sides:
  // from the for/if (the error points at the loop) and from the yield (the DSL checks each op as it
  // is created, and the yield is created last).
  void check_yield(const Op& owner, const Op& yield, size_t region) const {
    for (const Value* v : yield.operands)
      if (!v) fail("the yield has a null operand");
    if (owner.code == OpCode::For) {
      if (owner.operands.size() < 3) return;  // reported by the for itself
      size_t n = owner.operands.size() - 3;
      if (yield.operands.size() != n)
        fail("the body yields {} value{} but the loop carries {}", yield.operands.size(),
             yield.operands.size() == 1 ? "" : "s", n);
      for (size_t i = 0; i < n; ++i) {
        const Value* init = owner.operands[3 + i];
        if (init && yield.operands[i]->type != init->type)
          fail("loop-carried value #{} changes type: it enters the loop as {} and the body yields {}", i,
               init->type.str(), yield.operands[i]->type.str());
      }
      return;
    }
    if (yield.operands.size() != owner.results.size())
      fail("the {} branch yields {} value{} but the if has {} result{}", branch_name(region), yield.operands.size(),
           yield.operands.size() == 1 ? "" : "s", owner.results.size(), owner.results.size() == 1 ? "" : "s");
    for (size_t i = 0; i < owner.results.size(); ++i) {
      const Value* r = owner.results[i];
      if (r && yield.operands[i]->type != r->type)
        fail("the {} branch yields {} for result #{}, but the if's result #{} is {}", branch_name(region),
             yield.operands[i]->type.str(), i, i, r->type.str());
    }
  }

  void check_yield_op() {
    expect_results(0);
    const Block* b = op_.parent;
    const Op* owner = b ? b->parent : nullptr;
    if (!owner || (owner->code != OpCode::For && owner->code != OpCode::If))
      fail("only allowed as the last op of a for or if body");
    if (b->ops.empty() || b->ops.back().get() != &op_)
      fail("must be the last op of its {} body", op_name(*owner, spelling_));
    size_t region = 0;
    while (region < owner->regions.size() && owner->regions[region].get() != b) ++region;
    check_yield(*owner, op_, region);
  }

  // The word for `ir_word` in this spelling ("and" is "`&`" in the DSL).
  std::string_view spell(std::string_view ir_word, std::string_view dsl_word) const {
    return spelling_ == Spelling::dsl ? dsl_word : ir_word;
  }

  const Op& op_;
  Spelling spelling_;
  std::string name_;
};

[[noreturn]] void fail_header(const Kernel& k, const std::string& msg) {
  std::string who = is_identifier(k.name) ? fmt::format("kernel @{}", k.name) : std::string("kernel");
  throw Finding{nullptr, fmt::format("{}: {}", who, msg)};
}

void check_header(const Kernel& k) {
  if (!is_identifier(k.name))
    fail_header(k, fmt::format("the name '{}' is not an identifier (letters, digits and '_', not starting "
                               "with a digit)",
                               k.name));
  if (k.num_warps < 1 || k.num_warps > 32 || (k.num_warps & (k.num_warps - 1)) != 0)
    fail_header(k, fmt::format("num_warps must be a power of two from 1 to 32, got {}", k.num_warps));
  if (k.num_stages < 1 || k.num_stages > kMaxNumStages)
    fail_header(k, fmt::format("num_stages must be from 1 to {}, got {}", kMaxNumStages, k.num_stages));
  if (k.producer_warps != 0 && k.producer_warps != 4)
    fail_header(k, fmt::format("producer_warps must be 0 or 4 (one warpgroup), got {}", k.producer_warps));
  if (k.producer_warps && k.num_warps % 4 != 0)
    fail_header(k, fmt::format("producer_warps needs whole warpgroups computing (num_warps a multiple of 4), got {}",
                               k.num_warps));
  if (k.min_ctas_per_sm < 0 || k.min_ctas_per_sm > 32)
    fail_header(k, fmt::format("min_ctas_per_sm must be from 0 (unset) to 32, got {}", k.min_ctas_per_sm));
  if (k.body.args.size() != k.params.size())
    fail_header(k, fmt::format("the body has {} arguments for {} parameters", k.body.args.size(), k.params.size()));
  std::unordered_set<std::string_view> names;
  for (size_t i = 0; i < k.params.size(); ++i) {
    const Param& p = k.params[i];
    if (!p.value || p.value != k.body.args[i])
      fail_header(k, fmt::format("parameter #{} is not the body's argument #{}", i, i));
    if (!is_identifier(p.name))
      fail_header(k, fmt::format("parameter #{} is named '{}', which is not an identifier", i, p.name));
    if (!names.insert(p.name).second) fail_header(k, fmt::format("two parameters are named '{}'", p.name));
    const Type& t = p.value->type;
    if (std::string problem = type_problem(t); !problem.empty())
      fail_header(k, fmt::format("parameter %{} has type {}: {}", p.name, t.str(), problem));
    if (t.is_tile())
      fail_header(k, fmt::format("parameter %{} is a tile ({}); parameters are tensors or scalars", p.name, t.str()));
  }
}

/// Walks the kernel in program order, checking each op and that its operands are visible: defined
/// earlier in its block or in an enclosing block, as block arguments or op results.
class Walker {
 public:
  explicit Walker(Spelling spelling) : spelling_(spelling) {}

  void run(const Kernel& k) {
    check_header(k);
    for (const Value* a : k.body.args) visible_.insert(a);
    walk(k.body);
  }

 private:
  /// For a value made inside a for/if body and used after it: the DSL's likely cause.
  static std::string scope_hint(const Value* v) {
    const Block* blk = v->def ? v->def->parent : v->owner;
    for (; blk && blk->parent; blk = blk->parent->parent) {
      OpCode c = blk->parent->code;
      if (c == OpCode::For || c == OpCode::If)
        return fmt::format(" (it is computed inside the {} at {}: in the DSL, list the variable after the body "
                           "so that it is carried out of it)",
                           c == OpCode::For ? "loop" : "if", blk->parent->loc.str());
    }
    return "";
  }

  void walk(const Block& b) {
    std::vector<const Value*> defined;  // leave scope with this block
    for (const auto& op : b.ops) {
      LINAC_INTERNAL_CHECK(op->parent == &b, "an op's parent is not the block holding it");
      for (size_t i = 0; i < op->operands.size(); ++i) {
        const Value* v = op->operands[i];
        if (v && !visible_.count(v))
          throw Finding{op.get(), fmt::format("{}: operand #{} ({}) is not defined before this op in an "
                                              "enclosing scope{}",
                                              op_name(*op, spelling_), i, describe(v, spelling_), scope_hint(v))};
      }
      OpChecker(*op, spelling_).run();
      for (const auto& r : op->regions) {
        LINAC_INTERNAL_CHECK(r->parent == op.get(), "a region's Block::parent is not its op");
        for (const Value* a : r->args) visible_.insert(a);
        walk(*r);
        for (const Value* a : r->args) visible_.erase(a);
      }
      for (const Value* v : op->results) {
        if (!visible_.insert(v).second)
          throw Finding{op.get(), fmt::format("{}: defines a value that is already defined", op_name(*op, spelling_))};
        defined.push_back(v);
      }
    }
    for (const Value* v : defined) visible_.erase(v);
  }

  Spelling spelling_;
  std::unordered_set<const Value*> visible_;
};

}  // namespace

void verify_op(const Op& op, Spelling spelling) {
  try {
    OpChecker(op, spelling).run();
  } catch (const Finding& f) {
    throw UserError(op.loc, f.message);
  }
}

namespace {
std::optional<Diagnostic> first_error(const Kernel& k, Spelling spelling) {
  try {
    Walker(spelling).run(k);
  } catch (const Finding& f) {
    return Diagnostic{f.op, f.message};
  }
  return std::nullopt;
}
}  // namespace

std::optional<Diagnostic> find_error(const Kernel& k) { return first_error(k, Spelling::ir); }

void verify(const Kernel& k, Spelling spelling) {
  if (auto d = first_error(k, spelling)) throw UserError(d->op ? d->op->loc : k.loc, d->message);
}

}  // namespace linac::ir
