// Helpers of the interpreter tests: kernels built by hand with ir::append_op (independent of the
// DSL), host tensor views, and `apply`, which runs one op on tiles loaded from f64 buffers.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/interp/number_formats.h"
#include "compiler/ir/ir.h"

namespace interp_test {

using namespace linac;
using interp::Arg;
using interp::Grid;
using interp::round_to;
using interp::TensorArg;
using ir::Attrs;
using ir::OpCode;
using ir::Type;
using ir::Value;

inline const SourceLoc kLoc{"user_kernel.cpp", 42, 7};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Appends ops to a kernel by hand; `block` is where the next op goes.
struct Builder {
  ir::Kernel k;
  ir::Block* block = &k.body;

  Builder() { k.name = "test_kernel"; }

  Value* op(OpCode c, std::vector<Value*> operands, Type t, Attrs a = {}) {
    return ir::append_op(k, *block, c, std::move(operands), {std::move(t)}, std::move(a), kLoc)->result();
  }
  Value* constant(DType t, double v, std::vector<int64_t> shape = {}) {
    Attrs a;
    a.fvalue = v;
    a.ivalue = static_cast<int64_t>(v);
    return op(OpCode::Constant, {}, Type::value(t, std::move(shape)), a);
  }
  Value* i32(int64_t v) { return constant(DType::i32, static_cast<double>(v)); }
  Value* axis_op(OpCode c, std::vector<Value*> operands, int64_t axis) {
    Attrs a;
    a.axis = axis;
    return op(c, std::move(operands), Type::scalar(DType::i32), a);
  }
  Value* binary(OpCode c, Value* x, Value* y) { return op(c, {x, y}, x->type.is_tile() ? x->type : y->type); }
  Value* cmp(ir::CmpPred p, Value* x, Value* y) {
    Attrs a;
    a.pred = p;
    return op(OpCode::Cmp, {x, y}, (x->type.is_tile() ? x->type : y->type).with_dtype(DType::i1), a);
  }
  Value* cast(Value* x, DType t) {
    Attrs a;
    a.dtype = t;
    return op(OpCode::Cast, {x}, x->type.with_dtype(t), a);
  }
  Value* transpose(Value* x, std::vector<int64_t> perm) {
    std::vector<int64_t> shape;
    for (int64_t p : perm) shape.push_back(x->type.shape[p]);
    Attrs a;
    a.perm = std::move(perm);
    return op(OpCode::Transpose, {x}, Type::tile(x->type.dtype, shape), a);
  }
  Value* dot(Value* a, Value* b) {
    return op(OpCode::Dot, {a, b}, Type::tile(DType::f32, {a->type.shape[0], b->type.shape[1]}));
  }
  std::vector<Value*> i32s(std::vector<int64_t> vs) {
    std::vector<Value*> out;
    for (int64_t v : vs) out.push_back(i32(v));
    return out;
  }
  Value* load(Value* tensor, std::vector<Value*> offsets, std::vector<Value*> limits, std::vector<int64_t> dims,
              std::vector<int64_t> shape) {
    std::vector<Value*> operands{tensor};
    operands.insert(operands.end(), offsets.begin(), offsets.end());
    operands.insert(operands.end(), limits.begin(), limits.end());
    Attrs a;
    a.dims = std::move(dims);
    a.shape = shape;
    return op(OpCode::Load, std::move(operands), Type::value(tensor->type.dtype, std::move(shape)), a);
  }
  void store(Value* tensor, std::vector<Value*> offsets, std::vector<Value*> limits, std::vector<int64_t> dims,
             Value* v) {
    std::vector<Value*> operands{tensor};
    operands.insert(operands.end(), offsets.begin(), offsets.end());
    operands.insert(operands.end(), limits.begin(), limits.end());
    operands.push_back(v);
    Attrs a;
    a.dims = std::move(dims);
    ir::append_op(k, *block, OpCode::Store, std::move(operands), {}, a, kLoc);
  }
  /// A region of `parent` with block arguments of `arg_types`; `fill` appends its ops and returns
  /// the values to yield.
  void region(ir::Op* parent, std::vector<Type> arg_types,
              const std::function<std::vector<Value*>(std::vector<Value*>)>& fill) {
    auto r = std::make_unique<ir::Block>();
    r->parent = parent;
    for (auto& t : arg_types) {
      Value* v = k.new_value(t);
      v->owner = r.get();
      r->args.push_back(v);
    }
    ir::Block* saved = block;
    block = r.get();
    std::vector<Value*> ys = fill(r->args);
    ir::append_op(k, *block, OpCode::Yield, ys, {}, {}, kLoc);
    block = saved;
    parent->regions.push_back(std::move(r));
  }
  /// for iv in [lo, hi) step: carried = body(iv, carried).
  std::vector<Value*> for_loop(Value* lo, Value* hi, Value* step, std::vector<Value*> inits,
                               const std::function<std::vector<Value*>(Value*, std::vector<Value*>)>& body) {
    std::vector<Value*> operands{lo, hi, step};
    std::vector<Type> types, arg_types{Type::scalar(DType::i32)};
    for (Value* v : inits) {
      operands.push_back(v);
      types.push_back(v->type);
      arg_types.push_back(v->type);
    }
    ir::Op* f = ir::append_op(k, *block, OpCode::For, operands, types, {}, kLoc);
    region(f, arg_types,
           [&](std::vector<Value*> args) { return body(args[0], std::vector<Value*>(args.begin() + 1, args.end())); });
    return f->results;
  }
};

inline std::vector<int64_t> row_major(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

inline TensorArg view(void* data, DType t, std::vector<int64_t> shape) {
  std::vector<int64_t> strides = row_major(shape);
  return TensorArg{data, t, std::move(shape), std::move(strides)};
}

struct TileData {
  std::vector<int64_t> shape;  // empty: a scalar
  std::vector<double> data;
};

/// Builds a kernel that loads each input (stored as f64) as a tile, casts it to `t`, applies `fn`,
/// casts the result to f64 and stores it; runs it on one program and returns the stored result.
inline TileData apply(std::vector<TileData> ins, DType t,
                      const std::function<Value*(Builder&, std::vector<Value*>)>& fn) {
  Builder b;
  std::vector<Value*> tiles;
  std::vector<Arg> args;
  auto bounds = [&](const std::vector<int64_t>& shape) {
    std::vector<int64_t> dims, limits = shape.empty() ? std::vector<int64_t>{1} : shape;
    for (size_t d = 0; d < shape.size(); ++d) dims.push_back(static_cast<int64_t>(d));
    return std::pair{dims, limits};
  };
  for (size_t i = 0; i < ins.size(); ++i) {
    auto [dims, limits] = bounds(ins[i].shape);
    Value* p = b.k.add_param("in" + std::to_string(i), Type::tensor(DType::f64, static_cast<int>(limits.size())));
    Value* x = b.load(p, b.i32s(std::vector<int64_t>(limits.size(), 0)), b.i32s(limits), dims, ins[i].shape);
    tiles.push_back(t == DType::f64 ? x : b.cast(x, t));
    args.push_back(view(ins[i].data.data(), DType::f64, limits));
  }
  Value* r = fn(b, tiles);
  TileData out{r->type.shape, std::vector<double>(static_cast<size_t>(r->type.numel()), -12345.0)};
  auto [dims, limits] = bounds(out.shape);
  Value* o = b.k.add_param("out", Type::tensor(DType::f64, static_cast<int>(limits.size())));
  b.store(o, b.i32s(std::vector<int64_t>(limits.size(), 0)), b.i32s(limits), dims,
          r->type.dtype == DType::f64 ? r : b.cast(r, DType::f64));
  args.push_back(view(out.data.data(), DType::f64, limits));
  interp::run(b.k, Grid{}, args);
  return out;
}

inline std::vector<double> unary(OpCode c, DType t, std::vector<double> x) {
  auto n = static_cast<int64_t>(x.size());
  return apply({{{n}, x}}, t, [c](Builder& b, std::vector<Value*> v) { return b.op(c, {v[0]}, v[0]->type); }).data;
}

inline std::vector<double> binary(OpCode c, DType t, std::vector<double> x, std::vector<double> y) {
  auto n = static_cast<int64_t>(x.size());
  return apply({{{n}, x}, {{n}, y}}, t, [c](Builder& b, std::vector<Value*> v) { return b.binary(c, v[0], v[1]); })
      .data;
}

inline double f32(double x) {
  return static_cast<float>(x);
}

/// The message of the UserError `fn` throws (fails the test if it throws nothing or another type).
inline std::string user_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  FAIL("expected a UserError");
  return {};
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace interp_test
