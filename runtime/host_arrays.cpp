// linac/runtime.h's helpers for checking a kernel against a reference on the host: inputs rounded to the
// kernel's dtype, reproducible random inputs, poisoned outputs, the max relative error.
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits>

#include "linac/runtime.h"

namespace linac::runtime {

namespace {

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw UserError(fmt::format("HostArray: negative dimension in shape [{}]", fmt::join(shape, ", ")));
    n *= d;
  }
  return n;
}

/// SplitMix64 (Steele, Lea, Flood 2014): a fixed function of its 64-bit state, so the stream is the
/// same everywhere.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

void round_to(std::vector<float>& x, DType dtype) {
  if (!is_float(dtype)) throw UserError(fmt::format("round_to: {} is not a float dtype", dtype_name(dtype)));
  if (dtype == DType::f32 || dtype == DType::f64 || x.empty()) return;  // floats are exact in both
  std::vector<uint16_t> narrow(x.size());
  const std::vector<int64_t> shape = {static_cast<int64_t>(x.size())};
  const TensorView wide = TensorView::of(x.data(), shape), half{narrow.data(), dtype, shape};
  convert(wide, half);
  convert(half, wide);
}

std::vector<float> random_uniform(size_t n, uint64_t seed, float lo, float hi) {
  if (!(lo < hi)) throw UserError(fmt::format("random_uniform: needs lo < hi, got [{}, {})", lo, hi));
  std::vector<float> x(n);
  uint64_t state = seed;
  for (float& e : x) {
    const double u = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1), 53 bits
    const float v = static_cast<float>(double(lo) + (double(hi) - double(lo)) * u);
    e = v < hi ? v : std::nextafter(hi, lo);  // rounding to float may reach hi
  }
  return x;
}

HostArray::HostArray(std::vector<float>& x, DType dtype, std::vector<int64_t> shape) {
  const int64_t n = element_count(shape);
  if (n != static_cast<int64_t>(x.size()))
    throw UserError(fmt::format("HostArray: shape [{}] has {} elements, the floats {}", fmt::join(shape, ", "), n,
                                x.size()));
  round_to(x, dtype);
  bytes_.resize(static_cast<size_t>(n * dtype_bytes(dtype)));
  view_ = {bytes_.data(), dtype, std::move(shape)};
  convert(TensorView::of(x.data(), view_.shape), view_);
}

HostArray::HostArray(DType dtype, std::vector<int64_t> shape) {
  if (!is_float(dtype)) throw UserError(fmt::format("HostArray: {} is not a float dtype", dtype_name(dtype)));
  bytes_.resize(static_cast<size_t>(element_count(shape) * dtype_bytes(dtype)));
  view_ = {bytes_.data(), dtype, std::move(shape)};
  poison();
}

void HostArray::poison() { std::fill(bytes_.begin(), bytes_.end(), uint8_t{0xFF}); }

std::vector<float> HostArray::to_floats() const {
  std::vector<float> x(static_cast<size_t>(view_.numel()));
  convert(view_, TensorView::of(x.data(), view_.shape));
  return x;
}

double max_relative_error(const std::vector<float>& x, const std::vector<double>& ref) {
  if (x.size() != ref.size())
    throw UserError(fmt::format("max_relative_error: {} values against a reference of {}", x.size(), ref.size()));
  double err = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(double(x[i]) - ref[i]);
    err = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(err, d);
    scale = std::max(scale, std::abs(ref[i]));
  }
  return err / std::max(scale, 1e-30);
}

}  // namespace linac::runtime
