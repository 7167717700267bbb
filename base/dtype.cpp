#include "linac/dtype.h"

#include "linac/error.h"

namespace linac {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::i1: return "i1";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
  }
  throw InternalError("bad dtype");
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "i1" || s == "bool") return DType::i1;
  if (s == "i32" || s == "int32") return DType::i32;
  if (s == "i64" || s == "int64") return DType::i64;
  if (s == "f16" || s == "fp16" || s == "float16") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "f32" || s == "fp32" || s == "float32") return DType::f32;
  if (s == "f64" || s == "fp64" || s == "float64") return DType::f64;
  return std::nullopt;
}

int dtype_bytes(DType t) {
  switch (t) {
    case DType::i1: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f32: return 4;
    case DType::f64: return 8;
  }
  throw InternalError("bad dtype");
}

}  // namespace linac
