// Internal to compiler/nvptx: lowering of tile IR (with layouts and a shared-memory plan) to an LLVM
// function for nvptx64-nvidia-cuda. Split over lower_*.cpp by concern:
//   lower_kernel.cpp   entry, parameters, control flow, elementwise math, coordinates, rematerialization
//   lower_views.cpp    views evaluated where used (transpose, slice, ...) and concat/place
//   lower_memory.cpp   global loads/stores (masked, vectorized) and shared-memory spills/reads
//   lower_dot.cpp      dot on tensor cores (ldmatrix + mma.sync m16n8k16; on sm_90a wgmma.mma_async where
//                      the plan says, passes::WgmmaDot) and the f32 FMA path
//   lower_reduce.cpp   reductions and scans
//   lower_pipeline.cpp a chunk loop's ring of pipelined loads and its products waited for an iteration late
//   lower_tma.cpp      the ring's TMA copies and mbarriers (sm_90a)
//   lower_product_waits.cpp  wgmma products waited for at their result's first use
//   lower_warp_roles.cpp     producer warps filling a chunk loop's TMA ring (passes/warp_roles.h)
#pragma once
#include <llvm/IR/DIBuilder.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <cstdint>
#include <map>
#include <functional>
#include <set>
#include <vector>

#include "compiler/ir/ir.h"
#include "compiler/nvptx/codegen.h"
#include "compiler/passes/dot_accumulate.h"
#include "compiler/passes/layout.h"
#include "compiler/passes/smem_plan.h"

namespace linac::nvptx {

using Regs = std::vector<llvm::Value*>;
using Coords = std::vector<llvm::Value*>;  // i32, one per tile axis

/// A tensor parameter as the kernel sees it: base pointer, sizes (i32) and strides (i64, elements).
struct TensorView {
  llvm::Value* ptr = nullptr;
  std::vector<llvm::Value*> dims;
  std::vector<llvm::Value*> strides;
  DType dtype = DType::f32;
};

class KernelLowering {
 public:
  /// `sm`: the target's compute capability x 10.
  KernelLowering(const ir::Kernel& k, const passes::LayoutMap& layouts, const passes::DotAccumulators& accumulators,
                 const passes::SmemPlan& smem, llvm::Module& m, std::vector<KernelParamInfo>* abi,
                 std::vector<TensorMapParamInfo>* maps_abi, int sm);
  void run();

 private:
  // lower_kernel.cpp
  void create_function();
  void lower_block(const ir::Block& b);
  void lower_op(const ir::Op& op);
  void lower_for(const ir::Op& op);
  void lower_if(const ir::Op& op);
  void lower_data_elementwise(const ir::Op& op);
  llvm::Value* element_op(const ir::Op& op, const std::vector<llvm::Value*>& args);
  llvm::Value* convert(llvm::Value* x, DType from, DType to);
  llvm::Value* eval_at(const ir::Value* v, const Coords& c);
  Regs get_in_layout(const ir::Value* v, const passes::Layout& l);
  Coords coords_of(const passes::Layout& l, int r);
  llvm::Value* is_owner(const passes::Layout& l, int r);
  /// This thread's warp on an mma layout's wm x wn grid (layout.h): its indices along M and N, and the
  /// first row and column it holds (the row of its first 16-row tile).
  struct MmaWarp {
    llvm::Value *m, *n, *row0, *col0;
  };
  MmaWarp mma_warp(const passes::Layout& l);
  llvm::Value* scalar(const ir::Value* v);
  const passes::Layout& layout(const ir::Value* v) const { return layouts_.at(v); }
  passes::ValueClass cls(const ir::Value* v) const { return smem_.classes.at(v); }
  void set_location(const SourceLoc& loc);
  llvm::Type* llvm_type(DType t);
  llvm::Value* i32(int64_t v) { return b_.getInt32(static_cast<int32_t>(v)); }
  llvm::Value* thread_id() { return tid_; }
  /// A block barrier (emit_block_barrier). Shared-memory accesses decide whether they need one: a write to v's buffer waits
  /// if bytes it covers were read or written since the last barrier (WAR, WAW), a read waits if they
  /// were written (RAW). Runs of spills to distinct buffers so share one barrier.
  void barrier();
  /// The block barrier itself, at `b`'s insertion point: bar.sync 0 over every thread, or with producer
  /// warps, once the warps have parted, bar.sync 1 over the computing warps' threads.
  void emit_block_barrier(llvm::IRBuilder<>& b);
  /// A proxy fence, then a barrier: every thread's shared-memory writes so far are visible to the
  /// async proxy (wgmma's operand reads) once it has passed.
  void fenced_barrier();
  using ByteRange = std::pair<int64_t, int64_t>;
  /// Announces the shared-memory bytes that the code emitted next reads and writes, all of them at
  /// once: an op that reads two buffers must not register one, then emit the barrier the other needs
  /// (the barrier would forget the first read, whose loads come after it; tests/regress/
  /// dot_operand_reuse.tir). With `barrier_anyway`, a block barrier precedes them even where no
  /// shared-memory access needs one.
  void before_smem_access(const std::vector<ByteRange>& reads, const std::vector<ByteRange>& writes,
                          bool barrier_anyway = false);
  ByteRange smem_range(const ir::Value* v) const;
  void before_smem_write(const ir::Value* v);
  void before_smem_read(const ir::Value* v);
  void before_smem_write(ByteRange bytes);
  void before_smem_read(ByteRange bytes);
  /// At control-flow joins the state of the paths is unknown: assume every hazard.
  void assume_smem_hazards() {
    hazards_.unknown = true;
    async_proxy_fenced_ = false;
  }
  /// Emits `for (j = lo; j < hi; ++j) accs = body(j, accs)` as an LLVM loop; returns the final accs.
  /// `rolled`: LLVM may not unroll it (code size and registers matter more than its speed).
  std::vector<llvm::Value*> emit_counted_loop(llvm::Value* lo, llvm::Value* hi, std::vector<llvm::Value*> init,
                                              const std::function<std::vector<llvm::Value*>(llvm::Value*, const std::vector<llvm::Value*>&)>& body,
                                              bool rolled = false);

  // lower_views.cpp
  /// Element c of a view op's result (expand_dims, broadcast, reshape, transpose, take, slice, concat,
  /// place), read from its operands.
  llvm::Value* eval_view(const ir::Op& op, const Coords& c);
  /// For a view with one tile source: that source and the coordinates of element c in it.
  std::pair<const ir::Value*, Coords> view_source(const ir::Op& op, const Coords& c);
  /// Where element c of a concat or place lies: parts[i] at at[i], chosen when take[i] holds and no
  /// take[j] with j < i does (the last part otherwise).
  struct Assembly {
    std::vector<const ir::Value*> parts;
    std::vector<Coords> at;
    std::vector<llvm::Value*> take;
  };
  /// `clamped`: each part's coordinates clamped into it, so that evaluating a part that is not chosen
  /// stays inside it (needed where every part is evaluated; not where one address is chosen and read).
  Assembly assembly_parts(const ir::Op& op, const Coords& c, bool clamped);
  /// Whether every element of v is an element of a shared-memory buffer: v is a data tile in shared
  /// memory, or views over such tiles only.
  bool in_smem(const ir::Value* v) const;
  /// The address of element c of v (in_smem(v)); the buffers it may read are appended to `reads`.
  llvm::Value* smem_element_addr(const ir::Value* v, const Coords& c, std::vector<ByteRange>* reads);

  // lower_flags.cpp: signal and wait, their scalar operands evaluated by `scalar_of` (a wait in a loop
  // body is lowered at the iteration's head, lower_for).
  void lower_flag(const ir::Op& op, const std::function<llvm::Value*(const ir::Value*)>& scalar_of);
  /// At the kernel's entry, where it has flags and the target has programmatic dependent launch: the
  /// launch queued after it may start (kernels/op.h, KernelLaunch::overlaps).
  void let_dependents_start();
  std::set<const ir::Op*> waits_at_loop_heads_;  // lowered there, skipped where they stand

  // lower_memory.cpp
  void lower_load(const ir::Op& op);
  void lower_store(const ir::Op& op);
  void spill(const ir::Value* v);
  llvm::Value* smem_read(const ir::Value* v, const Coords& c);
  /// Registers of `l` read or written as one vector in `v`'s buffer where it is swizzled (1 elsewhere).
  int swizzled_run(const ir::Value* v, const passes::Layout& l);
  /// `v`'s registers in `l` read from its buffer, and `rs` written to it, `run` (swizzled_run) at a time.
  Regs read_runs(const ir::Value* v, const passes::Layout& l, int run);
  void write_runs(const ir::Value* v, const passes::Layout& l, int run, const Regs& rs);
  /// Whether `v` is a transpose of a 16-bit tile in shared memory that ldmatrix.trans reads in the mma
  /// layout `l` (the rule transpose_by_ldmatrix and reads_transpose_by_ldmatrix share).
  bool ldmatrix_reads_transpose(const ir::Value* v, const passes::Layout& l);
  /// `v` read in `l` with ldmatrix.trans where ldmatrix_reads_transpose (nullopt elsewhere).
  std::optional<Regs> transpose_by_ldmatrix(const ir::Value* v, const passes::Layout& l);
  /// Whether `v`, elementwise math on views, reads such a transpose (through more elementwise math) in `l`.
  bool reads_transpose_by_ldmatrix(const ir::Value* v, const passes::Layout& l);
  /// Address of element `c` of v's shared-memory buffer (the current stage for a pipelined load).
  llvm::Value* smem_addr(const ir::Value* v, const Coords& c);
  /// Whether v lives in shared memory only, copied there by cp.async (a pipelined or prefetched load).
  bool pipelined(const ir::Value* v) const { return smem_.pipeline.contains(v); }
  /// Issues the cp.async copies of load `op` into its buffer, `stage_offset` bytes (an i32) in, with
  /// its scalar operands evaluated by `scalar_of`.
  void issue_async_copy(const ir::Op& op, const std::function<llvm::Value*(const ir::Value*)>& scalar_of,
                        llvm::Value* stage_offset);
  /// The tensor's element offsets (i32, per tensor dim) and bounds (min(limit, size), at least 0) of
  /// load or store `op`, with its scalar operands evaluated by `scalar_of`.
  struct AccessBounds {
    std::vector<llvm::Value*> offsets, bounds;
  };
  AccessBounds access_bounds(const ir::Op& op, const std::function<llvm::Value*(const ir::Value*)>& scalar_of);
  /// Whether element `c` of load or store `op`'s tile (at `at`) is inside the bounds (i1), and its offset
  /// in elements from the tensor's base (i64).
  struct TensorElement {
    llvm::Value *in_bounds, *offset;
  };
  TensorElement tensor_element(const ir::Op& op, const AccessBounds& at, const Coords& c);
  /// Waits for the prefetched loads in flight up to the `groups`-th oldest (all by default) and makes
  /// their copies visible to every thread; the later ones stay in flight.
  void wait_prefetched_loads(size_t groups = SIZE_MAX);
  /// The wait alone, this thread's copies: a barrier must follow before other threads read them.
  void await_prefetched_copies(size_t groups);
  /// How many of the oldest prefetched loads in flight an access of these bytes must wait for: up to
  /// the last one whose buffer it touches (0: none).
  size_t prefetched_groups_touched(const std::vector<ByteRange>& reads, const std::vector<ByteRange>& writes) const;
  /// Re-evaluates a predictable scalar of `body` (see pipeline.h) with the induction variable = iv.
  llvm::Value* scalar_at_iteration(const ir::Value* v, const ir::Block& body, llvm::Value* iv);

  // lower_dot.cpp
  void lower_dot(const ir::Op& op);
  /// The sum of a split dot's partials (passes::dot_split_k): the first `slices` copies of each warp's
  /// tiles write `acc` to scratch, then every warp adds the slices' partials in slice order.
  std::vector<llvm::Value*> sum_split_partials(const passes::Layout& l, int slices, const std::vector<llvm::Value*>& acc);
  /// The accumulators `acc` (mt x N/8 tiles of this warp) after a dot on wgmma (passes::WgmmaDot): K/16
  /// steps of wgmma.mma_async m64nNk16 (N = n_wg, this warpgroup's columns from n_base) per 16-row tile
  /// tm (this warpgroup's 64 rows from wg_row(tm)); A from shared memory, or its fragments from
  /// `a_fragments(k0)`. With `accumulate` the first step adds to `acc` as it comes in. With `wait` false
  /// the group is committed and left in flight (the enclosing loop waits for it). `first_step_adds`, where
  /// not null, says at run time whether the first step adds (an i32; else `accumulate` does).
  std::vector<llvm::Value*> lower_wgmma(const passes::WgmmaDot& d, DType in, int64_t K, int64_t n_wg, int64_t mt,
                                        llvm::Value* n_base, const std::function<llvm::Value*(int64_t)>& wg_row,
                                        std::vector<llvm::Value*> acc, bool accumulate,
                                        const std::function<std::vector<std::vector<llvm::Value*>>(int64_t)>& a_fragments,
                                        bool wait, llvm::Value* first_step_adds);

  // lower_pipeline.cpp
  /// What a chunk loop's pipeline needs of its body (passes/pipeline.h, wgmma_waits.h).
  struct LoopPipeline {
    std::vector<const ir::Op*> loads;  // the body's pipelined loads copied by cp.async
    std::vector<const ir::Op*> tma_loads;  // and by TMA (lower_tma.cpp)
    int64_t barriers = -1;             // the TMA ring's mbarriers (SmemPlan::ring_barriers)
    bool slack = false;                // a slack stage in the ring
    bool async_reads = false;          // a wgmma product of the body reads shared memory (async proxy)
    int deferred_groups = 0;           // the body's products waited for an iteration late
    std::vector<const ir::Op*> zero_start_dots;  // those whose accumulators enter as zeros
    std::set<size_t> zero_start_carried;          // the carried values those accumulate (indices)
    bool ring() const { return !loads.empty() || !tma_loads.empty(); }
  };
  LoopPipeline loop_pipeline(const ir::Op& loop);
  /// The copies of the ring's loads for the iteration with induction variable `at` into `stage` (an
  /// i32); only where at < hi when `hi` is given.
  void issue_ring_copies(const LoopPipeline& p, const ir::Block& body, llvm::Value* at, llvm::Value* stage,
                         llvm::Value* hi);
  /// Before the loop: the copies of the first iterations.
  void ring_prologue(const LoopPipeline& p, const ir::Block& body, llvm::Value* lo, llvm::Value* hi, llvm::Value* step);
  /// At the head of the body: the waits and barriers for this iteration's copies, the copies of a later
  /// one, and the stage the body reads (stage_base_).
  void ring_head(const LoopPipeline& p, const ir::Block& body, llvm::Value* iv, llvm::Value* lo, llvm::Value* hi,
                 llvm::Value* step);
  /// At the end of the body: the previous iteration's deferred products waited for.
  void deferred_products_done(const LoopPipeline& p);
  /// After the loop: every product waited for, the copies drained.
  void pipeline_exit(const LoopPipeline& p);
  /// Accumulators of a loop that may not have run (`runs` false): zero then, chosen after the wait.
  Regs zero_where_no_iteration(Regs rs, llvm::Value* runs);

  // lower_product_waits.cpp: wgmma products waited for at their result's first use
  // (passes::first_use_wgmma_waits, SmemPlan::first_use_waits).
  /// Waits for the `n` oldest pending products (all by default); later ones stay in flight. Their
  /// accumulators pass through opaque copies after the wait, so that no read of them moves ahead of it.
  void await_products(size_t n = SIZE_MAX);
  /// How many of the oldest pending products `op` must wait for: up to the newest whose result it reads,
  /// directly or through the rematerialized values and views it evaluates (0: none).
  size_t products_read_by(const ir::Op& op) const;
  size_t products_read_by_value(const ir::Value* v) const;
  /// Before `op` (lower_block): what it reads waited for, and everything before control flow and flags.
  void await_products_before(const ir::Op& op);
  /// After `op`: an add it absorbed (dot_accumulate.h) holds the pending product's accumulators too.
  void track_absorbed_add(const ir::Op& op);
  struct PendingProduct {
    std::vector<const ir::Value*> values;  // holding its accumulators: its result, an add it absorbed
    int64_t group;                         // its commit group (wgmma_groups_ when issued, from 0)
  };
  std::vector<PendingProduct> pending_products_;  // oldest first
  int64_t wgmma_groups_ = 0;  // commit groups issued so far (lower_wgmma)

  // lower_tma.cpp
  /// Before the ring's first copies: thread 0 initialises a barrier per stage (one arrival: its own,
  /// with the stage's bytes) and fences the initialisation for the async proxy. Every thread passes a
  /// block barrier before it waits on one (the ring's head), which orders the two.
  void init_ring_barriers(const LoopPipeline& p);
  /// The TMA loads' copies for the iteration with induction variable `at` into `stage` (i32): thread 0
  /// arms the stage's barrier with the bytes of the tiles TMA copies and issues their boxes; a tile whose
  /// box crosses a limit short of the tensor's end, or whose map the launcher could not encode, is
  /// copied by every thread synchronously instead.
  void issue_tma_copies(const LoopPipeline& p, const ir::Block& body, llvm::Value* at, llvm::Value* stage);
  /// The parts of issue_tma_copies. Per TMA load of the ring, at the iteration with induction variable
  /// `at`: whether TMA copies it (i1), its offsets and bounds; and the bytes TMA copies (i32).
  struct TmaCopies {
    std::vector<llvm::Value*> by_tma;
    std::vector<AccessBounds> where;
    llvm::Value* tx = nullptr;
  };
  TmaCopies tma_copies(const LoopPipeline& p, const ir::Block& body, llvm::Value* at);
  /// The thread where `issuer` holds arms the stage's full barrier with c.tx bytes and issues the boxes.
  void arm_and_issue(const LoopPipeline& p, const TmaCopies& c, llvm::Value* stage, llvm::Value* issuer);
  /// `threads` threads, this one `first` among them, copy the tiles TMA does not (copy_tile_by_threads).
  void copy_fallbacks(const LoopPipeline& p, const TmaCopies& c, llvm::Value* stage, llvm::Value* first, int threads,
                      bool rolled);
  /// `threads` threads (this one `first` among them) copy TMA load `load`'s tile (its offsets and bounds
  /// `at`) into `stage` with plain loads and stores, zeros outside the bounds: where TMA cannot. `rolled`:
  /// the element loop stays a loop (a producer warp's few registers), else LLVM may unroll it.
  void copy_tile_by_threads(const ir::Op& load, const AccessBounds& at, llvm::Value* stage, llvm::Value* first,
                            int threads, bool rolled);
  /// Every thread waits until the copies into `stage` (i32) of the iteration `iter` (i32, from 0) landed.
  void wait_tma_stage(const LoopPipeline& p, llvm::Value* stage, llvm::Value* iter);
  /// Every thread of the warp waits until mbarrier `bar` completed the phase of `parity` (i32).
  void wait_barrier_phase(llvm::Value* bar, llvm::Value* parity);
  /// The shared-space address (u32) of stage `stage`'s empty barrier (producer warps).
  llvm::Value* empty_barrier(const LoopPipeline& p, llvm::Value* stage);
  /// This thread's arrival on mbarrier `bar`.
  void arrive(llvm::Value* bar);
  /// bar.warp.sync: the warp's threads reconverge (before and after the ring's barrier operations).
  void warp_sync();
  /// The shared-space address (u32) of the mbarrier of the ring's stage `stage` (i32).
  llvm::Value* ring_barrier(const LoopPipeline& p, llvm::Value* stage);

  // lower_warp_roles.cpp (passes::ProducerPlan)
  /// With producer warps, at the kernel's entry: the producer plan's prologue for every thread, the ring's
  /// barriers initialised, then the warps part; the producer warpgroup runs produce() and exits, the
  /// computing warps go on (consumer_threads_ set).
  void part_warps();
  /// The producer's loop: each iteration's copies, once the computing warps released their stage.
  void produce(const LoopPipeline& p, const ir::Op& loop);
  /// The computing warps' side of the ring where the producer fills it: before the loop every stage
  /// released once (ring_prologue); at the head of iteration `iter` the stage of iteration iter + distance
  /// released where an earlier iteration used it (ring_head).
  void release_all_stages(const LoopPipeline& p);
  void release_stage_ahead(const LoopPipeline& p, llvm::Value* iter);
  const ir::Op* producer_loop_ = nullptr;  // the loop whose ring the producer warps fill (none: null)
  int consumer_threads_ = 0;               // after the warps parted: the computing warps' threads

  // lower_reduce.cpp
  void lower_reduce(const ir::Op& op);
  void lower_scan(const ir::Op& op);
  /// Warp-shuffle forms for 1-D tiles no longer than the program (thread t owns element t).
  bool lower_reduce_1d(const ir::Op& op);
  bool lower_scan_1d(const ir::Op& op);
  bool lower_scan_2d(const ir::Op& op);
  /// A 2-D tile along either axis from registers, shuffles and per-warp partials
  /// (passes::register_reduction).
  bool lower_reduce_registers(const ir::Op& op);
  /// The result of a scan written to scratch (accumulator dtype `at`), read back in the result's layout:
  /// element c at byte_offset(c) of the scratch area, converted to the result's dtype.
  Regs read_scratch_in_layout(const ir::Value* result, DType at, const std::function<llvm::Value*(const Coords&)>& byte_offset);
  /// Address `byte_offset` bytes into the plan's scratch area.
  llvm::Value* scratch_addr(llvm::Value* byte_offset);

  const ir::Kernel& k_;
  const passes::LayoutMap& layouts_;
  const passes::DotAccumulators& accumulators_;
  const passes::SmemPlan& smem_;
  llvm::Module& m_;
  int sm_ = 0;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  std::vector<KernelParamInfo>* abi_;
  std::vector<TensorMapParamInfo>* maps_abi_;
  std::vector<llvm::Value*> tensor_map_ok_;  // i32 per tensor map (passes::PipelinePlan::tensor_maps)
  std::vector<llvm::Value*> tensor_maps_;    // the maps' parameters (generic pointers to them)
  llvm::Function* fn_ = nullptr;
  llvm::Value* tid_ = nullptr;
  llvm::Value* smem_ptr_ = nullptr;  // the dynamic shared memory array
  std::map<const ir::Value*, Regs> regs_;
  std::map<const ir::Value*, TensorView> tensors_;
  std::map<const ir::Value*, llvm::Value*> stage_base_;
  std::set<const ir::Value*> read_write_tensors_;  // tensors the kernel both loads and stores
  /// The shared-memory accesses since the last barrier (what the next access may conflict with).
  struct SmemHazards {
    std::vector<ByteRange> written, read;
    bool unknown = false;  // after a join whose paths are not tracked: anything may be pending
    /// Whether accessing `reads` and `writes` now needs a barrier first (RAW, WAR, WAW).
    bool conflicts(const std::vector<ByteRange>& reads, const std::vector<ByteRange>& writes) const;
    /// Adds what `other` has pending (a join of two paths).
    void merge(const SmemHazards& other);
  };
  SmemHazards hazards_;
  /// A loop body's accesses before its first barrier on every path: what the hazards at the loop's
  /// entry and at the end of its body (the previous iteration's) must be checked against (lower_for).
  struct LoopHead {
    int depth;         // the body's region depth: only a barrier at that depth is on every path
    bool open = true;  // no such barrier yet
    std::vector<ByteRange> reads, writes;
  };
  std::vector<LoopHead> loop_heads_;  // of the loops being lowered, innermost last
  int region_depth_ = 0;              // loop bodies and branch arms entered
  /// Buffers of the prefetched loads not yet waited for, one commit group each, oldest first.
  std::vector<ByteRange> prefetch_in_flight_;
  /// No shared-memory write since the last fenced_barrier (straight-line code only: a join, a loop's
  /// entry or exit, or landed copies clear it).
  bool async_proxy_fenced_ = false;
  /// Deferred products whose accumulators enter their loop as zeros: whether the first step adds (an
  /// i32, 0 in the first iteration), set while their loop's body is lowered (lower_for).
  std::map<const ir::Op*, llvm::Value*> first_step_adds_;
  // Debug info: DSL lines become PTX .loc directives.
  std::unique_ptr<llvm::DIBuilder> di_;
  llvm::DISubprogram* di_sub_ = nullptr;
  std::map<std::string, llvm::DIFile*> di_files_;
};

}  // namespace linac::nvptx
