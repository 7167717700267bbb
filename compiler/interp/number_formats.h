// Number formats of the interpreter: rounding of doubles to each IR dtype, and the bit patterns of the
// 16-bit float formats (f16, bf16) as they are stored in tensors.
//
// The conversions are written with integer and power-of-two arithmetic only, so they are bit-exact
// and independent of the host's floating-point environment and of compiler support for 16-bit types.
#pragma once
#include <cstddef>
#include <cstdint>

#include "linac/dtype.h"

namespace linac::interp {

/// The f16 (IEEE binary16) bit pattern nearest to x (round to nearest even; overflow gives inf,
/// NaN gives a quiet NaN of the same sign).
uint16_t f16_bits(double x);
/// The value of an f16 bit pattern.
double from_f16_bits(uint16_t bits);
/// The bfloat16 bit pattern nearest to x (same rules as f16_bits).
uint16_t bf16_bits(double x);
/// The same, always by the generic rounding (bf16_bits takes an integer fast path for normal results;
/// tests check the two agree).
uint16_t bf16_bits_generic(double x);
/// The value of a bfloat16 bit pattern.
double from_bf16_bits(uint16_t bits);

/// Truncates x toward zero into int64, saturating out of range and mapping NaN to 0 (a total
/// function, unlike the C++ conversion, which is undefined out of range). Integer values held as
/// doubles are read back through it.
int64_t to_i64(double x);

/// Rounds n doubles in place to dtype `t` (round_to applied to each, with the dtype switch hoisted
/// out of the loop).
void round_in_place(DType t, double* data, size_t n);

}  // namespace linac::interp
