// Element types of tiles, scalars and tensors.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace linac {

enum class DType : uint8_t { i1, i32, i64, f16, bf16, f32, f64 };

/// Name used in IR text and on the CLI ("bf16", "f32", ...).
std::string_view dtype_name(DType t);
/// Parses a dtype name; accepts the IR names and the CLI spellings fp16/fp32/bfloat16/float32.
std::optional<DType> parse_dtype(std::string_view s);
/// Size of one element in bytes (i1 is stored as one byte).
int dtype_bytes(DType t);
inline bool is_float(DType t) { return t == DType::f16 || t == DType::bf16 || t == DType::f32 || t == DType::f64; }
inline bool is_int(DType t) { return !is_float(t); }

}  // namespace linac
