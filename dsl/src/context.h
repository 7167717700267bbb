// Internal to the DSL: the recording context behind KernelBuilder, shared by builder.cpp (kernel,
// control flow) and ops.cpp (every other op).
#pragma once
#include <vector>

#include "compiler/ir/ir.h"
#include "linac/dsl.h"

namespace linac::dsl {

struct KernelBuilder::Impl {
  std::shared_ptr<ir::Kernel> kernel;
  std::vector<ir::Block*> blocks;  // innermost block last: where new ops go
  bool finished = false;
  uint64_t id = 0;  // serial number, unique in the process: what Tiles and Tensors name their builder by
};

namespace detail {

/// The builder recording on this thread; UserError at `loc` when there is none.
KernelBuilder::Impl& current(const Loc& loc);
/// Appends an op to the innermost block and checks it with the verifier's rules.
ir::Op* emit(ir::OpCode code, std::vector<ir::Value*> operands, std::vector<ir::Type> result_types,
             ir::Attrs attrs, const Loc& loc);
inline ir::Value* emit1(ir::OpCode code, std::vector<ir::Value*> operands, ir::Type result_type,
                        ir::Attrs attrs, const Loc& loc) {
  return emit(code, std::move(operands), {std::move(result_type)}, std::move(attrs), loc)->result();
}
/// A scalar constant of dtype `t`.
Tile make_constant(double value, DType t, const Loc& loc);
/// An operand as a scalar of dtype `t` when it is a number, else its tile unchanged.
Tile materialize(const Operand& o, DType t);
/// A tile's value as an operand of the op being recorded. UserError at `loc` if the Tile is empty
/// (default-constructed), its builder is gone, or it belongs to another builder than the current one.
ir::Value* use(const Tile& t, const Loc& loc, const char* what);
/// A tensor's value, checked as use() checks a Tile.
ir::Value* use(const Tensor& t, const Loc& loc, const char* what);
/// A tile's value for reading its type: its builder must be alive (it may be finished or not the
/// innermost one). UserError at `loc` otherwise.
ir::Value* inspect(const Tile& t, const Loc& loc);
ir::Value* inspect(const Tensor& t, const Loc& loc);

}  // namespace detail
}  // namespace linac::dsl
