// Ops without tile operands: values that come from attributes, the launch grid or tensor shapes.
#include <algorithm>

#include "compiler/interp/frame.h"
#include "compiler/interp/number_formats.h"

namespace linac::interp {
namespace {

int64_t grid_axis(const ir::Op& op) {
  if (op.attrs.axis < 0 || op.attrs.axis > 2) malformed(op, "grid axis must be 0, 1 or 2");
  return op.attrs.axis;
}

}  // namespace

void eval_leaf(const ir::Op& op, Frame& f) {
  Buffer& out = f.result(op);
  const DType t = op.result()->type.dtype;
  switch (op.code) {
    case ir::OpCode::Constant: {
      double v = is_float(t) ? op.attrs.fvalue : static_cast<double>(op.attrs.ivalue);
      std::fill(out.begin(), out.end(), round_to(t, v));
      return;
    }
    case ir::OpCode::ProgramId:
      out[0] = round_to(t, static_cast<double>(f.program_id[grid_axis(op)]));
      return;
    case ir::OpCode::NumPrograms:
      out[0] = round_to(t, static_cast<double>(f.num_programs[grid_axis(op)]));
      return;
    case ir::OpCode::Dim: {
      const TensorArg& tensor = f.tensor_operand(op, 0);
      if (op.attrs.axis < 0 || op.attrs.axis >= static_cast<int64_t>(tensor.shape.size()))
        malformed(op, "dim axis out of range");
      out[0] = round_to(t, static_cast<double>(tensor.shape[op.attrs.axis]));
      return;
    }
    case ir::OpCode::Iota:
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(i);
      round_in_place(t, out.data(), out.size());
      return;
    default:
      malformed(op, "not a leaf op");
  }
}

}  // namespace linac::interp
