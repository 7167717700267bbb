#include "kernels/common/host_tensor.h"

#include "compiler/interp/number_formats.h"

#include <bit>
#include <cmath>
#include <fmt/format.h>

#include "linac/error.h"

namespace linac {

// Thin wrappers over the interpreter's exact conversions: one implementation of the 16-bit formats.
uint16_t float_to_bf16_bits(float f) { return interp::bf16_bits(f); }
float bf16_bits_to_float(uint16_t b) { return static_cast<float>(interp::from_bf16_bits(b)); }
uint16_t float_to_f16_bits(float f) { return interp::f16_bits(f); }
float f16_bits_to_float(uint16_t h) { return static_cast<float>(interp::from_f16_bits(h)); }

HostTensor HostTensor::zeros(DType t, std::vector<int64_t> shape) {
  HostTensor h;
  h.dtype = t;
  h.shape = std::move(shape);
  return h;
}

HostTensor HostTensor::filled(DType t, std::vector<int64_t> shape, double value) {
  HostTensor h = zeros(t, std::move(shape));
  for (int64_t i = 0; i < h.numel(); ++i) h.set(i, value);
  return h;
}

uint8_t* HostTensor::materialize() {
  if (!materialized()) data.assign(static_cast<size_t>(nbytes()), 0);
  return data.data();
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

std::vector<int64_t> HostTensor::strides() const { return contiguous_strides(shape); }

double HostTensor::get(int64_t i) const {
  if (!materialized()) return 0;
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
  uint8_t* p = materialize() + i * dtype_bytes(dtype);
  switch (dtype) {
    case DType::i1: *p = x != 0; return;
    case DType::i32: { int32_t v = static_cast<int32_t>(x); std::memcpy(p, &v, 4); return; }
    case DType::i64: { int64_t v = static_cast<int64_t>(x); std::memcpy(p, &v, 8); return; }
    case DType::f16: { uint16_t v = interp::f16_bits(x); std::memcpy(p, &v, 2); return; }  // one rounding from double
    case DType::bf16: { uint16_t v = interp::bf16_bits(x); std::memcpy(p, &v, 2); return; }
    case DType::f32: { float v = static_cast<float>(x); std::memcpy(p, &v, 4); return; }
    case DType::f64: std::memcpy(p, &x, 8); return;
  }
  throw InternalError("bad dtype");
}

HostTensor HostTensor::cast(DType t) const {
  if (t == dtype) return *this;
  HostTensor out = zeros(t, shape);
  out.input = input;
  if (!materialized()) return out;
  out.materialize();
  // The conversions every op call does on its inputs and outputs, without the per-element switch.
  if (dtype == DType::f32 && (t == DType::bf16 || t == DType::f16)) {
    const float* in = reinterpret_cast<const float*>(data.data());
    uint16_t* o = reinterpret_cast<uint16_t*>(out.data.data());
    for (int64_t i = 0, n = numel(); i < n; ++i) o[i] = t == DType::bf16 ? float_to_bf16_bits(in[i]) : float_to_f16_bits(in[i]);
    return out;
  }
  if ((dtype == DType::bf16 || dtype == DType::f16) && t == DType::f32) {
    const uint16_t* in = reinterpret_cast<const uint16_t*>(data.data());
    float* o = reinterpret_cast<float*>(out.data.data());
    for (int64_t i = 0, n = numel(); i < n; ++i) o[i] = dtype == DType::bf16 ? bf16_bits_to_float(in[i]) : f16_bits_to_float(in[i]);
    return out;
  }
  for (int64_t i = 0, n = numel(); i < n; ++i) out.set(i, get(i));
  return out;
}

std::string HostTensor::shape_str() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace linac
