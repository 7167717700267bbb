#include "runtime/host_tensor.h"

#include <bit>
#include <cmath>
#include <fmt/format.h>

#include "linac/error.h"

namespace linac {

uint16_t float_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t rounding = 0x7fff + ((u >> 16) & 1);  // ties to even
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t float_to_f16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  uint32_t abs = u & 0x7fffffff;
  if (abs >= 0x7f800000) return sign | (abs > 0x7f800000 ? 0x7e00 : 0x7c00);
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000) {
    // Subnormal half (or zero): value = m * 2^-24. Round the float to a multiple of 2^-24, ties to even.
    float a = std::bit_cast<float>(abs);
    float scaled = a * 16777216.0f;  // exact: a power-of-two scaling
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t v = abs - (112u << 23);
  uint32_t rounding = 0xfff + ((v >> 13) & 1);
  return sign | static_cast<uint16_t>((v + rounding) >> 13);
}

float f16_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000 | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

HostTensor HostTensor::zeros(DType t, std::vector<int64_t> shape) {
  HostTensor h;
  h.dtype = t;
  h.shape = std::move(shape);
  h.data.assign(static_cast<size_t>(h.numel() * dtype_bytes(t)), 0);
  return h;
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> HostTensor::strides() const {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

double HostTensor::get(int64_t i) const {
  const uint8_t* p = data.data() + i * dtype_bytes(dtype);
  switch (dtype) {
    case DType::i1: return *p ? 1 : 0;
    case DType::i32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::i64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::f16: { uint16_t v; std::memcpy(&v, p, 2); return f16_bits_to_float(v); }
    case DType::bf16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_bits_to_float(v); }
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::f64: { double v; std::memcpy(&v, p, 8); return v; }
  }
  throw InternalError("bad dtype");
}

void HostTensor::set(int64_t i, double x) {
  uint8_t* p = data.data() + i * dtype_bytes(dtype);
  switch (dtype) {
    case DType::i1: *p = x != 0; return;
    case DType::i32: { int32_t v = static_cast<int32_t>(x); std::memcpy(p, &v, 4); return; }
    case DType::i64: { int64_t v = static_cast<int64_t>(x); std::memcpy(p, &v, 8); return; }
    case DType::f16: { uint16_t v = float_to_f16_bits(static_cast<float>(x)); std::memcpy(p, &v, 2); return; }
    case DType::bf16: { uint16_t v = float_to_bf16_bits(static_cast<float>(x)); std::memcpy(p, &v, 2); return; }
    case DType::f32: { float v = static_cast<float>(x); std::memcpy(p, &v, 4); return; }
    case DType::f64: std::memcpy(p, &x, 8); return;
  }
  throw InternalError("bad dtype");
}

HostTensor HostTensor::cast(DType t) const {
  if (t == dtype) return *this;
  HostTensor out = zeros(t, shape);
  for (int64_t i = 0, n = numel(); i < n; ++i) out.set(i, get(i));
  return out;
}

std::string HostTensor::shape_str() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace linac
