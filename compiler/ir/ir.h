// The tile IR: SSA values with static tile shapes, structured control flow (for, if), one kernel per
// module. Built by the DSL (dsl/), printed and parsed as text (printer.h, parser.h), checked by the
// verifier (verifier.h), executed by the interpreter (compiler/interp) and lowered by compiler/nvptx.
//
// Memory model: a kernel is run over a grid of programs; each program sees its program_id. Tensor
// arguments are n-d views (runtime shape and strides, in elements) of global memory. load/store move a
// block of a tensor at runtime offsets; elements outside [0, min(limit, dim)) are masked (loads give 0).
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "linac/dtype.h"
#include "linac/error.h"

namespace linac::ir {

/// The type of an SSA value: a scalar, a tile (static shape, rank >= 1) or a tensor argument
/// (rank only; shape and strides are runtime values).
struct Type {
  enum class Kind : uint8_t { Scalar, Tile, Tensor };
  Kind kind = Kind::Scalar;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // Tile: the static shape. Tensor: rank entries of -1. Scalar: empty.

  static Type scalar(DType t) { return {Kind::Scalar, t, {}}; }
  static Type tile(DType t, std::vector<int64_t> shape) { return {Kind::Tile, t, std::move(shape)}; }
  static Type tensor(DType t, int rank) { return {Kind::Tensor, t, std::vector<int64_t>(rank, -1)}; }
  /// A tile of the given shape, or a scalar when the shape is empty.
  static Type value(DType t, std::vector<int64_t> shape) {
    return shape.empty() ? scalar(t) : tile(t, std::move(shape));
  }

  bool is_scalar() const { return kind == Kind::Scalar; }
  bool is_tile() const { return kind == Kind::Tile; }
  bool is_tensor() const { return kind == Kind::Tensor; }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const;
  Type with_dtype(DType t) const { return {kind, t, shape}; }
  bool operator==(const Type&) const = default;
  /// IR spelling: "f32", "tile<64x128xbf16>", "tensor<?x?x?x?xbf16>".
  std::string str() const;
};

enum class OpCode : uint8_t {
  // Leaves.
  Constant,    // attrs.fvalue/ivalue; result scalar or tile (splat of the value)
  ProgramId,   // attrs.axis in {0,1,2}; -> i32
  NumPrograms, // attrs.axis; -> i32
  Dim,         // (tensor) attrs.axis; -> i32, the runtime size of that dimension
  Iota,        // -> tile<N x i32> holding 0..N-1
  // Elementwise (scalars or tiles of one shape; operands of one dtype).
  Add, Sub, Mul, Div, Rem, Max, Min, Pow,
  Neg, Exp, Exp2, Log, Log2, Sigmoid, Sqrt, Rsqrt, Abs,
  Cmp,     // attrs.pred; -> i1
  And, Or, Not,
  Select,  // (cond i1, a, b)
  Cast,    // attrs.dtype is the destination type
  // Shape.
  Splat,       // scalar -> tile of attrs.shape
  Broadcast,   // tile -> tile of attrs.shape (size-1 dims expand; same rank)
  ExpandDims,  // inserts a size-1 dim at attrs.axis
  Reshape,     // same numel, attrs.shape, row-major
  Transpose,   // attrs.perm
  // Reductions and scans along attrs.axis.
  Reduce,  // attrs.reduce; drops the axis (a rank-1 tile reduces to a scalar)
  Scan,    // attrs.reduce (sum only for now), attrs.reverse; inclusive
  Take,    // (tile, index: i32 scalar) the slice at `index` along attrs.axis, which it drops (a rank-1
           // tile gives a scalar); an index outside the axis is an error (interpreter) / undefined (GPU)
  // Static slicing and assembly (the result's shape is its type's; every offset is a compile-time
  // constant, so each lies inside its tile by construction).
  Slice,   // (x) the block of x at attrs.offsets (one per axis) of the result's shape; same rank
  Concat,  // (x0, x1, ...) joined along attrs.axis; the other dims agree
  Place,   // (big, block) big with block written over it at attrs.offsets (one per axis)
  // Tensor cores.
  Dot,     // (a [M,K], b [K,N]) -> f32 [M,N]; a, b of one float dtype, accumulated in f32
  // Memory.
  Load,    // (tensor, offsets[rank], limits[rank]) attrs.dims, attrs.shape -> tile (or scalar if dims empty)
  Store,   // (tensor, offsets[rank], limits[rank], value) attrs.dims
  // Flags between launches that run at once (a producer's programs signal, a consumer's wait: see
  // KernelLaunch::overlaps in kernels/op.h). Each holds a barrier of the program's threads, so neither
  // stands in an if; an element outside the tensor is an error (interpreter) / skipped (GPU).
  Signal,  // (tensor i32, offsets[rank]) once every thread of the program is past its stores before it,
           // adds 1 to the element (release at GPU scope: those stores are seen by whoever sees the add)
  Wait,    // (tensor i32, offsets[rank], count i32) until the element is at least count (acquire: every
           // thread past it sees the stores the counted signals released); a count of 0 or less waits for
           // nothing, the barrier included (a uniform branch: scalars are the program's). In a for body: done at the
           // head of each iteration, before the copies the pipeline issues there for later iterations, so
           // its operands come from the induction variable and values from outside the loop. On the CPU
           // (launches one after another) the element must be at least count already
  // Control flow.
  For,     // (lo, hi, step, inits...) -> results; one region, block args (iv, carried...), ends in Yield
  If,      // (cond, ) -> results; two regions (then, else), each ends in Yield
  Yield,   // (values...) terminator of For/If regions
};

enum class CmpPred : uint8_t { lt, le, gt, ge, eq, ne };
enum class ReduceKind : uint8_t { sum, max, min };

/// Op attributes. One flat struct: each opcode uses the fields its comment above names.
struct Attrs {
  int64_t axis = 0;
  int64_t ivalue = 0;
  double fvalue = 0;
  DType dtype = DType::f32;  // Cast destination
  CmpPred pred = CmpPred::lt;
  ReduceKind reduce = ReduceKind::sum;
  bool reverse = false;
  std::vector<int64_t> shape;  // Splat, Broadcast, Reshape, Load (block shape, one per tile axis)
  std::vector<int64_t> dims;   // Load/Store: tensor dim of each tile axis, in tile-axis order
  std::vector<int64_t> perm;   // Transpose
  std::vector<int64_t> offsets;  // Slice, Place: where the block starts along each axis
  bool prefetch = false;  // Load: the block stays in shared memory as copied (passes/pipeline.h)
  bool operator==(const Attrs&) const = default;
};

struct Op;
struct Block;

/// An SSA value: the result of an op or an argument of a block (kernel params, loop iv, carried).
struct Value {
  int id = -1;  // unique within the kernel; printed as %id or %name
  Type type;
  Op* def = nullptr;         // defining op, or null for block arguments
  Block* owner = nullptr;    // for block arguments
  std::string name;          // optional, for kernel parameters ("q", "scale")
};

/// A straight-line list of ops with arguments. For/If bodies are blocks; so is the kernel body.
struct Block {
  std::vector<Value*> args;
  std::vector<std::unique_ptr<Op>> ops;
  Op* parent = nullptr;  // the For/If owning this block, null for the kernel body
};

struct Op {
  OpCode code;
  std::vector<Value*> operands;
  std::vector<Value*> results;
  Attrs attrs;
  std::vector<std::unique_ptr<Block>> regions;
  SourceLoc loc;
  Block* parent = nullptr;

  Value* result() const { return results.at(0); }
};

/// A parameter of a kernel as the launcher sees it.
struct Param {
  std::string name;
  Value* value;  // a block argument of the kernel body
};

/// The most pipeline stages a kernel may ask for (Kernel::num_stages).
constexpr int kMaxNumStages = 4;

/// One kernel: parameters and a body. Owns every value and op in it.
struct Kernel {
  std::string name;
  std::vector<Param> params;
  Block body;
  SourceLoc loc;  // where the kernel was defined
  // Launch metadata recorded by the author (does not change semantics).
  int num_warps = 4;
  int num_stages = 2;  // the chunk loops' pipeline stages, 1 to kMaxNumStages (compiler/passes/pipeline.h)
  /// Thread blocks per SM the register allocation must allow (0: ptxas chooses; it aims at two when
  /// shared memory allows, capping 256-thread kernels at 128 registers, and spills rather than drop to one).
  int min_ctas_per_sm = 0;
  /// Dots of f32 tiles on the tensor cores, as three tf32 products each (fp32-level accuracy: see
  /// compiler/nvptx/lower_dot.cpp), rather than FMA loops. Off by default: the split fragments cost
  /// registers that kernels with large fp32 products do not have.
  bool tensor_core_f32 = false;
  /// Warps added to the num_warps that compute (0 or 4: one warpgroup) which do nothing but copy the
  /// chunk loop's pipelined tiles with TMA, each stage handed over through a pair of mbarriers (warp
  /// specialisation: compiler/passes/warp_roles.h). A schedule: results are the same. On targets
  /// without TMA it is ignored.
  int producer_warps = 0;

  Kernel() = default;
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  /// Creates a new value owned by this kernel.
  Value* new_value(Type t, std::string name = {});
  /// Adds a kernel parameter (tensor or scalar).
  Value* add_param(std::string name, Type t);
  const Param* find_param(std::string_view name) const;
  int num_values() const { return static_cast<int>(values_.size()); }

 private:
  std::vector<std::unique_ptr<Value>> values_;
};

/// Creates an op appended at the end of `block` with results of the given types.
Op* append_op(Kernel& k, Block& block, OpCode code, std::vector<Value*> operands,
              std::vector<Type> result_types, Attrs attrs, SourceLoc loc);

/// IR spelling of an opcode ("add", "load", "for", ...) and back.
std::string_view opcode_name(OpCode c);
bool parse_opcode(std::string_view s, OpCode* out);
std::string_view cmp_pred_name(CmpPred p);
/// How the DSL (dsl/include/linac/dsl.h) spells what made `op`, for messages to its users: "`*`" for
/// mul, "where" for select, "sum" for a sum reduce, "for_range" for a loop and its yield.
std::string dsl_spelling(const Op& op);
/// The same for an opcode alone (cmp: "comparison", reduce: "sum/max/min", yield: "yield").
std::string dsl_spelling(OpCode c);
std::string_view reduce_kind_name(ReduceKind r);

/// Whether the op is elementwise with operands and result of one shape.
bool is_elementwise(OpCode c);
bool is_unary_math(OpCode c);
bool is_binary_arith(OpCode c);

/// Whether `v` is defined in block `b` or in a block nested in it (an op's result or a block argument).
bool defined_in(const Value* v, const Block& b);

/// The names of the tensor parameters `k` stores to (the others it only reads).
std::set<std::string> stored_params(const Kernel& k);

/// Walks every op of a block and its nested regions in program order.
template <class F>
void walk(Block& b, F&& f) {
  for (auto& op : b.ops) {
    f(*op);
    for (auto& r : op->regions) walk(*r, f);
  }
}

}  // namespace linac::ir
