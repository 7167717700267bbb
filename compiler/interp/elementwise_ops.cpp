// Elementwise ops. Operands are scalars or tiles of the result's shape (a scalar operand is applied
// to every element). Each op computes in double and rounds once to the result dtype, which for f32
// gives the correctly rounded float result of + - * / and sqrt, and for exp/log/... a result within
// an ulp of the GPU's.
//
// Integer arithmetic goes through int64 (held doubles are exact integers): a double product of two
// i32 values could lose bits, and wrap-around must match the GPU's two's complement.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "compiler/interp/frame.h"
#include "compiler/interp/number_formats.h"

namespace linac::interp {
namespace {

using ir::OpCode;

/// out[i] = fn(a[i]); a may be a scalar broadcast over out.
template <class Fn>
void map1(const Buffer& a, Buffer& out, Fn fn) {
  const size_t n = out.size();
  const size_t sa = a.size() == n ? 1 : 0;
  for (size_t i = 0; i < n; ++i) out[i] = fn(a[i * sa]);
}

/// out[i] = fn(a[i], b[i]); either may be a scalar broadcast over out.
template <class Fn>
void map2(const Buffer& a, const Buffer& b, Buffer& out, Fn fn) {
  const size_t n = out.size();
  const size_t sa = a.size() == n ? 1 : 0, sb = b.size() == n ? 1 : 0;
  for (size_t i = 0; i < n; ++i) out[i] = fn(a[i * sa], b[i * sb]);
}

/// Two's complement arithmetic on held integers; unsigned arithmetic makes the wrap defined.
double wrap(uint64_t v) {
  return static_cast<double>(static_cast<int64_t>(v));
}
uint64_t bits_of(double x) {
  return static_cast<uint64_t>(to_i64(x));
}

[[noreturn]] void division_by_zero(const ir::Op& op, const Frame& f) {
  throw UserError(op.loc, fmt::format("integer {} by zero in {}", op.code == OpCode::Div ? "division" : "remainder",
                                      program_context(f)));
}

void integer_binary(const ir::Op& op, const Frame& f, const Buffer& a, const Buffer& b, Buffer& out) {
  switch (op.code) {
    case OpCode::Add:
      return map2(a, b, out, [](double x, double y) { return wrap(bits_of(x) + bits_of(y)); });
    case OpCode::Sub:
      return map2(a, b, out, [](double x, double y) { return wrap(bits_of(x) - bits_of(y)); });
    case OpCode::Mul:
      return map2(a, b, out, [](double x, double y) { return wrap(bits_of(x) * bits_of(y)); });
    case OpCode::Div:
      // Truncates toward zero like C; INT64_MIN / -1 wraps instead of trapping.
      return map2(a, b, out, [&](double x, double y) {
        int64_t p = to_i64(x), q = to_i64(y);
        if (q == 0) division_by_zero(op, f);
        if (q == -1) return wrap(0 - static_cast<uint64_t>(p));
        return static_cast<double>(p / q);
      });
    case OpCode::Rem:
      return map2(a, b, out, [&](double x, double y) {
        int64_t p = to_i64(x), q = to_i64(y);
        if (q == 0) division_by_zero(op, f);
        if (q == -1) return 0.0;  // INT64_MIN % -1 traps in C; the mathematical answer is 0
        return static_cast<double>(p % q);
      });
    case OpCode::Max:
      return map2(a, b, out, [](double x, double y) { return std::max(x, y); });
    case OpCode::Min:
      return map2(a, b, out, [](double x, double y) { return std::min(x, y); });
    case OpCode::Pow:
      return map2(a, b, out, [](double x, double y) { return std::pow(x, y); });
    case OpCode::And:
      return map2(a, b, out, [](double x, double y) { return wrap(bits_of(x) & bits_of(y)); });
    case OpCode::Or:
      return map2(a, b, out, [](double x, double y) { return wrap(bits_of(x) | bits_of(y)); });
    default:
      malformed(op, "not an integer binary op");
  }
}

void float_binary(const ir::Op& op, const Buffer& a, const Buffer& b, Buffer& out) {
  switch (op.code) {
    case OpCode::Add:
      return map2(a, b, out, [](double x, double y) { return x + y; });
    case OpCode::Sub:
      return map2(a, b, out, [](double x, double y) { return x - y; });
    case OpCode::Mul:
      return map2(a, b, out, [](double x, double y) { return x * y; });
    case OpCode::Div:
      return map2(a, b, out, [](double x, double y) { return x / y; });
    // fmod: the sign follows the dividend, as LLVM's frem and C's % do.
    case OpCode::Rem:
      return map2(a, b, out, [](double x, double y) { return std::fmod(x, y); });
    // fmax/fmin ignore a NaN operand, like the GPU's max.f32/min.f32.
    case OpCode::Max:
      return map2(a, b, out, [](double x, double y) { return std::fmax(x, y); });
    case OpCode::Min:
      return map2(a, b, out, [](double x, double y) { return std::fmin(x, y); });
    case OpCode::Pow:
      return map2(a, b, out, [](double x, double y) { return std::pow(x, y); });
    default:
      malformed(op, "bitwise op on a float type");
  }
}

void unary(const ir::Op& op, DType t, const Buffer& a, Buffer& out) {
  if (is_int(t)) {
    switch (op.code) {
      case OpCode::Neg:
        return map1(a, out, [](double x) { return wrap(0 - bits_of(x)); });
      case OpCode::Abs:
        return map1(a, out, [](double x) { return x < 0 ? wrap(0 - bits_of(x)) : x; });
      case OpCode::Not:
        // i1 is a boolean (1 -> 0); wider integers are bitwise, as in LLVM's xor with -1.
        if (t == DType::i1) return map1(a, out, [](double x) { return x == 0 ? 1.0 : 0.0; });
        return map1(a, out, [](double x) { return wrap(~bits_of(x)); });
      default:
        break;  // transcendental functions of integers: computed in double below
    }
  }
  switch (op.code) {
    case OpCode::Neg:
      return map1(a, out, [](double x) { return -x; });
    case OpCode::Abs:
      return map1(a, out, [](double x) { return std::fabs(x); });
    case OpCode::Exp:
      return map1(a, out, [](double x) { return std::exp(x); });
    case OpCode::Exp2:
      return map1(a, out, [](double x) { return std::exp2(x); });
    case OpCode::Log:
      return map1(a, out, [](double x) { return std::log(x); });
    case OpCode::Log2:
      return map1(a, out, [](double x) { return std::log2(x); });
    case OpCode::Sigmoid:
      return map1(a, out, [](double x) { return 1.0 / (1.0 + std::exp(-x)); });
    case OpCode::Sqrt:
      return map1(a, out, [](double x) { return std::sqrt(x); });
    case OpCode::Rsqrt:
      return map1(a, out, [](double x) { return 1.0 / std::sqrt(x); });
    case OpCode::Not:
      malformed(op, "not on a float type");
    default:
      malformed(op, "not a unary op");
  }
}

bool compare(ir::CmpPred p, double x, double y) {
  switch (p) {
    case ir::CmpPred::lt:
      return x < y;
    case ir::CmpPred::le:
      return x <= y;
    case ir::CmpPred::gt:
      return x > y;
    case ir::CmpPred::ge:
      return x >= y;
    case ir::CmpPred::eq:
      return x == y;
    case ir::CmpPred::ne:
      return x != y;  // true when either is NaN (unordered), as LLVM's une
  }
  return false;
}

}  // namespace

void eval_elementwise(const ir::Op& op, Frame& f) {
  Buffer& out = f.result(op);
  for (size_t i = 0; i < op.operands.size(); ++i) {
    size_t m = f.operand(op, i).size();
    if (m != out.size() && m != 1) malformed(op, "operand shape differs from the result shape");
  }
  const DType rt = op.result()->type.dtype;
  switch (op.code) {
    case OpCode::Cmp: {
      ir::CmpPred p = op.attrs.pred;
      map2(f.operand(op, 0), f.operand(op, 1), out, [p](double x, double y) { return compare(p, x, y) ? 1.0 : 0.0; });
      return;  // already 0/1
    }
    case OpCode::Select: {
      const Buffer &c = f.operand(op, 0), &a = f.operand(op, 1), &b = f.operand(op, 2);
      const size_t n = out.size();
      const size_t sc = c.size() == n ? 1 : 0, sa = a.size() == n ? 1 : 0, sb = b.size() == n ? 1 : 0;
      for (size_t i = 0; i < n; ++i) out[i] = c[i * sc] != 0 ? a[i * sa] : b[i * sb];
      break;  // rounded below in case the branches' dtypes are wider than the result's
    }
    case OpCode::Cast:
      if (op.attrs.dtype != rt) malformed(op, "cast result type differs from attrs.dtype");
      // round_to does the conversion: float -> int truncates, int -> float rounds, x -> i1 is x != 0.
      map1(f.operand(op, 0), out, [](double x) { return x; });
      break;
    default:
      if (ir::is_binary_arith(op.code)) {
        if (op.operands.size() != 2) malformed(op, "expected two operands");
        if (is_int(op.operands[0]->type.dtype))
          integer_binary(op, f, f.operand(op, 0), f.operand(op, 1), out);
        else
          float_binary(op, f.operand(op, 0), f.operand(op, 1), out);
      } else if (ir::is_unary_math(op.code)) {
        if (op.operands.size() != 1) malformed(op, "expected one operand");
        unary(op, op.operands[0]->type.dtype, f.operand(op, 0), out);
      } else {
        malformed(op, "not an elementwise op");
      }
  }
  round_in_place(rt, out.data(), out.size());
}

}  // namespace linac::interp
