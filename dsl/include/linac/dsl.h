// The linac DSL: write a tile program in C++, get tile IR.
//
// Triton's model: one *program* of a grid computes one block of the output. Values are tiles (static
// shape, element type) or scalars (rank-0 tiles); the compiler maps tiles to threads. Every builder call
// records the caller's std::source_location, so errors and PTX line info point at the user's line.
//
//   KernelBuilder kb("scale_rows");
//   Tensor x = kb.tensor("x", DType::f32, 2);          // runtime shape and strides
//   Tile   s = kb.scalar("s", DType::f32);
//   Tile row = program_id(0);
//   Tile t = load(x, {row, 0}, {kIndex, 128});         // one row, 128 columns, masked past x.dim(1)
//   store(x, {row, 0}, {kIndex, 128}, t * s);
//   auto kernel = kb.finish();
//
// This header includes no LLVM or compiler header: user kernels compile in a second.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "linac/dtype.h"
#include "linac/error.h"

namespace linac::ir {
struct Value;
struct Kernel;
}  // namespace linac::ir

namespace linac::dsl {

using Loc = std::source_location;

/// A tile or a scalar value in the program being built. Cheap to copy (a handle). It belongs to the
/// KernelBuilder that recorded it and is usable only while that builder is alive, in its kernel: using
/// it after the builder is gone, or in another builder's kernel, is a UserError at the line of the use.
class Tile {
 public:
  Tile() = default;
  /// A handle on `v`, recorded by the innermost KernelBuilder of this thread.
  explicit Tile(ir::Value* v);
  /// A handle on `v`, recorded by the builder whose serial number is `builder` (see builder()).
  Tile(ir::Value* v, uint64_t builder) : v_(v), builder_(builder) {}
  ir::Value* value() const { return v_; }
  bool valid() const { return v_ != nullptr; }
  /// The serial number of the KernelBuilder that recorded this value (0 for an empty Tile).
  uint64_t builder() const { return builder_; }
  // The type, known while recording. UserError at `loc` for an empty Tile or one whose builder is gone.
  DType dtype(Loc loc = Loc::current()) const;
  const std::vector<int64_t>& shape(Loc loc = Loc::current()) const;
  int rank(Loc loc = Loc::current()) const;
  bool is_scalar(Loc loc = Loc::current()) const;

  /// Cast to another element type (rounds to nearest even for narrowing float casts).
  Tile to(DType t, Loc loc = Loc::current()) const;
  /// 2-D transpose.
  Tile T(Loc loc = Loc::current()) const;

 private:
  ir::Value* v_ = nullptr;
  uint64_t builder_ = 0;
};

/// An operand of arithmetic: a Tile or a C++ number. Numbers take the dtype of the other operand.
/// Carries the source location of the expression it appears in.
struct Operand {
  Tile tile;
  double number = 0;
  bool is_number = false;
  bool is_integer_number = false;
  Loc loc;
  Operand(const Tile& t, Loc l = Loc::current()) : tile(t), loc(l) {}
  Operand(double d, Loc l = Loc::current()) : number(d), is_number(true), loc(l) {}
  Operand(float d, Loc l = Loc::current()) : number(d), is_number(true), loc(l) {}
  Operand(int i, Loc l = Loc::current()) : number(i), is_number(true), is_integer_number(true), loc(l) {}
  Operand(int64_t i, Loc l = Loc::current())
      : number(static_cast<double>(i)), is_number(true), is_integer_number(true), loc(l) {}
};

/// A tensor argument: an n-d view of global memory with runtime shape and strides. Like a Tile, it
/// belongs to the KernelBuilder that declared it.
class Tensor {
 public:
  Tensor() = default;
  /// A handle on the parameter `v` of the kernel the innermost KernelBuilder of this thread records.
  explicit Tensor(ir::Value* v);
  /// A handle on `v`, a parameter of the builder whose serial number is `builder`.
  Tensor(ir::Value* v, uint64_t builder) : v_(v), builder_(builder) {}
  ir::Value* value() const { return v_; }
  uint64_t builder() const { return builder_; }
  DType dtype(Loc loc = Loc::current()) const;
  int rank(Loc loc = Loc::current()) const;
  /// The runtime size of dimension `axis` (an i32 scalar).
  Tile dim(int axis, Loc loc = Loc::current()) const;

 private:
  ir::Value* v_ = nullptr;
  uint64_t builder_ = 0;
};

/// Records a kernel. While alive, DSL calls on this thread append to it (builders nest as a stack).
class KernelBuilder {
 public:
  explicit KernelBuilder(std::string name, Loc loc = Loc::current());
  ~KernelBuilder();
  KernelBuilder(const KernelBuilder&) = delete;
  KernelBuilder& operator=(const KernelBuilder&) = delete;

  /// Declares a tensor parameter of the given element type and rank.
  Tensor tensor(std::string name, DType dtype, int rank, Loc loc = Loc::current());
  /// Declares a scalar parameter (i32, i64 or a float type).
  Tile scalar(std::string name, DType dtype, Loc loc = Loc::current());
  /// Launch hints carried with the kernel (they never change results).
  void set_num_warps(int n);
  /// Pipeline stages of the loads in loops, 1 to 4 (docs/dsl-guide.md, "Loads").
  void set_num_stages(int n);
  /// Blocks per SM that register allocation must allow; 1 gives a kernel all 255 registers per thread
  /// where ptxas would otherwise cap it to fit two blocks (and spill). 0 (default): ptxas chooses.
  void set_min_ctas_per_sm(int n);
  /// Dots of f32 tiles on the tensor cores as three tf32 products each (about fp32 accuracy; much
  /// faster than the default FMA loops, but with more registers per dot).
  void set_tensor_core_f32(bool on);
  /// 4: a warpgroup of its own copies the chunk loop's pipelined tiles with TMA (sm_90a; warp
  /// specialisation, docs/hopper.md); 0 (default): the computing warps issue the copies themselves.
  void set_producer_warps(int n);
  /// Ends recording, verifies the kernel and returns it. Throws UserError on a malformed program.
  std::shared_ptr<ir::Kernel> finish();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- leaves --------------------------------------------------------------------------------------

/// Index of this program along grid axis 0, 1 or 2 (i32).
Tile program_id(int axis, Loc loc = Loc::current());
/// Number of programs along grid axis 0, 1 or 2 (i32).
Tile num_programs(int axis, Loc loc = Loc::current());
/// A scalar constant (shape empty) or a tile filled with `value`.
Tile full(std::vector<int64_t> shape, double value, DType dtype, Loc loc = Loc::current());
Tile zeros(std::vector<int64_t> shape, DType dtype, Loc loc = Loc::current());
Tile constant(double value, DType dtype, Loc loc = Loc::current());
/// 0, 1, ..., n-1 as an i32 tile.
Tile iota(int64_t n, Loc loc = Loc::current());

// ---- elementwise ---------------------------------------------------------------------------------
// Operands broadcast as in numpy (scalars splat, size-1 dims expand); their dtypes must match.

Tile operator+(Operand a, Operand b);
Tile operator-(Operand a, Operand b);
Tile operator*(Operand a, Operand b);
Tile operator/(Operand a, Operand b);
Tile operator%(Operand a, Operand b);
Tile operator-(Operand a);
Tile operator<(Operand a, Operand b);
Tile operator<=(Operand a, Operand b);
Tile operator>(Operand a, Operand b);
Tile operator>=(Operand a, Operand b);
Tile operator==(Operand a, Operand b);
Tile operator!=(Operand a, Operand b);
/// Logical and/or/not of i1 values.
Tile operator&(Operand a, Operand b);
Tile operator|(Operand a, Operand b);
Tile operator!(Operand a);

Tile maximum(Operand a, Operand b);
Tile minimum(Operand a, Operand b);
Tile pow(Operand a, Operand b);
Tile exp(Operand a);
Tile exp2(Operand a);
Tile log(Operand a);
Tile log2(Operand a);
Tile sigmoid(Operand a);
Tile sqrt(Operand a);
Tile rsqrt(Operand a);
Tile abs(Operand a);
/// cond ? a : b elementwise; cond is i1.
Tile where(Operand cond, Operand a, Operand b);
Tile cast(const Tile& x, DType t, Loc loc = Loc::current());

// ---- shape ---------------------------------------------------------------------------------------

Tile broadcast_to(const Tile& x, std::vector<int64_t> shape, Loc loc = Loc::current());
Tile expand_dims(const Tile& x, int axis, Loc loc = Loc::current());
Tile reshape(const Tile& x, std::vector<int64_t> shape, Loc loc = Loc::current());
Tile transpose(const Tile& x, std::vector<int64_t> perm = {1, 0}, Loc loc = Loc::current());

// Static slicing and assembly: every start, size and offset is a C++ number, fixed when the kernel is
// recorded. On the GPU none of them goes through global memory: like transpose, each is evaluated where
// it is used, reading its operands' shared-memory copies (the copies a change of layout makes) or
// recomputing them (index math such as iota and constants).

/// The `size` elements of `x` from `start` along `axis`; the rank stays: slice(A, 0, 16, 16) is rows
/// 16..31 of A, slice(slice(A, 0, r, 16), 1, c, 16) its 16x16 block at (r, c).
Tile slice(const Tile& x, int axis, int64_t start, int64_t size, Loc loc = Loc::current());
/// The same with a start known only when the kernel runs (an i32 scalar, e.g. a loop variable): the
/// size stays a number. slice(concat({X, X}, 1), 1, m, K) is X with its K columns rolled left by m.
/// On the GPU its elements are reads of x's shared-memory copy at the shifted coordinates, so a slice
/// of a tile made before a loop costs no copy inside it. A start that leaves the axis is an error on
/// the interpreter (undefined on the GPU).
Tile slice(const Tile& x, int axis, const Tile& start, int64_t size, Loc loc = Loc::current());
/// The tiles one after another along `axis` (one dtype and rank; the other dims agree):
/// concat({A, B}, 1) is [A B], concat({A, B}, 0) is A above B.
Tile concat(const std::vector<Tile>& parts, int axis, Loc loc = Loc::current());
/// `big` with `block` written over it from `offsets` (one per axis) on: assembles a [64, 64] matrix
/// from 16x16 blocks, place(M, blk, {16, 32}), without a trip through global memory.
Tile place(const Tile& big, const Tile& block, std::vector<int64_t> offsets, Loc loc = Loc::current());

// ---- reductions and scans ------------------------------------------------------------------------

Tile sum(const Tile& x, int axis, Loc loc = Loc::current());
Tile max(const Tile& x, int axis, Loc loc = Loc::current());
Tile min(const Tile& x, int axis, Loc loc = Loc::current());
/// Inclusive prefix sum along axis; reverse=true sums from the end (suffix sums).
Tile cumsum(const Tile& x, int axis, bool reverse = false, Loc loc = Loc::current());
/// The slice of x at `index` (an i32 scalar, e.g. a loop variable) along `axis`, which it drops: row i
/// of a [M, N] tile is take(x, i, 0) [N], column j is take(x, j, 1) [M]. On the GPU each element is one
/// read of x's shared-memory copy, with no reduction: cheaper than sum(where(cols == j, x, 0), 1) inside
/// a loop. An index outside the axis is an error on the interpreter (undefined on the GPU).
Tile take(const Tile& x, const Operand& index, int axis, Loc loc = Loc::current());

// ---- tensor cores --------------------------------------------------------------------------------

/// a [M,K] x b [K,N] -> f32 [M,N]. a and b share a float dtype; products accumulate in f32.
Tile dot(const Tile& a, const Tile& b, Loc loc = Loc::current());

// ---- memory --------------------------------------------------------------------------------------

/// In a block shape, marks a tensor dimension that is indexed by its offset alone (not part of the tile).
inline constexpr int64_t kIndex = 0;

struct AccessOptions {
  /// Per tensor dim, an upper bound tighter than the tensor's size (e.g. a varlen sequence end):
  /// elements at index >= min(limit, dim) are masked. Pairs of (tensor dim, limit).
  std::vector<std::pair<int, Tile>> limits;
  /// Return the 2-D tile transposed (a [K, BT] block loaded from a [.., T, .., K] tensor).
  bool transpose = false;
  /// Loads only: keep the block in shared memory as copied, each use reading it there. Outside loops
  /// the copy is then asynchronous (cp.async), issued where the load stands and waited for at the
  /// block's first use, so that several loads overlap their latencies. Without it a block whose uses
  /// all read registers (conversions, elementwise math) is a register load, waited for at its first
  /// use before the next load's wait can start. Costs the block's shared memory.
  bool prefetch = false;

  /// These options with `prefetch` set (a load kept in shared memory as copied).
  AccessOptions prefetched() const {
    AccessOptions o = *this;
    o.prefetch = true;
    return o;
  }
};

/// Loads the block of `t` that starts at `offsets` (one per tensor dim) with `block` sizes (kIndex for
/// a dimension that is only indexed). The tile's axes are the blocked dims in order. Out-of-range
/// elements read as 0.
Tile load(const Tensor& t, std::vector<Operand> offsets, std::vector<int64_t> block,
          AccessOptions opts = {}, Loc loc = Loc::current());
/// Stores `value` into the block of `t` described as for load; out-of-range elements are skipped.
void store(const Tensor& t, std::vector<Operand> offsets, std::vector<int64_t> block, const Tile& value,
           AccessOptions opts = {}, Loc loc = Loc::current());

// ---- flags between launches that run at once ---------------------------------------------------
// A producer launch's programs signal that their part is stored; a consumer running at the same time
// (KernelLaunch::overlaps, kernels/op.h) waits for each part before reading it. Flags are i32 tensors
// the plan clears before every run (OpPlan::cleared). Neither call may stand in an if_then.

/// Adds 1 to the element of `flags` at `offsets` (one per dim) once every thread of the program is past
/// its stores before this call, releasing them: a program that waits for the flag then sees them.
void signal(const Tensor& flags, std::vector<Operand> offsets, Loc loc = Loc::current());
/// Waits until the element of `flags` at `offsets` is at least `count`; then every thread sees the
/// stores the counted signals released. A count of 0 or less waits for nothing (no barrier either). In
/// a for_range body it is done at the head of each iteration, before the loads the pipeline issues there
/// for later iterations: wait there for the data of the iterations ahead (kPipelineLookahead) too, with
/// offsets and count computed from the loop index and values from outside the loop by arithmetic (no
/// comparisons or selects).
void wait_for(const Tensor& flags, std::vector<Operand> offsets, Operand count, Loc loc = Loc::current());
/// How many iterations ahead of the current one a for_range body's pipelined loads may read (the
/// deepest pipeline, compiler/passes/pipeline.h): a wait_for in the body covers that many more.
constexpr int kPipelineLookahead = 2;

// ---- control flow --------------------------------------------------------------------------------

namespace detail {
void for_range(const Operand& lo, const Operand& hi, const std::function<void(Tile)>& body,
               std::span<Tile* const> carried);
void if_then_else(const Operand& cond, const std::function<void()>& then_body,
                  const std::function<void()>* else_body, std::span<Tile* const> carried);
}  // namespace detail

/// for (i = lo; i < hi; ++i) body(i). The listed variables are loop-carried: reassign them in the
/// body and they hold the value of the last iteration afterwards. Their type must not change.
template <class Body, class... Carried>
void for_range(const Operand& lo, const Operand& hi, Body&& body, Carried&... carried) {
  Tile* vars[] = {&carried..., nullptr};
  detail::for_range(lo, hi, std::function<void(Tile)>(std::forward<Body>(body)),
                    std::span<Tile* const>(vars, sizeof...(Carried)));
}

/// for_range with the loop-carried variables given as a list (for a set that depends on the kernel's
/// options).
inline void for_range_carrying(const Operand& lo, const Operand& hi, const std::function<void(Tile)>& body,
                               const std::vector<Tile*>& carried) {
  detail::for_range(lo, hi, body, std::span<Tile* const>(carried.data(), carried.size()));
}

/// if (cond) then_body(); the listed variables may be reassigned in the body.
template <class Then, class... Carried>
void if_then(const Operand& cond, Then&& then_body, Carried&... carried) {
  Tile* vars[] = {&carried..., nullptr};
  detail::if_then_else(cond, std::function<void()>(std::forward<Then>(then_body)), nullptr,
                       std::span<Tile* const>(vars, sizeof...(Carried)));
}

/// if (cond) then_body(); else else_body(); the listed variables may be reassigned in either.
template <class Then, class Else, class... Carried>
void if_then_else(const Operand& cond, Then&& then_body, Else&& else_body, Carried&... carried) {
  Tile* vars[] = {&carried..., nullptr};
  std::function<void()> e(std::forward<Else>(else_body));
  detail::if_then_else(cond, std::function<void()>(std::forward<Then>(then_body)), &e,
                       std::span<Tile* const>(vars, sizeof...(Carried)));
}

}  // namespace linac::dsl
