// Internal to the interpreter: the state of one program while it runs, and the evaluators of each
// family of ops (one .cpp file per family). interp.cpp owns the control flow and dispatches here.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/ir/ir.h"

namespace linac::interp {

/// The elements of one SSA value, row-major, already rounded to the value's dtype. A scalar holds
/// one element.
using Buffer = std::vector<double>;

/// One program's state. Values are addressed by Value::id, so looking one up is an index, and each
/// buffer keeps its capacity from one loop iteration (and one program) to the next.
struct Frame {
  const ir::Kernel* kernel = nullptr;
  std::vector<Buffer> slots;              // by Value::id
  std::vector<const TensorArg*> tensors;  // by Value::id; set for tensor parameters only
  std::array<int64_t, 3> program_id{};
  std::array<int64_t, 3> num_programs{};

  const Buffer& operand(const ir::Op& op, size_t i) const { return slots[op.operands[i]->id]; }
  double scalar_operand(const ir::Op& op, size_t i) const { return slots[op.operands[i]->id][0]; }
  const TensorArg& tensor_operand(const ir::Op& op, size_t i) const;
  /// The buffer of result `i`, resized to the result type's element count.
  Buffer& result(const ir::Op& op, size_t i = 0);
};

/// "kernel 'name', program (x, y, z)": appended to runtime error messages so that a failure in one
/// program of a large grid can be reproduced.
std::string program_context(const Frame& f);

/// Throws InternalError for IR the verifier would have rejected, naming the op and its location.
[[noreturn]] void malformed(const ir::Op& op, std::string_view what);

// Evaluators. Each handles the opcodes its comment names and throws InternalError for IR that the
// verifier would have rejected (operand shapes that do not fit, bad attributes).

/// Constant, ProgramId, NumPrograms, Dim, Iota.
void eval_leaf(const ir::Op& op, Frame& f);
/// The elementwise opcodes (ir::is_elementwise).
void eval_elementwise(const ir::Op& op, Frame& f);
/// Splat, Broadcast, ExpandDims, Reshape, Transpose, Take, Slice, Concat, Place.
void eval_shape(const ir::Op& op, Frame& f);
/// Reduce, Scan, Dot.
void eval_reduction(const ir::Op& op, Frame& f);
/// Load, Store.
void eval_memory(const ir::Op& op, Frame& f);
/// Signal, Wait.
void eval_flag(const ir::Op& op, Frame& f);

}  // namespace linac::interp
