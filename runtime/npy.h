// Reading and writing numpy .npy files: the CLI's tensor format. Only the dtypes the kernels use are
// supported (f16, f32, f64, i32, i64, bool), little-endian, C order. Every problem with a file is a
// UserError whose one-line message starts with the file's path.
#pragma once
#include <cstdio>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "linac/dtype.h"

namespace linac {

/// A dense host array. `data` holds numel() elements of `dtype` in C order, host (little-endian)
/// byte order. bf16 is allowed in memory (convert() produces it) but cannot be written to .npy.
struct NpyArray {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // empty for a 0-d array
  std::vector<uint8_t> data;

  /// Number of elements: the product of shape (1 for a 0-d array, 0 if any dimension is 0).
  int64_t numel() const;
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
};

/// Reads a .npy file (format versions 1.0, 2.0 and 3.0). Throws UserError("<path>: <reason>") for a
/// missing or unreadable file, a directory, bad magic, a malformed header, an unsupported dtype
/// (big-endian, object, structured, ...), fortran_order=True, and truncated or trailing data.
NpyArray read_npy(const std::string& path);

/// Writes `a` as a version 1.0 .npy file (2.0 if the header is too long for 1.0), through
/// runtime/output_files.h: a temporary renamed into place, so a failure never leaves a partial file at
/// `path`; symlinks are written through and special files written directly, never replaced.
/// Throws UserError on I/O failure or for a bf16 array (numpy has no bf16); InternalError when
/// `a.data` does not match its shape and dtype.
void write_npy(const std::string& path, const NpyArray& a);
/// The .npy bytes of `a` into an open file (for runtime/output_files.h's transactions); `path` names it
/// in errors.
void write_npy_to(std::FILE* f, const NpyArray& a, const std::string& path);

/// A zero-filled array of the given dtype and shape.
NpyArray make_npy(DType dtype, std::vector<int64_t> shape);
/// Copies numel(shape) values from `data` into a new f32 / f64 / i32 / i64 array.
NpyArray from_f32(std::vector<int64_t> shape, const float* data);
NpyArray from_f64(std::vector<int64_t> shape, const double* data);
NpyArray from_i32(std::vector<int64_t> shape, const int32_t* data);
NpyArray from_i64(std::vector<int64_t> shape, const int64_t* data);

/// All elements as double (exact for every supported dtype except i64 beyond 2^53).
std::vector<double> to_f64(const NpyArray& a);
/// All elements as float (f64 values are rounded to nearest).
std::vector<float> to_f32(const NpyArray& a);
/// All elements of an integer or bool array as int64. Throws UserError for a float array.
std::vector<int64_t> to_i64(const NpyArray& a);

/// The array with its elements converted to `to`: floats round to nearest even (f16/bf16 overflow
/// to inf), integers widen or narrow as C casts do. Converting a float array to an integer dtype
/// throws UserError unless every value is integral and in range.
NpyArray convert(const NpyArray& a, DType to);

/// IEEE half / bfloat16 bit patterns to and from double; the to-bits direction rounds to nearest
/// even, overflows to inf and keeps NaN a (quiet) NaN.
double f16_bits_to_f64(uint16_t h);
uint16_t f64_to_f16_bits(double x);
double bf16_bits_to_f64(uint16_t h);
uint16_t f64_to_bf16_bits(double x);

/// "[2, 3, 4]" ("[]" for a 0-d shape): how shapes appear in messages.
std::string shape_str(std::span<const int64_t> shape);

}  // namespace linac
