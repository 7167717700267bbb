#include "compiler/interp/number_formats.h"

#include <bit>
#include <cmath>
#include <limits>

#include "compiler/interp/interp.h"
#include "linac/error.h"

namespace linac::interp {
namespace {

/// A binary floating-point format narrower than double: `mant` explicit fraction bits, normal
/// exponents in [emin, emax], exponent bias `bias` (the field is `exp_bits` wide).
struct FloatFormat {
  int mant;
  int exp_bits;
  int bias;
  int emin() const { return 1 - bias; }
  int emax() const { return bias; }
};

constexpr FloatFormat kF16{10, 5, 15};
constexpr FloatFormat kBF16{7, 8, 127};

/// Exponent of the leading bit of a finite non-zero a > 0 (a in [2^e, 2^(e+1))).
int leading_exponent(double a) {
  int e = 0;
  std::frexp(a, &e);
  return e - 1;
}

/// Rounds x to the nearest value of `f`, ties to even. Every step scales by a power of two or works
/// on an integer-valued double below 2^54, so all of it is exact: the only rounding is the explicit
/// one, which is why subnormals and the overflow to inf come out bit-exact.
double round_to_format(double x, const FloatFormat& f) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  double a = std::fabs(x);
  // The spacing of representable values around a: 2^(e - mant) for normals, fixed below emin.
  int quantum_exp = std::max(leading_exponent(a), f.emin()) - f.mant;
  double scaled = std::ldexp(a, -quantum_exp);  // < 2^(mant+1)
  double whole = std::floor(scaled);
  double frac = scaled - whole;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(whole, 2.0) != 0)) whole += 1;
  double r = std::ldexp(whole, quantum_exp);
  // Rounding up can only reach the next binade; past emax that binade does not exist.
  if (r >= std::ldexp(1.0, f.emax() + 1)) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

uint16_t encode(double x, const FloatFormat& f) {
  const uint32_t sign = std::signbit(x) ? 0x8000u : 0u;
  const uint32_t exp_all_ones = ((1u << f.exp_bits) - 1u) << f.mant;
  if (std::isnan(x)) return static_cast<uint16_t>(sign | exp_all_ones | (1u << (f.mant - 1)));
  double a = std::fabs(round_to_format(x, f));
  if (std::isinf(a)) return static_cast<uint16_t>(sign | exp_all_ones);
  if (a == 0) return static_cast<uint16_t>(sign);
  int e = leading_exponent(a);
  if (e < f.emin()) {  // subnormal: the fraction field counts quanta of 2^(emin - mant)
    auto frac = static_cast<uint32_t>(std::ldexp(a, f.mant - f.emin()));
    return static_cast<uint16_t>(sign | frac);
  }
  auto biased = static_cast<uint32_t>(e + f.bias);
  auto frac = static_cast<uint32_t>(std::ldexp(a, f.mant - e)) - (1u << f.mant);
  return static_cast<uint16_t>(sign | (biased << f.mant) | frac);
}

double decode(uint16_t bits, const FloatFormat& f) {
  const bool negative = (bits & 0x8000u) != 0;
  const uint32_t exp_field = (bits >> f.mant) & ((1u << f.exp_bits) - 1u);
  const uint32_t frac = bits & ((1u << f.mant) - 1u);
  double v;
  if (exp_field == (1u << f.exp_bits) - 1u)
    v = frac != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp_field == 0)
    v = std::ldexp(static_cast<double>(frac), f.emin() - f.mant);
  else
    v = std::ldexp(static_cast<double>((1u << f.mant) | frac), static_cast<int>(exp_field) - f.bias - f.mant);
  return negative ? -v : v;
}

}  // namespace

int64_t to_i64(double x) {
  if (std::isnan(x)) return 0;
  if (x >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (x < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(x);
}

uint16_t f16_bits(double x) {
  return encode(x, kF16);
}
double from_f16_bits(uint16_t bits) {
  return decode(bits, kF16);
}
uint16_t bf16_bits(double x) {
  // Fast path (every bf16 cast of an op's inputs goes through here: 3 x 100M values at fla's large
  // shapes took seconds in the generic code): where the result is a normal bf16 or overflows, the
  // round to nearest even is an integer add on the double's bits at bf16's last fraction bit (bit
  // 45), with the carry running into the exponent. Subnormals, zeros, NaN and inf take the generic path.
  const uint64_t u = std::bit_cast<uint64_t>(x);
  const uint64_t biased = (u >> 52) & 0x7FF;
  if (biased < 1023 - 126 || biased > 1023 + 127) return encode(x, kBF16);
  const uint64_t r = u + ((uint64_t{1} << 44) - 1) + ((u >> 45) & 1);
  const uint16_t sign = static_cast<uint16_t>((u >> 63) << 15);
  const int64_t e = static_cast<int64_t>((r >> 52) & 0x7FF) - 1023;
  if (e > 127) return sign | 0x7F80;  // rounded past the largest bf16: inf
  return sign | static_cast<uint16_t>((e + 127) << 7) | static_cast<uint16_t>((r >> 45) & 0x7F);
}
uint16_t bf16_bits_generic(double x) {
  return encode(x, kBF16);
}
double from_bf16_bits(uint16_t bits) {
  // A bf16 is the upper half of an f32 with the same value (NaNs stay NaNs).
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

double round_to(DType t, double x) {
  switch (t) {
    case DType::i1:
      return x != 0 ? 1.0 : 0.0;
    case DType::i32:
      // int64 -> int32 wraps modulo 2^32, as C++20 defines for conversions to signed types.
      return static_cast<double>(static_cast<int32_t>(to_i64(x)));
    case DType::i64:
      return static_cast<double>(to_i64(x));
    case DType::f16:
      return round_to_format(x, kF16);
    case DType::bf16:
      return round_to_format(x, kBF16);
    case DType::f32:
      return static_cast<double>(static_cast<float>(x));
    case DType::f64:
      return x;
  }
  throw InternalError("bad dtype in round_to");
}

void round_in_place(DType t, double* data, size_t n) {
  switch (t) {
    case DType::f64:
      return;
    case DType::f32:
      for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(data[i]);
      return;
    case DType::f16:
      for (size_t i = 0; i < n; ++i) data[i] = round_to_format(data[i], kF16);
      return;
    case DType::bf16:
      for (size_t i = 0; i < n; ++i) data[i] = from_bf16_bits(bf16_bits(data[i]));
      return;
    case DType::i1:
    case DType::i32:
    case DType::i64:
      for (size_t i = 0; i < n; ++i) data[i] = round_to(t, data[i]);
      return;
  }
  throw InternalError("bad dtype in round_in_place");
}

}  // namespace linac::interp
