// The CPU interpreter: runs a tile IR kernel over its whole grid on host buffers, one program at a
// time, with reference semantics. It is the oracle the GPU backend is tested against and the device
// used when there is no GPU.
//
// Numerics: every value is held as a double but rounded after each op to its IR dtype (f32 ops round
// to float, bf16/f16 values round to nearest even in those formats), so the interpreter sees the same
// precision losses the GPU does. dot accumulates in f64 and rounds once to f32.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "compiler/ir/ir.h"

namespace linac::interp {

/// A host tensor view passed to a tensor parameter. Strides are in elements.
struct TensorArg {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

/// One argument per kernel parameter, in parameter order: a tensor view or a scalar value.
using Arg = std::variant<TensorArg, double>;

struct Grid {
  int64_t x = 1, y = 1, z = 1;
};

/// Runs `k` over `grid`. Throws UserError when arguments do not match the parameters (count, kind,
/// dtype, rank) and InternalError on malformed IR (run the verifier first).
void run(const ir::Kernel& k, Grid grid, std::span<const Arg> args);

/// How run() uses the host. None of it changes results: programs write disjoint outputs.
struct RunOptions {
  /// Host threads that run programs; 0 means one per hardware thread. Never more than programs.
  int num_threads = 0;
};

/// run() with explicit options (tests use it to compare one thread against several).
void run(const ir::Kernel& k, Grid grid, std::span<const Arg> args, const RunOptions& options);

/// Rounds a double to the nearest value representable in `t` (round to nearest even for floats,
/// truncation toward zero with wrap-around for integers as in C casts).
double round_to(DType t, double x);

}  // namespace linac::interp
