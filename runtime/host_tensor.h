// A dense, row-major tensor in host memory: what ops take and return, what .npy files hold.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "linac/dtype.h"

namespace linac {

struct HostTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // numel * dtype_bytes(dtype) bytes, C order

  static HostTensor zeros(DType t, std::vector<int64_t> shape);
  int64_t numel() const;
  int rank() const { return static_cast<int>(shape.size()); }
  /// Contiguous strides in elements.
  std::vector<int64_t> strides() const;
  /// Element i converted to double (bf16/f16 decoded exactly).
  double get(int64_t i) const;
  /// Stores x at element i, rounded to the dtype (round to nearest even for bf16/f16).
  void set(int64_t i, double x);
  /// A copy with every element converted to `t` (rounded as set() does).
  HostTensor cast(DType t) const;
  /// Fills with a bit pattern (used to poison outputs so unwritten elements are noticed).
  void fill_bytes(uint8_t b) { std::memset(data.data(), b, data.size()); }
  std::string shape_str() const;
};

/// bf16/f16 <-> float conversions, round to nearest even, NaN preserved as a quiet NaN.
uint16_t float_to_bf16_bits(float f);
float bf16_bits_to_float(uint16_t b);
uint16_t float_to_f16_bits(float f);
float f16_bits_to_float(uint16_t h);

}  // namespace linac
