// The DSL's value ops: leaves, elementwise math with numpy broadcasting, shape ops, reductions, dot,
// loads and stores. Each call emits one or a few IR ops; the verifier's rules (run on every op as it
// is emitted) decide what is legal, so the DSL only adds what it alone knows (broadcasting, numbers).
#include <algorithm>
#include <fmt/format.h>

#include "dsl/src/context.h"

namespace linac::dsl {

using detail::emit1;
using detail::materialize;
using detail::use;
using ir::OpCode;
using ir::Type;

namespace {

SourceLoc sl(const Loc& l) { return SourceLoc::from(l); }

const Type& type_of(const Tile& t, const Loc& loc) { return use(t, loc, "operand")->type; }

/// Splats/expands/broadcasts `t` to `shape` (numpy rules: missing leading dims are added).
Tile broadcast_value(const Tile& t, const std::vector<int64_t>& shape, const Loc& loc) {
  const Type& ty = type_of(t, loc);
  if (ty.shape == shape) return t;
  if (ty.is_scalar()) {
    ir::Attrs a;
    a.shape = shape;
    return Tile(emit1(OpCode::Splat, {t.value()}, Type::tile(ty.dtype, shape), a, loc));
  }
  Tile x = t;
  if (ty.rank() < static_cast<int>(shape.size())) {
    std::vector<int64_t> padded(shape.size() - ty.shape.size(), 1);
    padded.insert(padded.end(), ty.shape.begin(), ty.shape.end());
    x = reshape(x, padded, loc);
  }
  return broadcast_to(x, shape, loc);
}

/// The numpy broadcast of two shapes, or UserError.
std::vector<int64_t> broadcast_shapes(const Type& a, const Type& b, const Loc& loc) {
  size_t n = std::max(a.shape.size(), b.shape.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.shape.size() ? 1 : a.shape[i - (n - a.shape.size())];
    int64_t db = i < n - b.shape.size() ? 1 : b.shape[i - (n - b.shape.size())];
    if (da != db && da != 1 && db != 1)
      throw UserError(sl(loc), fmt::format("cannot broadcast {} with {}", a.str(), b.str()));
    out[i] = std::max(da, db);
  }
  return out;
}

constexpr const char* kOperandNames[] = {"operand #0", "operand #1", "operand #2", "an operand"};

/// Brings operands to one shape; numbers become constants of the tiles' dtype.
std::vector<Tile> unify(std::vector<Operand> ops, const Loc& loc, DType number_dtype_default) {
  // Numbers take the dtype of the first tile that is not i1 (select's condition is not a candidate).
  for (size_t i = 0; i < ops.size(); ++i)
    if (!ops[i].is_number) use(ops[i].tile, loc, ops.size() == 1 ? "the operand" : kOperandNames[std::min<size_t>(i, 3)]);
  DType dt = number_dtype_default;
  bool found = false;
  for (auto& o : ops)
    if (!o.is_number && o.tile.value()->type.dtype != DType::i1) {
      dt = o.tile.value()->type.dtype;
      found = true;
      break;
    }
  if (!found)
    for (auto& o : ops)
      if (!o.is_number) {
        dt = o.tile.value()->type.dtype;
        break;
      }
  std::vector<Tile> tiles;
  for (auto& o : ops) tiles.push_back(materialize(o, dt));
  std::vector<int64_t> shape;
  Type acc = Type::scalar(dt);
  for (auto& t : tiles) {
    shape = broadcast_shapes(acc, type_of(t, loc), loc);
    acc = Type::value(dt, shape);
  }
  for (auto& t : tiles) t = broadcast_value(t, shape, loc);
  return tiles;
}

const Loc& loc_of(const Operand& a, const Operand& b) { return a.is_number ? b.loc : a.loc; }

Tile binary(OpCode code, const Operand& a, const Operand& b) {
  const Loc& loc = loc_of(a, b);
  if (a.is_number && b.is_number)
    throw UserError(sl(loc), fmt::format("{}: both operands are C++ numbers; compute it in C++", ir::dsl_spelling(code)));
  auto t = unify({a, b}, loc, DType::f32);
  const Type& ty = t[0].value()->type;
  return Tile(emit1(code, {t[0].value(), t[1].value()}, ty, {}, loc));
}

Tile compare(ir::CmpPred pred, const Operand& a, const Operand& b) {
  const Loc& loc = loc_of(a, b);
  if (a.is_number && b.is_number) {
    ir::Op probe{};
    probe.code = OpCode::Cmp;
    probe.attrs.pred = pred;
    throw UserError(sl(loc), fmt::format("{}: both operands are C++ numbers; compute it in C++", ir::dsl_spelling(probe)));
  }
  auto t = unify({a, b}, loc, DType::f32);
  ir::Attrs attrs;
  attrs.pred = pred;
  Type ty = t[0].value()->type.with_dtype(DType::i1);
  return Tile(emit1(OpCode::Cmp, {t[0].value(), t[1].value()}, ty, attrs, loc));
}

Tile unary(OpCode code, const Operand& a, DType number_dtype = DType::f32) {
  Tile t = materialize(a, number_dtype);
  const Type& ty = type_of(t, a.loc);
  return Tile(emit1(code, {t.value()}, ty, {}, a.loc));
}

int normalize_axis(int axis, int rank, const Loc& loc, const char* what) {
  int a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    throw UserError(sl(loc), fmt::format("{}: axis {} is out of range for rank {}", what, axis, rank));
  return a;
}

Tile reduce(ir::ReduceKind kind, const Tile& x, int axis, const Loc& loc) {
  const Type& ty = type_of(x, loc);
  if (ty.is_scalar()) throw UserError(sl(loc), "reduce: the operand is a scalar, not a tile");
  int a = normalize_axis(axis, ty.rank(), loc, "reduce");
  std::vector<int64_t> shape = ty.shape;
  shape.erase(shape.begin() + a);
  ir::Attrs attrs;
  attrs.axis = a;
  attrs.reduce = kind;
  return Tile(emit1(OpCode::Reduce, {x.value()}, Type::value(ty.dtype, shape), attrs, loc));
}

}  // namespace

// ---- Tile / Tensor accessors -----------------------------------------------------------------------

DType Tile::dtype(Loc loc) const { return detail::inspect(*this, loc)->type.dtype; }
const std::vector<int64_t>& Tile::shape(Loc loc) const { return detail::inspect(*this, loc)->type.shape; }
int Tile::rank(Loc loc) const { return detail::inspect(*this, loc)->type.rank(); }
bool Tile::is_scalar(Loc loc) const { return detail::inspect(*this, loc)->type.is_scalar(); }
Tile Tile::to(DType t, Loc loc) const { return cast(*this, t, loc); }
Tile Tile::T(Loc loc) const { return transpose(*this, {1, 0}, loc); }

DType Tensor::dtype(Loc loc) const { return detail::inspect(*this, loc)->type.dtype; }
int Tensor::rank(Loc loc) const { return detail::inspect(*this, loc)->type.rank(); }
Tile Tensor::dim(int axis, Loc loc) const {
  ir::Value* v = use(*this, loc, "the tensor");
  int a = normalize_axis(axis, v->type.rank(), loc, "dim");
  ir::Attrs attrs;
  attrs.axis = a;
  return Tile(emit1(OpCode::Dim, {v}, Type::scalar(DType::i32), attrs, loc));
}

// ---- leaves --------------------------------------------------------------------------------------

Tile program_id(int axis, Loc loc) {
  ir::Attrs a;
  a.axis = axis;
  return Tile(emit1(OpCode::ProgramId, {}, Type::scalar(DType::i32), a, loc));
}

Tile num_programs(int axis, Loc loc) {
  ir::Attrs a;
  a.axis = axis;
  return Tile(emit1(OpCode::NumPrograms, {}, Type::scalar(DType::i32), a, loc));
}

Tile full(std::vector<int64_t> shape, double value, DType dtype, Loc loc) {
  ir::Attrs a;
  if (is_float(dtype))
    a.fvalue = value;
  else
    a.ivalue = static_cast<int64_t>(value);
  return Tile(emit1(OpCode::Constant, {}, Type::value(dtype, std::move(shape)), a, loc));
}

Tile zeros(std::vector<int64_t> shape, DType dtype, Loc loc) { return full(std::move(shape), 0, dtype, loc); }
Tile constant(double value, DType dtype, Loc loc) { return full({}, value, dtype, loc); }

Tile iota(int64_t n, Loc loc) {
  if (n <= 0) throw UserError(sl(loc), fmt::format("iota: length must be positive, got {}", n));
  return Tile(emit1(OpCode::Iota, {}, Type::tile(DType::i32, {n}), {}, loc));
}

// ---- elementwise ---------------------------------------------------------------------------------

Tile operator+(Operand a, Operand b) { return binary(OpCode::Add, a, b); }
Tile operator-(Operand a, Operand b) { return binary(OpCode::Sub, a, b); }
Tile operator*(Operand a, Operand b) { return binary(OpCode::Mul, a, b); }
Tile operator/(Operand a, Operand b) { return binary(OpCode::Div, a, b); }
Tile operator%(Operand a, Operand b) { return binary(OpCode::Rem, a, b); }
Tile operator-(Operand a) { return unary(OpCode::Neg, a); }
Tile operator<(Operand a, Operand b) { return compare(ir::CmpPred::lt, a, b); }
Tile operator<=(Operand a, Operand b) { return compare(ir::CmpPred::le, a, b); }
Tile operator>(Operand a, Operand b) { return compare(ir::CmpPred::gt, a, b); }
Tile operator>=(Operand a, Operand b) { return compare(ir::CmpPred::ge, a, b); }
Tile operator==(Operand a, Operand b) { return compare(ir::CmpPred::eq, a, b); }
Tile operator!=(Operand a, Operand b) { return compare(ir::CmpPred::ne, a, b); }
Tile operator&(Operand a, Operand b) { return binary(OpCode::And, a, b); }
Tile operator|(Operand a, Operand b) { return binary(OpCode::Or, a, b); }
Tile operator!(Operand a) { return unary(OpCode::Not, a, DType::i1); }

Tile maximum(Operand a, Operand b) { return binary(OpCode::Max, a, b); }
Tile minimum(Operand a, Operand b) { return binary(OpCode::Min, a, b); }
Tile pow(Operand a, Operand b) { return binary(OpCode::Pow, a, b); }
Tile exp(Operand a) { return unary(OpCode::Exp, a); }
Tile exp2(Operand a) { return unary(OpCode::Exp2, a); }
Tile log(Operand a) { return unary(OpCode::Log, a); }
Tile log2(Operand a) { return unary(OpCode::Log2, a); }
Tile sigmoid(Operand a) { return unary(OpCode::Sigmoid, a); }
Tile sqrt(Operand a) { return unary(OpCode::Sqrt, a); }
Tile rsqrt(Operand a) { return unary(OpCode::Rsqrt, a); }
Tile abs(Operand a) { return unary(OpCode::Abs, a); }

Tile where(Operand cond, Operand a, Operand b) {
  const Loc& loc = cond.loc;
  if (a.is_number && b.is_number)
    throw UserError(sl(loc), "where: both branches are C++ numbers; give one of them as a Tile");
  Tile c = materialize(cond, DType::i1);
  auto t = unify({Operand(c, loc), a, b}, loc, DType::f32);
  const Type& ty = t[1].value()->type;
  return Tile(emit1(OpCode::Select, {t[0].value(), t[1].value(), t[2].value()}, ty, {}, loc));
}

Tile cast(const Tile& x, DType t, Loc loc) {
  const Type& ty = type_of(x, loc);
  if (ty.dtype == t) return x;
  ir::Attrs a;
  a.dtype = t;
  return Tile(emit1(OpCode::Cast, {x.value()}, ty.with_dtype(t), a, loc));
}

// ---- shape ---------------------------------------------------------------------------------------

Tile broadcast_to(const Tile& x, std::vector<int64_t> shape, Loc loc) {
  const Type& ty = type_of(x, loc);
  if (ty.shape == shape) return x;
  ir::Attrs a;
  a.shape = shape;
  if (ty.is_scalar()) return Tile(emit1(OpCode::Splat, {x.value()}, Type::tile(ty.dtype, shape), a, loc));
  return Tile(emit1(OpCode::Broadcast, {x.value()}, Type::tile(ty.dtype, shape), a, loc));
}

Tile expand_dims(const Tile& x, int axis, Loc loc) {
  const Type& ty = type_of(x, loc);
  int a = axis < 0 ? axis + ty.rank() + 1 : axis;
  if (a < 0 || a > ty.rank())
    throw UserError(sl(loc), fmt::format("expand_dims: axis {} is out of range for rank {}", axis, ty.rank()));
  std::vector<int64_t> shape = ty.shape;
  shape.insert(shape.begin() + a, 1);
  ir::Attrs attrs;
  attrs.axis = a;
  return Tile(emit1(OpCode::ExpandDims, {x.value()}, Type::tile(ty.dtype, shape), attrs, loc));
}

Tile reshape(const Tile& x, std::vector<int64_t> shape, Loc loc) {
  const Type& ty = type_of(x, loc);
  if (ty.shape == shape) return x;
  ir::Attrs a;
  a.shape = shape;
  return Tile(emit1(OpCode::Reshape, {x.value()}, Type::value(ty.dtype, shape), a, loc));
}

Tile transpose(const Tile& x, std::vector<int64_t> perm, Loc loc) {
  const Type& ty = type_of(x, loc);
  std::vector<int64_t> shape(perm.size(), 1);
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] >= 0 && perm[i] < ty.rank()) shape[i] = ty.shape[perm[i]];
  ir::Attrs a;
  a.perm = std::move(perm);
  return Tile(emit1(OpCode::Transpose, {x.value()}, Type::tile(ty.dtype, shape), a, loc));
}

Tile slice(const Tile& x, int axis, int64_t start, int64_t size, Loc loc) {
  const Type& ty = type_of(x, loc);
  if (ty.is_scalar()) throw UserError(sl(loc), "slice: the operand is a scalar, not a tile");
  const int a = normalize_axis(axis, ty.rank(), loc, "slice");
  const int64_t n = ty.shape[a];
  if (size < 1 || start < 0 || start > n - size)
    throw UserError(sl(loc), fmt::format("slice: {} elements from {} do not fit axis {} of {} (size {})", size, start,
                                         a, ty.str(), n));
  if (start == 0 && size == n) return x;
  ir::Attrs attrs;
  attrs.offsets.assign(ty.shape.size(), 0);
  attrs.offsets[a] = start;
  std::vector<int64_t> shape = ty.shape;
  shape[a] = size;
  return Tile(emit1(OpCode::Slice, {x.value()}, Type::tile(ty.dtype, std::move(shape)), attrs, loc));
}

Tile slice(const Tile& x, int axis, const Tile& start, int64_t size, Loc loc) {
  const Type& ty = type_of(x, loc);
  if (ty.is_scalar()) throw UserError(sl(loc), "slice: the operand is a scalar, not a tile");
  const Type& ts = type_of(start, loc);
  if (!ts.is_scalar() || ts.dtype != DType::i32)
    throw UserError(sl(loc), fmt::format("slice: the start must be an i32 scalar, got {}", ts.str()));
  const int a = normalize_axis(axis, ty.rank(), loc, "slice");
  if (size < 1 || size > ty.shape[a])
    throw UserError(sl(loc), fmt::format("slice: {} elements do not fit axis {} of {} (size {})", size, a, ty.str(),
                                         ty.shape[a]));
  ir::Attrs attrs;
  attrs.offsets.assign(ty.shape.size(), 0);
  std::vector<ir::Value*> operands = {x.value()};
  for (int d = 0; d < ty.rank(); ++d) operands.push_back(d == a ? start.value() : constant(0, DType::i32, loc).value());
  std::vector<int64_t> shape = ty.shape;
  shape[a] = size;
  return Tile(emit1(OpCode::Slice, operands, Type::tile(ty.dtype, std::move(shape)), attrs, loc));
}

Tile concat(const std::vector<Tile>& parts, int axis, Loc loc) {
  if (parts.empty()) throw UserError(sl(loc), "concat: no tiles to join");
  std::vector<ir::Value*> operands;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Type& t = type_of(parts[i], loc);
    if (t.is_scalar()) throw UserError(sl(loc), fmt::format("concat: part #{} is a scalar ({}), not a tile", i, t.str()));
    operands.push_back(parts[i].value());
  }
  const Type& first = operands[0]->type;
  ir::Attrs attrs;
  attrs.axis = normalize_axis(axis, first.rank(), loc, "concat");
  if (parts.size() == 1) return parts[0];
  // The verifier explains parts that do not fit together; the result type only has to be well-formed.
  std::vector<int64_t> shape = first.shape;
  for (size_t i = 1; i < operands.size(); ++i)
    if (operands[i]->type.rank() == first.rank()) shape[attrs.axis] += operands[i]->type.shape[attrs.axis];
  return Tile(emit1(OpCode::Concat, std::move(operands), Type::tile(first.dtype, std::move(shape)), attrs, loc));
}

Tile place(const Tile& big, const Tile& block, std::vector<int64_t> offsets, Loc loc) {
  const Type& tb = type_of(big, loc);
  type_of(block, loc);
  if (tb.is_scalar()) throw UserError(sl(loc), "place: the tile to place into is a scalar");
  ir::Attrs attrs;
  attrs.offsets = std::move(offsets);
  return Tile(emit1(OpCode::Place, {big.value(), block.value()}, tb, attrs, loc));
}

// ---- reductions and scans ------------------------------------------------------------------------

Tile sum(const Tile& x, int axis, Loc loc) { return reduce(ir::ReduceKind::sum, x, axis, loc); }
Tile max(const Tile& x, int axis, Loc loc) { return reduce(ir::ReduceKind::max, x, axis, loc); }
Tile min(const Tile& x, int axis, Loc loc) { return reduce(ir::ReduceKind::min, x, axis, loc); }

Tile cumsum(const Tile& x, int axis, bool reverse, Loc loc) {
  const Type& ty = type_of(x, loc);
  if (ty.is_scalar()) throw UserError(sl(loc), "cumsum: the operand is a scalar, not a tile");
  ir::Attrs a;
  a.axis = normalize_axis(axis, ty.rank(), loc, "cumsum");
  a.reverse = reverse;
  return Tile(emit1(OpCode::Scan, {x.value()}, ty, a, loc));
}

Tile take(const Tile& x, const Operand& index, int axis, Loc loc) {
  const Type& ty = type_of(x, loc);
  if (ty.is_scalar()) throw UserError(sl(loc), "take: the operand is a scalar, not a tile");
  Tile i = materialize(index, DType::i32);
  const Type& ti = type_of(i, loc);
  if (!ti.is_scalar() || ti.dtype != DType::i32)
    throw UserError(sl(loc), fmt::format("take: the index must be an i32 scalar, got {}", ti.str()));
  ir::Attrs a;
  a.axis = normalize_axis(axis, ty.rank(), loc, "take");
  std::vector<int64_t> shape = ty.shape;
  shape.erase(shape.begin() + a.axis);
  return Tile(emit1(OpCode::Take, {x.value(), i.value()}, Type::value(ty.dtype, shape), a, loc));
}

// ---- tensor cores --------------------------------------------------------------------------------

Tile dot(const Tile& a, const Tile& b, Loc loc) {
  const Type& ta = type_of(a, loc);
  const Type& tb = type_of(b, loc);
  // The verifier explains malformed operands; the result type here only has to be well-formed.
  int64_t m = ta.rank() == 2 ? ta.shape[0] : 1;
  int64_t n = tb.rank() == 2 ? tb.shape[1] : 1;
  return Tile(emit1(OpCode::Dot, {a.value(), b.value()}, Type::tile(DType::f32, {m, n}), {}, loc));
}

// ---- memory --------------------------------------------------------------------------------------

namespace {

/// Operands and attrs shared by load and store: offsets, limits, dims and the block shape.
struct Access {
  std::vector<ir::Value*> operands;  // tensor, offsets..., limits...
  ir::Attrs attrs;
};

Access make_access(const Tensor& t, const std::vector<Operand>& offsets, const std::vector<int64_t>& block,
                   const AccessOptions& opts, const Loc& loc, const char* what) {
  const int rank = use(t, loc, "the tensor")->type.rank();
  if (static_cast<int>(offsets.size()) != rank)
    throw UserError(sl(loc), fmt::format("{}: the tensor has rank {} but {} offsets were given", what, rank,
                                         offsets.size()));
  if (static_cast<int>(block.size()) != rank)
    throw UserError(sl(loc), fmt::format("{}: the tensor has rank {} but the block has {} sizes", what, rank,
                                         block.size()));
  Access acc;
  acc.operands.push_back(t.value());
  for (auto& o : offsets) acc.operands.push_back(use(materialize(o, DType::i32), o.loc, "an offset"));
  for (int d = 0; d < rank; ++d) {
    Tile limit;
    for (auto& [dim, lim] : opts.limits) {
      if (dim < 0 || dim >= rank)
        throw UserError(sl(loc), fmt::format("{}: limit given for dim {} of a rank-{} tensor", what, dim, rank));
      if (dim == d) limit = lim;
    }
    if (!limit.valid()) limit = t.dim(d, loc);
    acc.operands.push_back(use(limit, loc, "a limit"));
  }
  for (int d = 0; d < rank; ++d) {
    if (block[d] < 0)
      throw UserError(sl(loc), fmt::format("{}: block size {} for dim {} is negative", what, block[d], d));
    if (block[d] > 0) {
      acc.attrs.dims.push_back(d);
      acc.attrs.shape.push_back(block[d]);
    }
  }
  if (opts.transpose) {
    if (acc.attrs.dims.size() != 2)
      throw UserError(sl(loc), fmt::format("{}: transpose needs a 2-D block, this one has {} blocked dims", what,
                                           acc.attrs.dims.size()));
    std::swap(acc.attrs.dims[0], acc.attrs.dims[1]);
    std::swap(acc.attrs.shape[0], acc.attrs.shape[1]);
  }
  return acc;
}

}  // namespace

Tile load(const Tensor& t, std::vector<Operand> offsets, std::vector<int64_t> block, AccessOptions opts,
          Loc loc) {
  Access acc = make_access(t, offsets, block, opts, loc, "load");
  if (opts.prefetch && acc.attrs.shape.empty())
    throw UserError(sl(loc), "load: prefetch keeps a tile in shared memory; this block is a scalar");
  acc.attrs.prefetch = opts.prefetch;
  Type ty = Type::value(t.value()->type.dtype, acc.attrs.shape);
  return Tile(emit1(OpCode::Load, acc.operands, ty, acc.attrs, loc));
}

void store(const Tensor& t, std::vector<Operand> offsets, std::vector<int64_t> block, const Tile& value,
           AccessOptions opts, Loc loc) {
  if (opts.prefetch) throw UserError(sl(loc), "store: prefetch is an option of loads");
  Access acc = make_access(t, offsets, block, opts, loc, "store");
  const Type& vt = use(value, loc, "the stored value")->type;
  if (vt.shape != acc.attrs.shape)
    throw UserError(sl(loc), fmt::format("store: the value is {} but the block is [{}]", vt.str(),
                                         fmt::join(acc.attrs.shape, ", ")));
  acc.attrs.shape.clear();  // a store's block shape is its value's shape; the IR keeps only dims
  acc.operands.push_back(value.value());
  detail::emit(OpCode::Store, acc.operands, {}, acc.attrs, loc);
}

// ---- flags ---------------------------------------------------------------------------------------

namespace {

std::vector<ir::Value*> flag_operands(const Tensor& flags, const std::vector<Operand>& offsets, const Loc& loc,
                                      const char* what) {
  const ir::Type& t = use(flags, loc, "the flags")->type;
  if (t.dtype != DType::i32) throw UserError(sl(loc), fmt::format("{}: the flags tensor must be i32, got {}", what, t.str()));
  if (static_cast<int>(offsets.size()) != t.rank())
    throw UserError(sl(loc), fmt::format("{}: the flags tensor has rank {} but {} offsets were given", what, t.rank(),
                                         offsets.size()));
  std::vector<ir::Value*> operands{flags.value()};
  for (auto& o : offsets) operands.push_back(use(materialize(o, DType::i32), o.loc, "an offset"));
  return operands;
}

}  // namespace

// The deepest pipeline (a slack stage: compiler/passes/pipeline.h) copies this many iterations ahead.
static_assert(kPipelineLookahead >= ir::kMaxNumStages - 2, "wait_for's lookahead must cover the deepest pipeline");

void signal(const Tensor& flags, std::vector<Operand> offsets, Loc loc) {
  detail::emit(OpCode::Signal, flag_operands(flags, offsets, loc, "signal"), {}, {}, loc);
}

void wait_for(const Tensor& flags, std::vector<Operand> offsets, Operand count, Loc loc) {
  std::vector<ir::Value*> operands = flag_operands(flags, offsets, loc, "wait_for");
  operands.push_back(use(materialize(count, DType::i32), count.loc, "the count"));
  detail::emit(OpCode::Wait, operands, {}, {}, loc);
}

}  // namespace linac::dsl
