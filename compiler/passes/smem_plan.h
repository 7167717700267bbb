// Shared-memory planning: which tile values the GPU lowering must write to shared memory, and where.
//
// The lowering keeps "data" tiles (loads, dots, reductions, anything computed from them) in registers
// in their layout. A tile is read from shared memory instead when it is
//   - an operand of dot (ldmatrix reads it; a transpose of a data tile is read transposed in place),
//   - the operand of a reduction or scan,
//   - needed at coordinates its own layout does not give the reading thread: a consumer in another
//     layout, or a view op (expand_dims, broadcast, reshape, transpose, take, slice, concat, place)
//     consumed elsewhere.
// Index math (iota, constants, splats and elementwise ops on them) is never stored: it is recomputed
// from coordinates in whatever layout needs it ("rematerialized"), as are view ops.
//
// Each stored value gets its own buffer in the dynamic shared memory of the program, row-major with
// rows padded by 16 bytes so that ldmatrix and column reads avoid bank conflicts; except the operands
// that sm_90a's warpgroup tensor cores read themselves (WgmmaDot: B, and A on request), through matrix
// descriptors, in one of their swizzled layouts (SmemBuffer::swizzle_bytes). Buffers of values
// whose live ranges do not overlap share space (allocation by liveness over program order, a loop
// body being live as a whole for values defined outside it).
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>

#include "compiler/ir/ir.h"
#include "compiler/passes/layout.h"
#include "compiler/passes/pipeline.h"

namespace linac::passes {

/// How the lowering computes a value.
enum class ValueClass : uint8_t {
  Scalar,  // a uniform scalar, computed once per program
  Remat,   // index math, and math on views and index math: recomputed from coordinates where used
  View,    // a view op (expand_dims, ..., slice, concat, place) over data: evaluated through its sources' buffers
  Data,    // held in registers in its layout
};

struct SmemBuffer {
  int64_t offset = 0;      // bytes from the start of dynamic shared memory (16-byte aligned)
  int64_t row_stride = 0;  // elements between rows (rank 2); 0 for rank 1
  int64_t bytes = 0;         // all stages
  int64_t stage_bytes = 0;   // one stage (bytes == stages * stage_bytes)
  int stages = 1;            // 2 for a pipelined load: iteration i uses stage i % 2
  DType dtype = DType::f32;
  // 0: rows padded by 16 bytes. 32, 64 or 128: wgmma's swizzled layout of that width W. The columns go
  // in blocks of W bytes, each block its rows one after the other (W bytes a row, no padding), and
  // within every 8 rows x W bytes the 16-byte units of row r are permuted: byte offset o (from the
  // buffer's start, 1024-aligned) becomes o ^ (((o >> 7) & (W/16 - 1)) << 4) (CUTLASS's Swizzle<b,4,3>).
  int swizzle_bytes = 0;
};

/// Where the tensor cores read a wgmma operand: a swizzled buffer, through a matrix descriptor per
/// 16-deep step. For B, element (kk, n) is buf[n + row0][kk + col0] when `k_major` (B is a transpose
/// of a tile stored [n][k]), else buf[kk + row0][n + col0]; for A, element (m, kk) is
/// buf[m + row0][kk + col0] when `k_major` (stored [m][k]), else buf[kk + row0][m + col0].
struct WgmmaOperand {
  const ir::Value* buf = nullptr;
  bool k_major = false;
  int64_t row0 = 0, col0 = 0;
};

/// A dot on sm_90a's warpgroup tensor cores (wgmma.mma_async m64nNk16): B from shared memory, A from
/// shared memory too where its buffer can take a swizzled layout (else `a.buf` is null and A comes
/// from registers, loaded with ldmatrix as mma.sync takes it).
struct WgmmaDot {
  WgmmaOperand a, b;
};

/// A wgmma dot waited for an iteration late (wgmma_waits.h).
struct DeferredWait {
  bool zero_start = false;  // its accumulator enters the loop as zeros: the first product starts from zero
};

struct SmemPlan {
  PipelinePlan pipeline;
  std::map<const ir::Value*, ValueClass> classes;
  std::map<const ir::Value*, SmemBuffer> buffers;  // values written to shared memory after definition
  // Scratch for warp-shuffle reductions and scans of 1-D tiles (32 per-warp partials, 8 bytes each,
  // followed by the scan's result, up to 8 bytes per element) and for the results of 2-D scans
  // (scan_2d_scratch_bytes).
  int64_t scratch_offset = 0;
  int64_t scratch_bytes = 0;
  // Whether 2-D scans go line by line through scratch: only when their scratch still fits the
  // device's shared memory (else the slower per-element form, which needs none).
  bool line_scans = false;
  // The mbarriers of the TMA rings (PipelinePlan::tma): for each loop with TMA loads, one 8-byte barrier
  // per stage from this offset, after every buffer and the scratch.
  std::map<const ir::Op*, int64_t> ring_barriers;
  int64_t total_bytes = 0;
  std::map<const ir::Op*, WgmmaDot> wgmma_dots;  // the dots that run on wgmma (empty unless asked for)
  std::set<const ir::Op*> dots_a_in_registers;    // the dots whose A is read from its registers (dot_a_in_registers)
  std::map<const ir::Op*, int> split_dots;         // mma.sync dots split along K among their copies (dot_split_k): slices
  // Top-level loads that could be asynchronous copies (as pipeline.prefetched's) but whose tiles stay in
  // registers: each is waited for at its first use, before the loads after it are issued.
  std::vector<const ir::Op*> register_loads;
  std::map<const ir::Op*, DeferredWait> deferred_waits;  // wgmma dots waited for an iteration late (wgmma_waits.h fills it)
  std::set<const ir::Op*> first_use_waits;  // the other wgmma dots, where waited for at their result's first use (wgmma_waits.h)
};

/// The scratch bytes of a scan of a 2-D tile (f16, bf16, f32 or i32: 32-bit sums) along an axis of at
/// most 128 elements, which the backend lowers one line per thread through scratch when the plan allows
/// (SmemPlan::line_scans); 0 for every other op (lowered without it).
int64_t scan_2d_scratch_bytes(const ir::Op& op);

/// A dot operand read in place from the shared-memory buffer of the data tile it is a view of: element
/// (i, j) of the operand is buf[i + row0][j + col0], or buf[j + row0][i + col0] when transposed.
struct DotOperandInPlace {
  const ir::Value* buf = nullptr;
  bool transposed = false;
  int64_t row0 = 0, col0 = 0;
};

/// Where a dot operand made of transposes and slices of a 2-D data tile can be read in place (with
/// ldmatrix: the slice's first column must start a 16-byte unit); nullopt for any other operand,
/// which gets a shared-memory copy of its own. `classes` is SmemPlan::classes.
std::optional<DotOperandInPlace> dot_operand_in_place(const ir::Value* v,
                                                      const std::map<const ir::Value*, ValueClass>& classes);

/// Whether dot `op` reads its A operand from the registers that hold it, with no shared-memory copy and
/// no ldmatrix: A is a 16-bit tile computed into registers (ValueClass::Data), or math on views
/// evaluated there (ValueClass::Remat: at the fragments' coordinates, from its sources), in a layout whose
/// registers are its A fragments (layout.h registers_are_a_fragments), and K is a multiple of 16. A thread's registers of two neighbouring 8-column tiles are then exactly its A fragment of one
/// 16-deep step (the m16n8 accumulator layout is the m16n8k16 A layout in halves: FlashAttention feeds
/// its scores to the second product so). The planner asks it and records the answer
/// (SmemPlan::dots_a_in_registers), which the lowering reads.
bool dot_a_in_registers(const ir::Op& op, const LayoutMap& layouts, const std::map<const ir::Value*, ValueClass>& classes);

/// How many slices of its reduction (K) the mma.sync dot `op` splits among the warps of its result
/// layout `result` (split-K); 1 for none. Where a result has fewer 16 x 8 tiles than the program has
/// warps, the warps past wm x wn hold copies (a 16 x 16 block on 8 warps: two warps' tiles, four
/// copies of each), and each copy would run the whole K loop; split, copy c runs the slice c % slices
/// of it, the partials meet in the scratch area, and every warp adds them in slice order (the copies
/// stay identical). Slices: the most copies (a power of two) that still leave each at least
/// kMinSplitSteps tensor-core steps (16 deep in 16 bits, 8 as tf32x3 in fp32: `tensor_core_f32`).
/// Not where A comes from registers (its fragments are picked per step at compile time).
int dot_split_k(const ir::Op& op, const Layout& result, int num_warps, bool tensor_core_f32);
inline constexpr int64_t kMinSplitSteps = 4;
/// The scratch bytes dot `op` split in `slices` needs for its partials (4 bytes each).
int64_t split_dot_scratch_bytes(const Layout& result, int slices);

/// Where a target's dots run: mma.sync (sm_80, and sm_90a on request), or wgmma (sm_90a) with A from
/// registers (ldmatrix) or from shared memory where its buffer can be swizzled.
enum class DotUnit : uint8_t { mma_sync, wgmma, wgmma_a_shared };

/// The one rule for where the dots of compute capability `sm` (x 10) run: mma.sync below 90; on sm_90a
/// wgmma, or what LINAC_WGMMA asks for (0: mma.sync, a-shared: A from shared memory too, 1: the
/// default; anything else is a UserError, checked on every target). Compiles (nvptx::GpuTarget::for_sm)
/// and the defaults' fit checks (kernels/common/fitting.h) both ask it.
DotUnit dot_unit_for_sm(int sm);

/// Plans shared memory for `k` with the given layouts. With a wgmma `unit`, the dots that can run on
/// warpgroup tensor cores do (WgmmaDot), their shared-memory operands' buffers swizzled.
SmemPlan plan_shared_memory(const ir::Kernel& k, const LayoutMap& layouts, const PipelinePlan& pipeline,
                            int64_t max_smem_bytes, DotUnit unit = DotUnit::mma_sync);

/// The buffers of the plan, one line per value (the pass's dump).
std::string print_smem_plan(const ir::Kernel& k, const SmemPlan& plan);

}  // namespace linac::passes
