// Register layouts of tile values on the GPU, and the pass that assigns them.
//
// A layout says which thread holds which element of a tile, like Triton's TritonGPU encodings:
//   - uniform: a scalar every thread holds (program_id, loop counters, reductions to a scalar).
//   - blocked: elements in row-major order dealt round-robin to the threads of the program, `vec`
//     consecutive elements at a time (coalesced global access). Tiles smaller than the program are
//     replicated: thread t holds element (t*vec) mod numel.
//   - mma: the accumulator layout of mma.sync m16n8k16 (lane l holds rows l/4 and l/4+8, columns
//     2*(l%4) and 2*(l%4)+1 of each 16x8 tile) on a wm x wn grid of warps, each warp owning N/wn
//     columns and M/wm rows in 16-row tiles. Two ways to place the warps:
//       sm_80: warp w is (w / wn % wm, w % wn); its rows are contiguous, [i M/wm, (i+1) M/wm).
//       sm_90a ("warpgroups"): warp w is (w % wm, w / wm % wn); its 16-row tiles are interleaved, i,
//       i + wm, i + 2 wm, ..., so that four consecutive warps along M hold 64 consecutive rows: the
//       accumulator of one warpgroup's wgmma m64nN.
//     Warps past wm*wn replicate.
//   - fused: a tile of rank 3 that is never held anywhere: elementwise math and broadcasts of rank-2
//     tiles consumed only by reductions over one axis (fused_rank3_values), which evaluate it element
//     by element from its sources, so sum_d x[r, d] y[c, d] w[r, c, d] never exists whole.
// Every layout maps (thread, register r) to coordinates as coord[d] = thread_part[d] + register_part[d][r],
// which lets the lowering evaluate index math (iota, masks, broadcasts) directly in any layout.
//
// Conversions between layouts go through shared memory (see smem_plan.h); the dot's operands are read
// from shared memory with ldmatrix, so "dot operand" is a shared-memory view rather than a register
// layout in this backend.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace linac::passes {

struct Layout {
  enum class Kind : uint8_t { Uniform, Blocked, Mma, Fused };
  Kind kind = Kind::Uniform;
  std::vector<int64_t> shape;  // tile shape (rank 1 or 2); empty for uniform
  int num_threads = 128;
  int vec = 1;                 // blocked: consecutive elements per thread per pass
  int wm = 1, wn = 1;          // mma: warps along M and N
  bool warpgroups = false;     // mma: the sm_90a placement of the warps (above)

  static Layout uniform() { return {}; }
  static Layout fused(std::vector<int64_t> shape);
  static Layout blocked(std::vector<int64_t> shape, int num_threads, int elem_bytes);
  /// The mma layout for an [M, N] tile, or nullopt-like invalid (kind Blocked) if the shape does not fit.
  static bool mma_fits(const std::vector<int64_t>& shape);
  static Layout mma(std::vector<int64_t> shape, int num_warps, bool warpgroups);

  int64_t numel() const;
  /// Registers each thread holds.
  int regs_per_thread() const;
  /// Coordinates contributed by register r (added to the thread part). Blocked: one entry, the
  /// row-major element offset (coordinates are split after adding the thread's offset).
  std::vector<int64_t> register_coords(int r) const;
  bool operator==(const Layout&) const = default;
  /// "#blocked<vec=4>", "#mma<warps=4x1>" (sm_90a: "#mma<warpgroups=4x1>"), "#uniform".
  std::string str() const;
};

/// The layout a store writes `v` from: its own when it is a blocked data tile; otherwise the blocked
/// layout of its type, so that global writes are coalesced vectors (mma tiles move through shared
/// memory first, as Triton converts before stores). `is_data` says whether v is held in registers.
Layout store_layout(const ir::Value* v, const Layout& own, bool is_data, int num_warps);

/// Whether a tile held in layout `a` has in each thread's registers exactly that thread's A fragments
/// of a dot whose result has layout `result`: both mma layouts, every warp along M (wn = 1) in the same
/// arrangement, so both cover the same 16-row tiles per warp (smem_plan.h dot_a_in_registers).
bool registers_are_a_fragments(const Layout& a, const Layout& result);

/// How many consecutive registers of `l`, from each multiple of that count, hold consecutive elements of
/// one row, the first at a column that is a multiple of the count: 2 in the mma layout (a lane's column
/// pairs), vec in a blocked layout whose passes split rows exactly; 1 where the layout promises no run.
int row_run(const Layout& l);

/// How a reduction of a 2-D tile along one axis runs from registers (register_reduction): each thread
/// folds its registers that share a kept coordinate (`groups`, each in ascending register order), then the
/// lanes that differ only along the reduced axis with butterfly shuffles (`lane_xors`), then the warps
/// that do: one partial per (slot, kept coordinate) goes to the scratch area, and the result's layout
/// reads and adds the `slots()` partials of its coordinates in slot order (deterministic). The operand
/// needs no shared-memory copy.
struct RegisterReduction {
  std::vector<std::vector<int>> groups;  // a thread's registers, by kept coordinate
  std::vector<int> lane_xors;            // shuffle offsets: the lane bits along the reduced axis, widest first
  std::vector<int> slot_bits;            // the warp-index bits along the reduced axis
  int replica_warps = 0;                 // warp-index bits of replicas: warps with one set do not write
  int64_t kept = 0;                      // extent of the kept axis
  int64_t slots() const { return int64_t{1} << slot_bits.size(); }
  int64_t scratch_bytes() const { return slots() * kept * 4; }
};

/// The register form of reduce `op` (2-D operand to 1-D, accumulating in f32 or i32) where its operand's
/// layout splits the thread index cleanly into row bits and column bits: mma layouts, and blocked ones
/// whose passes cover whole rows or divide them, with no replicated elements. An operand `held` in
/// registers (a data value) may have at most 64 per thread in a blocked layout: all of them are live at
/// the reduction (the gated delta backward's sum(dS' .* S) over a [128, 128] tile at 8 warps; at a cap
/// of 16 it stayed in shared memory, 11% of that kernel's ncu samples, and no library kernel spills at
/// its default configuration with 64); one computed at the reduction (math on views) is evaluated one
/// kept coordinate's registers at a time, at any size.
/// Otherwise nullopt: the operand goes to shared memory and each result element is one serial loop over
/// the reduced axis.
std::optional<RegisterReduction> register_reduction(const ir::Op& op, const Layout& operand, bool held);

/// The tiles of rank 3 the GPU backend fuses into the reductions that consume them: made by
/// elementwise ops, expand_dims, broadcast or constants (from tiles of lower rank), and used only by
/// reductions to rank 2 or less and by other such tiles. Every other tile of rank 3 is a UserError at
/// its DSL line (assign_layouts).
std::set<const ir::Value*> fused_rank3_values(const ir::Kernel& k);

/// The layout of every value of a kernel.
using LayoutMap = std::map<const ir::Value*, Layout>;

/// Assigns layouts: dot results are mma; loads, shape ops, reductions and scans are blocked; scalars
/// are uniform; elementwise ops take mma if any tile operand is mma, else blocked; loop-carried values
/// take the layout their yield produces (so the state of a chunk loop stays in the dot's accumulator
/// layout); rank-3 tiles fused into reductions are fused. Throws UserError, at the DSL line that made
/// it, for the first tile the GPU backend cannot hold (rank > 3, or rank 3 not fused).
/// `warpgroups`: the target runs dots on warpgroups (sm_90a), whose mma layouts place warps so.
LayoutMap assign_layouts(const ir::Kernel& k, bool warpgroups = false);

struct DotAccumulators;

/// The kernel's IR text with each result annotated by its layout (the dump of this pass), and where
/// `accumulators` is given, the dots that accumulate in place (dot_accumulate.h) marked "(accumulates)"
/// and the adds they absorb "(accumulated by the dot)".
std::string print_with_layouts(const ir::Kernel& k, const LayoutMap& layouts,
                               const DotAccumulators* accumulators = nullptr);

}  // namespace linac::passes
