// A dense, row-major tensor in host memory: what op plans describe (kernels/op.h), what .npy files hold.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "linac/dtype.h"

namespace linac {

// A tensor made by zeros() holds no memory until something writes to it (materialize()): an op plan
// describes its outputs and scratch as zeros, and a plan run on caller-owned memory (runtime/op_call.h)
// never needs host copies of them.
struct HostTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // numel * dtype_bytes(dtype) bytes, C order; empty: all zeros (see above)
  /// In a plan made from shape-only inputs (runtime/op_call.h): the name of the op input this tensor
  /// holds, whatever the plan calls it (casts keep it); empty for every other tensor.
  std::string input;

  static HostTensor zeros(DType t, std::vector<int64_t> shape);
  /// Every element `value` (rounded to the dtype), materialized.
  static HostTensor filled(DType t, std::vector<int64_t> shape, double value);
  int64_t numel() const;
  int64_t nbytes() const { return numel() * dtype_bytes(dtype); }
  /// Whether the elements are held in `data` (false: all zeros, nothing allocated yet).
  bool materialized() const { return static_cast<int64_t>(data.size()) == nbytes(); }
  /// Allocates the zeros of an unmaterialized tensor; returns the bytes.
  uint8_t* materialize();
  int rank() const { return static_cast<int>(shape.size()); }
  /// Contiguous strides in elements.
  std::vector<int64_t> strides() const;
  /// Element i converted to double (bf16/f16 decoded exactly); 0 when not materialized.
  double get(int64_t i) const;
  /// Stores x at element i, rounded to the dtype (round to nearest even for bf16/f16).
  void set(int64_t i, double x);
  /// A copy with every element converted to `t` (rounded as set() does); unmaterialized stays so.
  HostTensor cast(DType t) const;
  /// Fills with a bit pattern (used to poison outputs so unwritten elements are noticed).
  void fill_bytes(uint8_t b) { std::memset(materialize(), b, data.size()); }
  std::string shape_str() const;
};

/// The strides (in elements) of a contiguous, row-major tensor of `shape`.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

/// bf16/f16 <-> float conversions, round to nearest even, NaN preserved as a quiet NaN.
uint16_t float_to_bf16_bits(float f);
float bf16_bits_to_float(uint16_t b);
uint16_t float_to_f16_bits(float f);
float f16_bits_to_float(uint16_t h);

}  // namespace linac
