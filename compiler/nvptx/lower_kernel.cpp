// The kernel skeleton: parameters, coordinates of layouts, control flow and elementwise math.
#include <fmt/format.h>
#include <algorithm>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/Intrinsics.h>

#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

using ir::OpCode;
using passes::Layout;
using passes::ValueClass;

KernelLowering::KernelLowering(const ir::Kernel& k, const passes::LayoutMap& layouts,
                               const passes::DotAccumulators& accumulators, const passes::SmemPlan& smem, llvm::Module& m,
                               std::vector<KernelParamInfo>* abi, std::vector<TensorMapParamInfo>* maps_abi, int sm)
    : k_(k), layouts_(layouts), accumulators_(accumulators), smem_(smem), m_(m), sm_(sm), ctx_(m.getContext()),
      b_(m.getContext()), abi_(abi), maps_abi_(maps_abi) {
  producer_loop_ = smem.pipeline.producer.loop;
}

llvm::Type* KernelLowering::llvm_type(DType t) {
  switch (t) {
    case DType::i1: return b_.getInt1Ty();
    case DType::i32: return b_.getInt32Ty();
    case DType::i64: return b_.getInt64Ty();
    case DType::f16: return b_.getHalfTy();
    case DType::bf16: return b_.getBFloatTy();
    case DType::f32: return b_.getFloatTy();
    case DType::f64: return b_.getDoubleTy();
  }
  throw InternalError("bad dtype");
}

void KernelLowering::create_function() {
  std::vector<llvm::Type*> types;
  for (const auto& p : k_.params) {
    const ir::Type& t = p.value->type;
    KernelParamInfo info{p.name, t.is_tensor(), t.dtype, t.rank()};
    abi_->push_back(info);
    if (t.is_tensor()) {
      types.push_back(llvm::PointerType::get(ctx_, 1));
      for (int d = 0; d < t.rank(); ++d) types.push_back(b_.getInt32Ty());
      for (int d = 0; d < t.rank(); ++d) types.push_back(b_.getInt64Ty());
    } else {
      types.push_back(llvm_type(t.dtype));
    }
  }
  // The TMA loads' tensor maps (codegen.h, TensorMapParamInfo): a flag each, then the maps by value.
  const auto& maps = smem_.pipeline.tensor_maps;
  for (const auto& m : maps) {
    int param = 0;
    while (k_.params.at(param).value != m.tensor) ++param;
    maps_abi_->push_back({param, m.box, m.swizzle_bytes});
    types.push_back(b_.getInt32Ty());
  }
  for (size_t i = 0; i < maps.size(); ++i) types.push_back(llvm::PointerType::get(ctx_, 0));
  auto* fty = llvm::FunctionType::get(b_.getVoidTy(), types, false);
  fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, k_.name, m_);
  // A map is read in place where the launcher put it, in the parameter space (a generic address of it,
  // cvta.param, is what cp.async.bulk.tensor takes): by value, 64-byte aligned, and a grid constant,
  // which keeps LLVM from copying it to local memory when its address is taken.
  const int first_map = static_cast<int>(types.size() - maps.size());
  for (size_t i = 0; i < maps.size(); ++i) {
    const unsigned a = static_cast<unsigned>(first_map + i);
    fn_->addParamAttr(a, llvm::Attribute::getWithByValType(ctx_, llvm::ArrayType::get(b_.getInt8Ty(), 128)));
    fn_->addParamAttr(a, llvm::Attribute::getWithAlignment(ctx_, llvm::Align(64)));
    fn_->addParamAttr(a, llvm::Attribute::get(ctx_, "nvvm.grid_constant"));
  }
  fn_->setCallingConv(llvm::CallingConv::PTX_Kernel);
  fn_->addFnAttr("nvvm.maxntid", std::to_string(passes::block_threads(k_, smem_.pipeline.producer)));
  if (k_.min_ctas_per_sm) fn_->addFnAttr("nvvm.minctasm", std::to_string(k_.min_ctas_per_sm));
  // With producer warps, the registers each thread starts with, which setmaxnreg moves between the roles
  // (their pool is the block's: lower_warp_roles.cpp).
  if (producer_loop_) fn_->addFnAttr("nvvm.maxnreg", std::to_string(passes::role_registers(k_, smem_.pipeline).launch));
  fn_->addFnAttr(llvm::Attribute::NoUnwind);

  // Debug directives only (.loc/.file, no DWARF sections): PTX lines point at the DSL source, and
  // the driver JIT, which refuses optimized code with full debug info, accepts it.
  di_ = std::make_unique<llvm::DIBuilder>(m_);
  std::string file = k_.loc.known() ? k_.loc.file : "<dsl>";
  auto* di_file = di_->createFile(file, "");
  di_files_[file] = di_file;
  auto* cu = di_->createCompileUnit(llvm::dwarf::DW_LANG_C_plus_plus_14, di_file, "linac", true, "", 0, "",
                                    llvm::DICompileUnit::DebugDirectivesOnly);
  auto* sty = di_->createSubroutineType(di_->getOrCreateTypeArray({}));
  di_sub_ = di_->createFunction(cu, k_.name, k_.name, di_file, k_.loc.line, sty, k_.loc.line,
                                llvm::DINode::FlagZero, llvm::DISubprogram::SPFlagDefinition);
  fn_->setSubprogram(di_sub_);

  auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
  b_.SetInsertPoint(entry);
  set_location(k_.loc);
  tid_ = b_.CreateIntrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, {});
  auto* smem_ty = llvm::ArrayType::get(b_.getInt8Ty(), 0);
  auto* gv = new llvm::GlobalVariable(m_, smem_ty, false, llvm::GlobalValue::ExternalLinkage, nullptr, "linac_smem",
                                      nullptr, llvm::GlobalValue::NotThreadLocal, 3);
  // 1024 bytes: the period of the 128-byte swizzle, which wgmma's descriptors read from address bits
  // (smem_plan.h, SmemBuffer::swizzle_bytes).
  gv->setAlignment(llvm::Align(1024));
  smem_ptr_ = gv;

  auto arg = fn_->arg_begin();
  for (const auto& p : k_.params) {
    const ir::Type& t = p.value->type;
    if (t.is_tensor()) {
      TensorView tv;
      tv.dtype = t.dtype;
      tv.ptr = &*arg++;
      tv.ptr->setName(p.name);
      for (int d = 0; d < t.rank(); ++d) {
        arg->setName(fmt::format("{}_dim{}", p.name, d));
        tv.dims.push_back(&*arg++);
      }
      for (int d = 0; d < t.rank(); ++d) {
        arg->setName(fmt::format("{}_stride{}", p.name, d));
        tv.strides.push_back(&*arg++);
      }
      tensors_[p.value] = tv;
    } else {
      arg->setName(p.name);
      regs_[p.value] = {&*arg++};
    }
  }
  for (size_t i = 0; i < maps.size(); ++i) {
    arg->setName(fmt::format("tma_map{}_ok", i));
    tensor_map_ok_.push_back(&*arg++);
  }
  for (size_t i = 0; i < maps.size(); ++i) {
    arg->setName(fmt::format("tma_map{}", i));
    tensor_maps_.push_back(&*arg++);
  }
}

void KernelLowering::set_location(const SourceLoc& loc) {
  if (!loc.known()) return;
  auto it = di_files_.find(loc.file);
  if (it == di_files_.end()) it = di_files_.emplace(loc.file, di_->createFile(loc.file, "")).first;
  // Ops of other files (a helper header) still need a scope of this function; the file is kept
  // through a lexical block so .loc names the right file.
  llvm::DIScope* scope = di_sub_;
  if (it->second != di_sub_->getFile()) scope = di_->createLexicalBlockFile(di_sub_, it->second);
  b_.SetCurrentDebugLocation(llvm::DILocation::get(ctx_, loc.line, loc.col, scope));
}

void KernelLowering::run() {
  std::set<const ir::Value*> loaded, stored;
  ir::walk(const_cast<ir::Block&>(k_.body), [&](ir::Op& op) {
    if (op.code == OpCode::Load) loaded.insert(op.operands[0]);
    if (op.code == OpCode::Store) stored.insert(op.operands[0]);
  });
  for (const ir::Value* t : stored)
    if (loaded.count(t)) read_write_tensors_.insert(t);
  create_function();
  let_dependents_start();
  if (producer_loop_) part_warps();
  lower_block(k_.body);
  b_.CreateRetVoid();
  di_->finalize();
}

void KernelLowering::barrier() {
  // Behind a barrier other threads may write any bytes, an operand's of a product in flight included.
  await_products();
  emit_block_barrier(b_);
  hazards_ = {};
  for (LoopHead& head : loop_heads_)
    if (head.depth == region_depth_) head.open = false;
}

void KernelLowering::emit_block_barrier(llvm::IRBuilder<>& b) {
  if (consumer_threads_) b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier_cta_sync_aligned_count, {i32(1), i32(consumer_threads_)});
  else b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier_cta_sync_aligned_all, {i32(0)});
}

void KernelLowering::fenced_barrier() {
  b_.CreateIntrinsic(llvm::Intrinsic::nvvm_fence_proxy_async_shared_cta, {});
  barrier();
  async_proxy_fenced_ = true;
}

namespace {
bool overlaps(const std::vector<std::pair<int64_t, int64_t>>& ranges, std::pair<int64_t, int64_t> r) {
  for (auto [lo, hi] : ranges)
    if (lo < r.second && r.first < hi) return true;
  return false;
}
}  // namespace

bool KernelLowering::SmemHazards::conflicts(const std::vector<ByteRange>& reads,
                                            const std::vector<ByteRange>& writes) const {
  if (unknown && !(reads.empty() && writes.empty())) return true;
  for (const ByteRange& r : reads)
    if (overlaps(written, r)) return true;
  for (const ByteRange& w : writes)
    if (overlaps(read, w) || overlaps(written, w)) return true;
  return false;
}

void KernelLowering::SmemHazards::merge(const SmemHazards& other) {
  written.insert(written.end(), other.written.begin(), other.written.end());
  read.insert(read.end(), other.read.begin(), other.read.end());
  unknown = unknown || other.unknown;
}

void KernelLowering::await_prefetched_copies(size_t groups) {
  groups = std::min(groups, prefetch_in_flight_.size());
  // Groups complete in commit order: waiting until at most (in flight - groups) are pending waits for
  // the oldest `groups`.
  b_.CreateIntrinsic(llvm::Intrinsic::nvvm_cp_async_wait_group, {i32(static_cast<int>(prefetch_in_flight_.size() - groups))});
  prefetch_in_flight_.erase(prefetch_in_flight_.begin(), prefetch_in_flight_.begin() + static_cast<std::ptrdiff_t>(groups));
  async_proxy_fenced_ = false;  // the copies landed: generic writes
}

void KernelLowering::wait_prefetched_loads(size_t groups) {
  await_prefetched_copies(groups);
  barrier();
}

size_t KernelLowering::prefetched_groups_touched(const std::vector<ByteRange>& reads,
                                                 const std::vector<ByteRange>& writes) const {
  size_t groups = 0;
  for (size_t g = 0; g < prefetch_in_flight_.size(); ++g)
    if (overlaps(reads, prefetch_in_flight_[g]) || overlaps(writes, prefetch_in_flight_[g])) groups = g + 1;
  return groups;
}

void KernelLowering::before_smem_access(const std::vector<ByteRange>& reads, const std::vector<ByteRange>& writes,
                                        bool barrier_anyway) {
  // A prefetched load's copies land asynchronously: an access to its bytes waits for them first, and
  // for the loads issued before it (groups complete in order), not for later ones: the kernel computes
  // with its first operands while the rest is still on its way.
  if (const size_t groups = prefetched_groups_touched(reads, writes)) wait_prefetched_loads(groups);  // behind a barrier
  else if (barrier_anyway || hazards_.conflicts(reads, writes)) barrier();
  // Registered only after the barrier: every access announced here is emitted after it.
  hazards_.read.insert(hazards_.read.end(), reads.begin(), reads.end());
  hazards_.written.insert(hazards_.written.end(), writes.begin(), writes.end());
  if (!writes.empty()) async_proxy_fenced_ = false;
  for (LoopHead& head : loop_heads_) {
    if (!head.open) continue;
    head.reads.insert(head.reads.end(), reads.begin(), reads.end());
    head.writes.insert(head.writes.end(), writes.begin(), writes.end());
  }
}

void KernelLowering::before_smem_write(ByteRange r) { before_smem_access({}, {r}); }

void KernelLowering::before_smem_read(ByteRange r) { before_smem_access({r}, {}); }

KernelLowering::ByteRange KernelLowering::smem_range(const ir::Value* v) const {
  const passes::SmemBuffer& buf = smem_.buffers.at(v);
  return {buf.offset, buf.offset + buf.bytes};
}

void KernelLowering::before_smem_write(const ir::Value* v) { before_smem_write(smem_range(v)); }

void KernelLowering::before_smem_read(const ir::Value* v) { before_smem_read(smem_range(v)); }

void KernelLowering::lower_block(const ir::Block& blk) {
  for (const auto& op : blk.ops) {
    if (op->code == OpCode::Yield) continue;  // handled by the enclosing for/if
    // Prefetched loads are waited for where their buffer is first accessed; a loop or branch may not
    // run that access on every path, so they are waited for before it.
    if (!op->regions.empty() && !prefetch_in_flight_.empty()) wait_prefetched_loads();
    set_location(op->loc);
    await_products_before(*op);
    lower_op(*op);
    track_absorbed_add(*op);
    for (const ir::Value* v : op->results)
      if (smem_.buffers.count(v) && !pipelined(v)) {
        await_products(products_read_by_value(v));
        spill(v);
      }
  }
  await_products();  // nothing stays in flight past the block: its end is a join or the kernel's
}

llvm::Value* KernelLowering::scalar(const ir::Value* v) {
  auto it = regs_.find(v);
  LINAC_INTERNAL_CHECK(it != regs_.end() && it->second.size() == 1, "scalar value not lowered");
  return it->second[0];
}

void KernelLowering::lower_op(const ir::Op& op) {
  const bool scalar_result = !op.results.empty() && op.result()->type.is_scalar();
  switch (op.code) {
    case OpCode::For: lower_for(op); return;
    case OpCode::If: lower_if(op); return;
    case OpCode::Load: lower_load(op); return;
    case OpCode::Store: lower_store(op); return;
    case OpCode::Signal:
    case OpCode::Wait:
      if (!waits_at_loop_heads_.count(&op)) lower_flag(op, [&](const ir::Value* v) { return scalar(v); });
      return;
    case OpCode::Dot: lower_dot(op); return;
    case OpCode::Reduce: lower_reduce(op); return;
    case OpCode::Scan: lower_scan(op); return;
    case OpCode::ProgramId:
    case OpCode::NumPrograms: {
      static constexpr llvm::Intrinsic::ID ctaid[] = {llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x,
                                                      llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y,
                                                      llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z};
      static constexpr llvm::Intrinsic::ID nctaid[] = {llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x,
                                                       llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_y,
                                                       llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_z};
      auto id = (op.code == OpCode::ProgramId ? ctaid : nctaid)[op.attrs.axis];
      regs_[op.result()] = {b_.CreateIntrinsic(id, {})};
      return;
    }
    case OpCode::Dim:
      regs_[op.result()] = {tensors_.at(op.operands[0]).dims.at(op.attrs.axis)};
      return;
    default: break;
  }
  if (scalar_result) {
    // Uniform scalar math: every thread computes it.
    if (op.code == OpCode::Take) {  // of a rank-1 tile: one element of its shared-memory copy
      regs_[op.result()] = {eval_at(op.operands[0], {scalar(op.operands[1])})};
      return;
    }
    if (op.code == OpCode::Constant) {
      regs_[op.result()] = {eval_at(op.result(), {})};
      return;
    }
    std::vector<llvm::Value*> args;
    for (const ir::Value* o : op.operands) args.push_back(scalar(o));
    regs_[op.result()] = {element_op(op, args)};
    return;
  }
  // Tiles: rematerialized and view values are evaluated where used; data values are computed now.
  ValueClass c = cls(op.result());
  if (c == ValueClass::Remat || c == ValueClass::View) return;
  if (auto absorbed = accumulators_.dot_of_add.find(&op); absorbed != accumulators_.dot_of_add.end()) {
    regs_[op.result()] = regs_.at(absorbed->second->result());  // the dot accumulated into its operand
    return;
  }
  if (ir::is_elementwise(op.code)) {
    lower_data_elementwise(op);
    return;
  }
  throw InternalError(fmt::format("no GPU lowering for data op {}", ir::opcode_name(op.code)));
}

void KernelLowering::lower_data_elementwise(const ir::Op& op) {
  const Layout& l = layout(op.result());
  std::vector<Regs> in;
  for (const ir::Value* o : op.operands) in.push_back(get_in_layout(o, l));
  Regs out(l.regs_per_thread());
  for (int r = 0; r < l.regs_per_thread(); ++r) {
    std::vector<llvm::Value*> args;
    for (auto& x : in) args.push_back(x[r]);
    out[r] = element_op(op, args);
  }
  regs_[op.result()] = std::move(out);
}

// ---- coordinates --------------------------------------------------------------------------------

Coords KernelLowering::coords_of(const Layout& l, int r) {
  switch (l.kind) {
    case Layout::Kind::Uniform: return {};
    case Layout::Kind::Blocked: {
      const int64_t per_pass = int64_t{l.num_threads} * l.vec, pass = r / l.vec, lane_el = r % l.vec;
      int64_t covered = per_pass * ((l.regs_per_thread() + l.vec - 1) / l.vec);
      llvm::Value* lin_t = b_.CreateMul(tid_, i32(l.vec));
      if (covered > l.numel()) lin_t = b_.CreateURem(lin_t, i32(l.numel()));  // replicated tile
      if (l.shape.size() == 1) return {b_.CreateAdd(lin_t, i32(pass * per_pass + lane_el))};
      const int64_t n = l.shape[1];
      // Split the thread's part once and add the register's part per axis, so that the coordinates of
      // consecutive registers visibly differ by constants (LLVM then merges their shared-memory
      // accesses into vector ones). This is exact when a pass covers whole rows or divides a row.
      llvm::Value* row_t = b_.CreateUDiv(lin_t, i32(n));
      llvm::Value* col_t = b_.CreateURem(lin_t, i32(n));
      if (covered <= l.numel() && per_pass % n == 0)
        return {b_.CreateAdd(row_t, i32(pass * (per_pass / n))), b_.CreateAdd(col_t, i32(lane_el))};
      if (covered <= l.numel() && n % per_pass == 0) {
        int64_t passes_per_row = n / per_pass;
        return {b_.CreateAdd(row_t, i32(pass / passes_per_row)),
                b_.CreateAdd(col_t, i32((pass % passes_per_row) * per_pass + lane_el))};
      }
      llvm::Value* lin = b_.CreateAdd(lin_t, i32(pass * per_pass + lane_el));
      if (covered > l.numel()) lin = b_.CreateURem(lin, i32(l.numel()));
      return {b_.CreateUDiv(lin, i32(n)), b_.CreateURem(lin, i32(n))};
    }
    case Layout::Kind::Mma: {
      auto rc = l.register_coords(r);
      const MmaWarp w = mma_warp(l);
      llvm::Value* lane = b_.CreateURem(tid_, i32(32));
      llvm::Value* row = b_.CreateAdd(w.row0, b_.CreateUDiv(lane, i32(4)));
      llvm::Value* col = b_.CreateAdd(w.col0, b_.CreateMul(b_.CreateURem(lane, i32(4)), i32(2)));
      return {b_.CreateAdd(row, i32(rc[0])), b_.CreateAdd(col, i32(rc[1]))};
    }
    case Layout::Kind::Fused: break;  // held by no thread: evaluated inside its reductions
  }
  throw InternalError("bad layout");
}

KernelLowering::MmaWarp KernelLowering::mma_warp(const Layout& l) {
  llvm::Value* warp = b_.CreateUDiv(tid_, i32(32));
  MmaWarp w;
  if (l.warpgroups) {
    w.m = b_.CreateURem(warp, i32(l.wm));
    w.n = b_.CreateURem(b_.CreateUDiv(warp, i32(l.wm)), i32(l.wn));
    w.row0 = b_.CreateMul(w.m, i32(16));
  } else {
    w.n = b_.CreateURem(warp, i32(l.wn));
    w.m = b_.CreateURem(b_.CreateUDiv(warp, i32(l.wn)), i32(l.wm));
    w.row0 = b_.CreateMul(w.m, i32(l.shape[0] / l.wm));
  }
  w.col0 = b_.CreateMul(w.n, i32(l.shape[1] / l.wn));
  return w;
}

llvm::Value* KernelLowering::is_owner(const Layout& l, int r) {
  switch (l.kind) {
    case Layout::Kind::Uniform: return b_.CreateICmpEQ(tid_, i32(0));
    case Layout::Kind::Blocked: {
      int64_t reg_off = l.register_coords(r)[0];
      return b_.CreateICmpULT(b_.CreateAdd(b_.CreateMul(tid_, i32(l.vec)), i32(reg_off)), i32(l.numel()));
    }
    case Layout::Kind::Mma: return b_.CreateICmpULT(tid_, i32(int64_t{l.wm} * l.wn * 32));
    case Layout::Kind::Fused: break;
  }
  throw InternalError("bad layout");
}

Regs KernelLowering::get_in_layout(const ir::Value* v, const Layout& l) {
  if (v->type.is_scalar()) {
    llvm::Value* s = scalar(v);
    return Regs(l.regs_per_thread(), s);
  }
  if (cls(v) == ValueClass::Data && layout(v) == l && !pipelined(v)) return regs_.at(v);
  if (auto transposed = transpose_by_ldmatrix(v, l)) return *transposed;
  if (cls(v) == ValueClass::Remat && reads_transpose_by_ldmatrix(v, l)) {
    // Math on such a transpose, operand by operand over the layout's registers (element by element,
    // eval_at would read the transpose one element at a time).
    std::vector<Regs> in;
    for (const ir::Value* o : v->def->operands) in.push_back(get_in_layout(o, l));
    Regs out(l.regs_per_thread());
    for (int r = 0; r < l.regs_per_thread(); ++r) {
      std::vector<llvm::Value*> args;
      for (auto& x : in) args.push_back(x[r]);
      out[r] = element_op(*v->def, args);
    }
    return out;
  }
  // Read from its swizzled buffer (spilled, or a pipelined load's stage) a run at a time.
  if (const int run = cls(v) == ValueClass::Data ? swizzled_run(v, l) : 1; run > 1) return read_runs(v, l, run);
  Regs out(l.regs_per_thread());
  for (int r = 0; r < l.regs_per_thread(); ++r) out[r] = eval_at(v, coords_of(l, r));
  return out;
}

llvm::Value* KernelLowering::eval_at(const ir::Value* v, const Coords& c) {
  if (v->type.is_scalar() && v->def && v->def->code != OpCode::Constant) return scalar(v);
  if (v->type.is_scalar() && !v->def) return scalar(v);
  ValueClass vc = v->type.is_scalar() ? ValueClass::Scalar : cls(v);
  if (vc == ValueClass::Data) return smem_read(v, c);  // spilled, or a pipelined load's stage
  const ir::Op& op = *v->def;
  switch (op.code) {
    case OpCode::Constant: {
      DType t = v->type.dtype;
      if (is_float(t)) return llvm::ConstantFP::get(llvm_type(t), op.attrs.fvalue);
      return llvm::ConstantInt::get(llvm_type(t), op.attrs.ivalue, true);
    }
    case OpCode::Iota: return c.at(0);
    case OpCode::Splat: return scalar(op.operands[0]);
    case OpCode::ExpandDims:
    case OpCode::Broadcast:
    case OpCode::Reshape:
    case OpCode::Transpose:
    case OpCode::Take:
    case OpCode::Slice:
    case OpCode::Concat:
    case OpCode::Place: return eval_view(op, c);
    default: break;
  }
  if (ir::is_elementwise(op.code)) {
    std::vector<llvm::Value*> args;
    for (const ir::Value* o : op.operands) args.push_back(eval_at(o, c));
    return element_op(op, args);
  }
  throw InternalError(fmt::format("cannot rematerialize {}", ir::opcode_name(op.code)));
}

// ---- elementwise math ---------------------------------------------------------------------------

llvm::Value* KernelLowering::convert(llvm::Value* x, DType from, DType to) {
  if (from == to) return x;
  llvm::Type* ty = llvm_type(to);
  if (to == DType::i1) {
    if (is_float(from)) return b_.CreateFCmpUNE(x, llvm::ConstantFP::get(x->getType(), 0.0));
    return b_.CreateICmpNE(x, llvm::ConstantInt::get(x->getType(), 0));
  }
  if (is_float(from) && is_float(to)) {
    if (dtype_bytes(to) > dtype_bytes(from)) return b_.CreateFPExt(x, ty);
    if ((from == DType::bf16 && to == DType::f16) || (from == DType::f16 && to == DType::bf16))
      return b_.CreateFPTrunc(b_.CreateFPExt(x, b_.getFloatTy()), ty);
    return b_.CreateFPTrunc(x, ty);
  }
  if (is_float(from)) return b_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {ty, x->getType()}, {x});
  if (is_float(to)) return from == DType::i1 ? b_.CreateUIToFP(x, ty) : b_.CreateSIToFP(x, ty);
  if (from == DType::i1) return b_.CreateZExt(x, ty);
  return b_.CreateSExtOrTrunc(x, ty);
}

llvm::Value* KernelLowering::element_op(const ir::Op& op, const std::vector<llvm::Value*>& args) {
  const DType t = op.operands.empty() ? op.result()->type.dtype : op.operands.back()->type.dtype;
  auto f32 = b_.getFloatTy();
  // 16-bit floats compute in f32 and round once, as the interpreter does.
  auto widen = [&](llvm::Value* x) { return (t == DType::bf16 || t == DType::f16) ? b_.CreateFPExt(x, f32) : x; };
  auto narrow = [&](llvm::Value* x) {
    return (t == DType::bf16 || t == DType::f16) ? b_.CreateFPTrunc(x, llvm_type(t)) : x;
  };
  auto ex2 = [&](llvm::Value* x) {
    if (x->getType() == f32) return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_ex2_approx_ftz, {f32}, {x});
    return b_.CreateIntrinsic(llvm::Intrinsic::exp2, {x->getType()}, {x});
  };
  auto lg2 = [&](llvm::Value* x) {
    if (x->getType() == f32) return b_.CreateIntrinsic(llvm::Intrinsic::nvvm_lg2_approx_ftz_f, {}, {x});
    return b_.CreateIntrinsic(llvm::Intrinsic::log2, {x->getType()}, {x});
  };
  auto fconst = [&](llvm::Value* like, double c) { return llvm::ConstantFP::get(like->getType(), c); };
  constexpr double kLog2e = 1.4426950408889634, kLn2 = 0.6931471805599453;
  switch (op.code) {
    case OpCode::Cast: return convert(args[0], op.operands[0]->type.dtype, op.attrs.dtype);
    case OpCode::Select: return b_.CreateSelect(args[0], args[1], args[2]);
    case OpCode::And: return b_.CreateAnd(args[0], args[1]);
    case OpCode::Or: return b_.CreateOr(args[0], args[1]);
    case OpCode::Not: return b_.CreateNot(args[0]);
    case OpCode::Cmp: {
      if (is_float(t)) {
        static constexpr llvm::CmpInst::Predicate fp[] = {llvm::CmpInst::FCMP_OLT, llvm::CmpInst::FCMP_OLE,
                                                          llvm::CmpInst::FCMP_OGT, llvm::CmpInst::FCMP_OGE,
                                                          llvm::CmpInst::FCMP_OEQ, llvm::CmpInst::FCMP_UNE};
        return b_.CreateFCmp(fp[static_cast<int>(op.attrs.pred)], args[0], args[1]);
      }
      static constexpr llvm::CmpInst::Predicate ip[] = {llvm::CmpInst::ICMP_SLT, llvm::CmpInst::ICMP_SLE,
                                                        llvm::CmpInst::ICMP_SGT, llvm::CmpInst::ICMP_SGE,
                                                        llvm::CmpInst::ICMP_EQ, llvm::CmpInst::ICMP_NE};
      return b_.CreateICmp(ip[static_cast<int>(op.attrs.pred)], args[0], args[1]);
    }
    default: break;
  }
  if (is_int(t)) {
    switch (op.code) {
      case OpCode::Add: return b_.CreateAdd(args[0], args[1]);
      case OpCode::Sub: return b_.CreateSub(args[0], args[1]);
      case OpCode::Mul: return b_.CreateMul(args[0], args[1]);
      case OpCode::Div: return b_.CreateSDiv(args[0], args[1]);
      case OpCode::Rem: return b_.CreateSRem(args[0], args[1]);
      case OpCode::Max: return b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, args[0], args[1]);
      case OpCode::Min: return b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, args[0], args[1]);
      case OpCode::Neg: return b_.CreateNeg(args[0]);
      case OpCode::Abs: return b_.CreateBinaryIntrinsic(llvm::Intrinsic::abs, args[0], b_.getFalse());
      default: break;
    }
    throw UserError(op.loc, fmt::format("{} on integers has no GPU lowering", ir::dsl_spelling(op)));
  }
  llvm::Value* x = widen(args[0]);
  llvm::Value* y = args.size() > 1 ? widen(args[1]) : nullptr;
  llvm::Value* r = nullptr;
  switch (op.code) {
    case OpCode::Add: r = b_.CreateFAdd(x, y); break;
    case OpCode::Sub: r = b_.CreateFSub(x, y); break;
    case OpCode::Mul: r = b_.CreateFMul(x, y); break;
    case OpCode::Div: r = b_.CreateFDiv(x, y); break;
    case OpCode::Rem: r = b_.CreateFRem(x, y); break;
    case OpCode::Max: r = b_.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, x, y); break;
    case OpCode::Min: r = b_.CreateBinaryIntrinsic(llvm::Intrinsic::minnum, x, y); break;
    case OpCode::Pow: r = ex2(b_.CreateFMul(y, lg2(x))); break;
    case OpCode::Neg: r = b_.CreateFNeg(x); break;
    case OpCode::Exp: r = ex2(b_.CreateFMul(x, fconst(x, kLog2e))); break;
    case OpCode::Exp2: r = ex2(x); break;
    case OpCode::Log: r = b_.CreateFMul(lg2(x), fconst(x, kLn2)); break;
    case OpCode::Log2: r = lg2(x); break;
    case OpCode::Sigmoid:
      r = b_.CreateFDiv(fconst(x, 1.0), b_.CreateFAdd(fconst(x, 1.0), ex2(b_.CreateFMul(x, fconst(x, -kLog2e)))));
      break;
    case OpCode::Sqrt: r = b_.CreateIntrinsic(llvm::Intrinsic::sqrt, {x->getType()}, {x}); break;
    case OpCode::Rsqrt:
      r = b_.CreateFDiv(fconst(x, 1.0), b_.CreateIntrinsic(llvm::Intrinsic::sqrt, {x->getType()}, {x}));
      break;
    case OpCode::Abs: r = b_.CreateIntrinsic(llvm::Intrinsic::fabs, {x->getType()}, {x}); break;
    default: throw InternalError(fmt::format("no element lowering for {}", ir::opcode_name(op.code)));
  }
  return narrow(r);
}

// ---- control flow -------------------------------------------------------------------------------

std::vector<llvm::Value*> KernelLowering::emit_counted_loop(
    llvm::Value* lo, llvm::Value* hi, std::vector<llvm::Value*> init,
    const std::function<std::vector<llvm::Value*>(llvm::Value*, const std::vector<llvm::Value*>&)>& body,
    bool rolled) {
  llvm::BasicBlock* pre = b_.GetInsertBlock();
  auto* header = llvm::BasicBlock::Create(ctx_, "loop", fn_);
  auto* body_bb = llvm::BasicBlock::Create(ctx_, "loop.body", fn_);
  auto* exit = llvm::BasicBlock::Create(ctx_, "loop.exit", fn_);
  b_.CreateBr(header);
  b_.SetInsertPoint(header);
  llvm::PHINode* j = b_.CreatePHI(b_.getInt32Ty(), 2);
  j->addIncoming(lo, pre);
  std::vector<llvm::PHINode*> phis;
  std::vector<llvm::Value*> cur;
  for (llvm::Value* v : init) {
    auto* p = b_.CreatePHI(v->getType(), 2);
    p->addIncoming(v, pre);
    phis.push_back(p);
    cur.push_back(p);
  }
  b_.CreateCondBr(b_.CreateICmpSLT(j, hi), body_bb, exit);
  b_.SetInsertPoint(body_bb);
  std::vector<llvm::Value*> next = body(j, cur);
  llvm::BasicBlock* latch = b_.GetInsertBlock();
  j->addIncoming(b_.CreateAdd(j, i32(1)), latch);
  for (size_t i = 0; i < phis.size(); ++i) phis[i]->addIncoming(next[i], latch);
  llvm::BranchInst* back = b_.CreateBr(header);
  if (rolled) {
    llvm::MDNode* disable = llvm::MDNode::get(ctx_, {llvm::MDString::get(ctx_, "llvm.loop.unroll.disable")});
    llvm::MDNode* self = llvm::MDNode::getDistinct(ctx_, {nullptr, disable});
    self->replaceOperandWith(0, self);
    back->setMetadata(llvm::LLVMContext::MD_loop, self);
  }
  b_.SetInsertPoint(exit);
  return cur;
}

void KernelLowering::lower_for(const ir::Op& op) {
  const ir::Block& body = *op.regions[0];
  llvm::Value* lo = scalar(op.operands[0]);
  llvm::Value* hi = scalar(op.operands[1]);
  llvm::Value* step = scalar(op.operands[2]);
  // Carried values enter in the layout of the body's argument; the accumulators of deferred products
  // that enter as zeros enter undefined instead (lower_pipeline.cpp).
  std::vector<Regs> inits;
  for (size_t i = 0; i < op.results.size(); ++i) inits.push_back(get_in_layout(op.operands[3 + i], layout(body.args[i + 1])));
  const LoopPipeline pipe = loop_pipeline(op);
  for (size_t i : pipe.zero_start_carried)
    for (llvm::Value*& r : inits[i]) r = llvm::UndefValue::get(r->getType());
  llvm::Value* runs = pipe.zero_start_carried.empty() ? nullptr : b_.CreateICmpSLT(lo, hi);
  ring_prologue(pipe, body, lo, hi, step);

  llvm::BasicBlock* pre = b_.GetInsertBlock();
  auto* header = llvm::BasicBlock::Create(ctx_, "for", fn_);
  auto* body_bb = llvm::BasicBlock::Create(ctx_, "for.body", fn_);
  auto* exit = llvm::BasicBlock::Create(ctx_, "for.exit", fn_);
  llvm::Instruction* enter = b_.CreateBr(header);
  b_.SetInsertPoint(header);
  llvm::PHINode* iv = b_.CreatePHI(b_.getInt32Ty(), 2, "iv");
  iv->addIncoming(lo, pre);
  regs_[body.args[0]] = {iv};
  std::vector<std::vector<llvm::PHINode*>> phis(op.results.size());
  for (size_t i = 0; i < op.results.size(); ++i) {
    Regs rs;
    for (llvm::Value* init : inits[i]) {
      auto* p = b_.CreatePHI(init->getType(), 2);
      p->addIncoming(init, pre);
      phis[i].push_back(p);
      rs.push_back(p);
    }
    regs_[body.args[i + 1]] = rs;
  }
  b_.CreateCondBr(b_.CreateICmpSLT(iv, hi), body_bb, exit);
  b_.SetInsertPoint(body_bb);
  // The header joins the entry with the back edge. The body is lowered as if it started after a
  // barrier, recording what it accesses before its first barrier on every path (its head); once its
  // end is known, a barrier goes where the head conflicts with what is pending: before the loop (the
  // entry's accesses) or at the end of the body (the previous iteration's). A body that only reads a
  // buffer written before the loop then runs without a barrier of its own.
  SmemHazards at_entry = std::move(hazards_);
  hazards_ = {};
  loop_heads_.push_back(LoopHead{.depth = ++region_depth_, .open = true, .reads = {}, .writes = {}});
  // Inside the loop the thread id is read anew, opaquely: otherwise LLVM hoists every per-element
  // address (all loop-invariant functions of tid) out of the loop, and each then occupies a register
  // for the whole loop (255 registers and spills on the linear-attention kernel). Recomputed in the
  // body they fold into [reg+imm] addressing.
  llvm::Value* outer_tid = tid_;
  auto* read_tid = llvm::InlineAsm::get(llvm::FunctionType::get(b_.getInt32Ty(), false), "mov.u32 $0, %tid.x;",
                                        "=r", /*hasSideEffects=*/true);
  tid_ = b_.CreateCall(read_tid, {});
  for (const ir::Op* dot : pipe.zero_start_dots) first_step_adds_[dot] = b_.CreateZExt(b_.CreateICmpNE(iv, lo), b_.getInt32Ty());
  // The body's waits before the copies ring_head issues for later iterations (ir.h, Wait).
  for (const auto& inner : body.ops)
    if (inner->code == OpCode::Wait) {
      for (const ir::Value* v : inner->operands)
        if (!v->type.is_tensor() && !passes::is_predictable_scalar(v, body))
          throw UserError(inner->loc, "wait_for in a loop body is done at the iteration's head: its offsets and count "
                                      "must come from the loop index and values from outside the loop");
      set_location(inner->loc);
      lower_flag(*inner, [&](const ir::Value* v) { return scalar_at_iteration(v, body, iv); });
      waits_at_loop_heads_.insert(inner.get());
    }
  ring_head(pipe, body, iv, lo, hi, step);
  for (size_t i = 0; i < op.results.size(); ++i)
    if (smem_.buffers.count(body.args[i + 1])) spill(body.args[i + 1]);
  lower_block(body);
  deferred_products_done(pipe);
  const ir::Op& yield = *body.ops.back();
  set_location(yield.loc);
  std::vector<Regs> next;
  for (size_t i = 0; i < op.results.size(); ++i) next.push_back(get_in_layout(yield.operands[i], layout(body.args[i + 1])));
  const LoopHead head = std::move(loop_heads_.back());
  loop_heads_.pop_back();
  if (hazards_.conflicts(head.reads, head.writes)) barrier();  // at the end of the body, before the back edge
  --region_depth_;
  if (at_entry.conflicts(head.reads, head.writes)) {
    llvm::IRBuilder<> before_loop(enter);
    emit_block_barrier(before_loop);
    at_entry = {};
  }
  llvm::BasicBlock* latch = b_.GetInsertBlock();
  iv->addIncoming(b_.CreateAdd(iv, step), latch);
  for (size_t i = 0; i < op.results.size(); ++i)
    for (size_t r = 0; r < phis[i].size(); ++r) phis[i][r]->addIncoming(next[i][r], latch);
  b_.CreateBr(header);
  b_.SetInsertPoint(exit);
  hazards_.merge(at_entry);  // the exit is reached from the entry (no iteration) or from the end of the body
  async_proxy_fenced_ = false;
  tid_ = outer_tid;
  pipeline_exit(pipe);
  for (size_t i = 0; i < op.results.size(); ++i) {
    const Regs& rs = regs_.at(body.args[i + 1]);
    regs_[op.results[i]] = pipe.zero_start_carried.count(i) ? zero_where_no_iteration(rs, runs) : rs;
  }
}

void KernelLowering::lower_if(const ir::Op& op) {
  llvm::Value* cond = scalar(op.operands[0]);
  auto* then_bb = llvm::BasicBlock::Create(ctx_, "if.then", fn_);
  auto* else_bb = llvm::BasicBlock::Create(ctx_, "if.else", fn_);
  auto* merge = llvm::BasicBlock::Create(ctx_, "if.end", fn_);
  b_.CreateCondBr(cond, then_bb, else_bb);
  std::vector<std::pair<std::vector<Regs>, llvm::BasicBlock*>> arms;
  llvm::BasicBlock* blocks[] = {then_bb, else_bb};
  ++region_depth_;  // a barrier in one arm is not on every path
  for (size_t a = 0; a < 2; ++a) {
    b_.SetInsertPoint(blocks[a]);
    assume_smem_hazards();
    std::vector<Regs> vals;
    if (a < op.regions.size()) {
      const ir::Block& region = *op.regions[a];
      lower_block(region);
      const ir::Op& yield = *region.ops.back();
      for (size_t i = 0; i < op.results.size(); ++i) vals.push_back(get_in_layout(yield.operands[i], layout(op.results[i])));
    }
    arms.push_back({vals, b_.GetInsertBlock()});
    b_.CreateBr(merge);
  }
  --region_depth_;
  b_.SetInsertPoint(merge);
  assume_smem_hazards();
  for (size_t i = 0; i < op.results.size(); ++i) {
    Regs rs;
    for (size_t r = 0; r < arms[0].first[i].size(); ++r) {
      auto* p = b_.CreatePHI(arms[0].first[i][r]->getType(), 2);
      p->addIncoming(arms[0].first[i][r], arms[0].second);
      p->addIncoming(arms[1].first[i][r], arms[1].second);
      rs.push_back(p);
    }
    regs_[op.results[i]] = rs;
  }
}

}  // namespace linac::nvptx
