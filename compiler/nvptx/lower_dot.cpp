// dot on tensor cores: operands in shared memory (row-major, padded rows), fragments loaded with
// ldmatrix (.trans where the stored orientation is the other one), mma.sync m16n8k16 with f32
// accumulators in the mma layout. On sm_90a, the dots the shared-memory plan puts on warpgroups
// (passes::WgmmaDot) run as wgmma.mma_async m64nNk16 instead: B (and optionally A) read by the tensor
// cores from swizzled buffers through matrix descriptors (docs/hopper.md).
//
// f32 operands: in kernels marked tensor_core_f32, on the tensor cores as three tf32 products
// (mma.sync m16n8k8): with x = x_big + x_small, x_big the truncation of x to tf32 (11 significant
// bits: the low 13 bits of the fp32 pattern cleared) and x_small that of the exact rest x - x_big,
// a b ~ a_small b_big + a_big b_small + a_big b_big leaves out a_small b_small and the truncations of
// the small parts (together under 2^-18 of |a| |b|, about what an fp32 FMA loop over 64 terms may
// lose): fp32-level accuracy, where one tf32 product (2^-11) would not be. Truncating is one AND and
// keeps every non-finite value non-finite; cvt.rna.tf32.f32 (rounding) compiles to several SASS
// instructions (FSETP, FSEL, the rounding), and dropping it took 30% of the instructions the UT
// transform's kernel executes (docs/ops/delta_rule.md, "Measured"). Their fragments are read
// element by element from the shared copies, in a loop over the 8-wide steps (unrolled, the reads of
// all steps were scheduled first and fp32 walks spilled up to 900 bytes). Elsewhere (and where the
// result is not in the mma layout) the slower path: FMA loops over the shared copies. Opt-in, because
// in kernels full of fp32 state products the split fragments still cost spills (4-byte spills in
// three kernels under ptxas even with the loop).
//
// A result with fewer 16 x 8 tiles than the program has warps (gla's 16 x 16 sub-chunk blocks on 8
// warps) leaves the warps past wm x wn holding copies; rather than each copy running the whole K loop,
// the plan splits K among them (passes::dot_split_k) and the partials meet through scratch
// (sum_split_partials).
#include <fmt/format.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include <array>
#include <utility>

#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

using ir::OpCode;
using passes::Layout;
using passes::ValueClass;

namespace {

/// tf32x3 products keep each term in its own accumulators where a warp has at most this many
/// accumulator registers (see lower_dot).
constexpr int64_t kTf32x3SeparateTermsMaxRegs = 16;

/// Where an operand lives in shared memory: element (i, j) of the operand is buf[i + row0][j + col0],
/// or buf[j + row0][i + col0] when transposed.
struct SmemOperand {
  const ir::Value* buf;  // the value whose shared-memory buffer holds the operand
  bool transposed;
  int64_t row0 = 0, col0 = 0;
};

}  // namespace

void KernelLowering::lower_dot(const ir::Op& op) {
  // An operand with a buffer of its own is read there; transposes and slices of a data tile without
  // one are read in place from the tile's buffer (passes::dot_operand_in_place, as the plan decided).
  auto operand = [&](const ir::Value* v) -> SmemOperand {
    if (!smem_.buffers.count(v))
      if (auto p = passes::dot_operand_in_place(v, smem_.classes)) return {p->buf, p->transposed, p->row0, p->col0};
    return {v, false};
  };
  // The address of element (row, col) of the operand as stored (row and col already swapped when it
  // is transposed).
  auto stored_addr = [&](const SmemOperand& o, llvm::Value* row, llvm::Value* col) {
    if (o.row0) row = b_.CreateAdd(row, i32(o.row0));
    if (o.col0) col = b_.CreateAdd(col, i32(o.col0));
    return smem_addr(o.buf, {row, col});
  };
  // A from the registers that hold it (passes::dot_a_in_registers): no shared-memory copy to read.
  const bool a_in_registers = smem_.dots_a_in_registers.count(&op) > 0;
  SmemOperand a = a_in_registers ? SmemOperand{nullptr, false} : operand(op.operands[0]), b = operand(op.operands[1]);
  const int64_t M = op.operands[0]->type.shape[0], K = op.operands[0]->type.shape[1];
  const int64_t N = op.operands[1]->type.shape[1];
  const DType in = op.operands[0]->type.dtype;
  const Layout& l = layout(op.result());
  auto f32 = b_.getFloatTy();

  const auto wgmma = smem_.wgmma_dots.find(&op);
  if (wgmma != smem_.wgmma_dots.end()) {
    // The tensor cores read B through the async proxy: every thread's writes of shared memory (generic
    // proxy: stores, and cp.async copies once waited for) are ordered before them by a proxy fence in
    // that thread, then a barrier; the copies in flight into the operands' buffers (and those issued
    // before them) are waited for before the fence. Not again where nothing was written since the last
    // such barrier (a pipelined loop's, lower_for).
    std::vector<ByteRange> operands{smem_range(b.buf)};
    if (!a_in_registers) operands.push_back(smem_range(a.buf));
    if (const size_t groups = prefetched_groups_touched(operands, {})) await_prefetched_copies(groups);
    if (!async_proxy_fenced_ || !hazards_.written.empty() || hazards_.unknown) fenced_barrier();
  }
  if (a_in_registers) before_smem_access({smem_range(b.buf)}, {});
  else before_smem_access({smem_range(a.buf), smem_range(b.buf)}, {});
  auto read = [&](const SmemOperand& o, llvm::Value* i, llvm::Value* j) {
    return b_.CreateLoad(llvm_type(o.buf->type.dtype), o.transposed ? stored_addr(o, j, i) : stored_addr(o, i, j));
  };

  // Where the dot absorbs `acc + dot` (passes::find_dot_accumulators), its accumulators start at acc.
  const auto absorbed = accumulators_.acc_of_dot.find(&op);
  const bool accumulate = absorbed != accumulators_.acc_of_dot.end();
  // Split along K (passes::dot_split_k): this warp's slice is [k_begin, k_begin + K / slices); the sum
  // starts from acc in slice 0 only.
  const auto split = smem_.split_dots.find(&op);
  const int slices = split == smem_.split_dots.end() ? 1 : split->second;
  llvm::Value* slice = slices > 1 ? b_.CreateURem(b_.CreateUDiv(tid_, i32(int64_t{l.wm} * l.wn * 32)), i32(slices)) : nullptr;
  llvm::Value* k_begin = slices > 1 ? b_.CreateMul(slice, i32(K / slices)) : i32(0);
  auto initial_accumulators = [&] {
    Regs zeros(l.regs_per_thread(), llvm::ConstantFP::get(f32, 0.0));
    if (!accumulate) return zeros;
    Regs acc = get_in_layout(absorbed->second, l);
    if (slices > 1)
      for (size_t r = 0; r < acc.size(); ++r) acc[r] = b_.CreateSelect(b_.CreateICmpEQ(slice, i32(0)), acc[r], zeros[r]);
    return acc;
  };

  const bool tensor_cores = (in == DType::bf16 || in == DType::f16) && l.kind == Layout::Kind::Mma && K % 16 == 0;
  const bool tf32x3 = k_.tensor_core_f32 && in == DType::f32 && l.kind == Layout::Kind::Mma && K % 8 == 0;
  if (!tensor_cores && !tf32x3) {
    // The slower path: each thread computes its accumulator elements with an FMA loop over K.
    Layout out_l = l;
    int n = out_l.regs_per_thread();
    std::vector<Coords> cs;
    for (int r = 0; r < n; ++r) cs.push_back(coords_of(out_l, r));
    std::vector<llvm::Value*> init = initial_accumulators();
    auto accs = emit_counted_loop(i32(0), i32(K), init, [&](llvm::Value* kk, const std::vector<llvm::Value*>& cur) {
      std::vector<llvm::Value*> next(n);
      for (int r = 0; r < n; ++r) {
        llvm::Value* x = b_.CreateFPExt(read(a, cs[r][0], kk), f32);
        llvm::Value* y = b_.CreateFPExt(read(b, kk, cs[r][1]), f32);
        next[r] = b_.CreateIntrinsic(llvm::Intrinsic::fma, {f32}, {x, y, cur[r]});
      }
      return next;
    });
    regs_[op.result()] = accs;
    return;
  }

  // Tensor cores. Each warp owns mt x nt tiles of 16 x 8 in the columns [n_base, n_base + N/wn): the
  // 16-row tiles from m_base on, one after the other or wm tiles apart (layout.h).
  const int64_t mt = M / l.wm / 16, nt = N / l.wn / 8;
  llvm::Value* lane = b_.CreateURem(tid_, i32(32));
  const MmaWarp w = mma_warp(l);
  llvm::Value *m_base = w.row0, *n_base = w.col0;
  auto tile_row = [&](int64_t tm) { return b_.CreateAdd(m_base, i32(tm * 16 * (l.warpgroups ? l.wm : 1))); };
  if (tf32x3) {
    // m16n8k8 fragments (g = lane / 4, t = lane % 4): a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
    // of the 16x8 A tile; b0 (t, g), b1 (t+4, g) of the 8x8 B tile; the accumulators as in m16n8k16.
    llvm::Value* g = b_.CreateUDiv(lane, i32(4));
    llvm::Value* t = b_.CreateURem(lane, i32(4));
    auto to_tf32 = [&](llvm::Value* x) { return b_.CreateAnd(b_.CreateBitCast(x, b_.getInt32Ty()), i32(~0x1fff)); };
    auto split = [&](llvm::Value* x) -> std::pair<llvm::Value*, llvm::Value*> {
      llvm::Value* big = to_tf32(x);
      return {big, to_tf32(b_.CreateFSub(x, b_.CreateBitCast(big, f32)))};
    };
    // Where a warp's accumulators are few (small products, e.g. the UT transform's 16 x 16 blocks), a
    // set per term: three independent chains of K/8 products instead of one of 3K/8, the small terms
    // summed apart from the large one (not lost against it) and added to it once at the end, big +
    // (small_1 + small_2). Larger products keep one set, the small terms first for the same reason
    // (three sets spilled in poly's products).
    const int64_t n_acc = mt * nt * 4;
    const int sets = n_acc <= kTf32x3SeparateTermsMaxRegs ? 3 : 1;
    std::vector<llvm::Value*> init = initial_accumulators();
    init.resize(sets * n_acc, llvm::ConstantFP::get(f32, 0.0));
    auto step = [&](llvm::Value* ks, const std::vector<llvm::Value*>& cur) {
      std::vector<llvm::Value*> acc = cur;
      llvm::Value* k_lo = b_.CreateAdd(b_.CreateMul(ks, i32(8)), t);
      llvm::Value* k_hi = b_.CreateAdd(k_lo, i32(4));
      std::vector<std::array<std::pair<llvm::Value*, llvm::Value*>, 4>> af(mt);
      for (int64_t tm = 0; tm < mt; ++tm) {
        llvm::Value* r0 = b_.CreateAdd(tile_row(tm), g);
        llvm::Value* r1 = b_.CreateAdd(r0, i32(8));
        af[tm] = {split(read(a, r0, k_lo)), split(read(a, r1, k_lo)), split(read(a, r0, k_hi)), split(read(a, r1, k_hi))};
      }
      std::vector<std::array<std::pair<llvm::Value*, llvm::Value*>, 2>> bf(nt);
      for (int64_t tn = 0; tn < nt; ++tn) {
        llvm::Value* n = b_.CreateAdd(n_base, b_.CreateAdd(i32(tn * 8), g));
        bf[tn] = {split(read(b, k_lo, n)), split(read(b, k_hi, n))};
      }
      for (int64_t tm = 0; tm < mt; ++tm)
        for (int64_t tn = 0; tn < nt; ++tn) {
          int64_t base = (tm * nt + tn) * 4;
          // Term 0: a_small b_big, 1: a_big b_small, 2: a_big b_big.
          for (int term = 0; term < 3; ++term) {
            auto pick_a = [&](int q) { return term == 0 ? af[tm][q].second : af[tm][q].first; };
            auto pick_b = [&](int q) { return term == 1 ? bf[tn][q].second : bf[tn][q].first; };
            const int64_t at = base + (sets == 3 ? 2 - term : 0) * n_acc;
            std::vector<llvm::Value*> args = {pick_a(0), pick_a(1), pick_a(2), pick_a(3), pick_b(0), pick_b(1),
                                              acc[at], acc[at + 1], acc[at + 2], acc[at + 3]};
            llvm::Value* d = b_.CreateIntrinsic(llvm::Intrinsic::nvvm_mma_m16n8k8_row_col_tf32, {}, args);
            for (int q = 0; q < 4; ++q) acc[at + q] = b_.CreateExtractValue(d, q);
          }
        }
      return acc;
    };
    llvm::Value* first_step = b_.CreateUDiv(k_begin, i32(8));
    std::vector<llvm::Value*> acc = emit_counted_loop(first_step, b_.CreateAdd(first_step, i32(K / 8 / slices)), init, step);
    if (sets == 3) {
      for (int64_t i = 0; i < n_acc; ++i) acc[i] = b_.CreateFAdd(acc[i], b_.CreateFAdd(acc[n_acc + i], acc[2 * n_acc + i]));
      acc.resize(n_acc);
    }
    regs_[op.result()] = slices > 1 ? sum_split_partials(l, slices, acc) : acc;
    return;
  }
  llvm::Value* l8 = b_.CreateURem(lane, i32(8));
  llvm::Value* j = b_.CreateUDiv(lane, i32(8));  // which 8x8 matrix this lane addresses
  llvm::Value* j_lo = b_.CreateURem(j, i32(2));
  llvm::Value* j_hi = b_.CreateUDiv(j, i32(2));
  auto i32s = [&](llvm::Value* agg, int n) {
    std::vector<llvm::Value*> out;
    for (int q = 0; q < n; ++q) out.push_back(b_.CreateExtractValue(agg, q));
    return out;
  };
  auto ldmatrix = [&](const SmemOperand& o, llvm::Value* row, llvm::Value* col, bool trans, int count) {
    llvm::Value* addr = stored_addr(o, row, col);
    llvm::Intrinsic::ID id;
    if (count == 4)
      id = trans ? llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_trans_b16
                 : llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_b16;
    else
      id = trans ? llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x2_trans_b16
                 : llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x2_b16;
    return i32s(b_.CreateIntrinsic(id, {addr->getType()}, {addr}), count);
  };

  std::vector<llvm::Value*> acc = initial_accumulators();
  // The depth of the step at k0 of this warp's slice.
  auto k_at = [&](int64_t k0) { return slices > 1 ? b_.CreateAdd(k_begin, i32(k0)) : i32(k0); };
  // A held in the mma layout: register 4 (tm * K/8 + j) + q is element (row g + 8 (q / 2), column
  // 8 j + 2 t + q % 2) of the warp's 16-row tile tm (passes::Layout::register_coords).
  // (Math on views is evaluated here, at every register's coordinates, before the steps.)
  const Regs a_regs = a_in_registers ? get_in_layout(op.operands[0], layout(op.operands[0])) : Regs{};
  auto pack = [&](llvm::Value* lo, llvm::Value* hi) {
    auto* pair = llvm::FixedVectorType::get(lo->getType(), 2);
    llvm::Value* v = b_.CreateInsertElement(llvm::PoisonValue::get(pair), lo, uint64_t{0});
    return b_.CreateBitCast(b_.CreateInsertElement(v, hi, uint64_t{1}), b_.getInt32Ty());
  };
  // A's fragments of the 16-deep step at k0, one per 16-row tile of this warp: a0 rows 0-7/k 0-7, a1
  // rows 8-15/k 0-7, a2 rows 0-7/k 8-15, a3 rows 8-15/k 8-15 (as mma.sync and wgmma take them).
  auto a_fragments = [&](int64_t k0) {
    std::vector<std::vector<llvm::Value*>> afrag(mt);
    for (int64_t tm = 0; tm < mt; ++tm) {
      if (a_in_registers) {  // the 8-column tiles k0/8 and k0/8 + 1: (a0, a1) and (a2, a3)
        const size_t lo = static_cast<size_t>((tm * (K / 8) + k0 / 8) * 4), hi = lo + 4;
        afrag[tm] = {pack(a_regs[lo], a_regs[lo + 1]), pack(a_regs[lo + 2], a_regs[lo + 3]),
                     pack(a_regs[hi], a_regs[hi + 1]), pack(a_regs[hi + 2], a_regs[hi + 3])};
        continue;
      }
      llvm::Value* m0 = tile_row(tm);
      if (!a.transposed) {
        // Stored [m][k]: lane l addresses row m0 + l%16 at column k0 + (l/16)*8.
        llvm::Value* row = b_.CreateAdd(m0, b_.CreateURem(lane, i32(16)));
        llvm::Value* col = b_.CreateAdd(k_at(k0), b_.CreateMul(b_.CreateUDiv(lane, i32(16)), i32(8)));
        afrag[tm] = ldmatrix(a, row, col, false, 4);
      } else {
        // Stored [k][m]: matrix j covers m0 + (j%2)*8, k0 + (j/2)*8, read transposed.
        llvm::Value* row = b_.CreateAdd(k_at(k0), b_.CreateAdd(l8, b_.CreateMul(j_hi, i32(8))));
        llvm::Value* col = b_.CreateAdd(m0, b_.CreateMul(j_lo, i32(8)));
        afrag[tm] = ldmatrix(a, row, col, true, 4);
      }
    }
    return afrag;
  };
  if (wgmma != smem_.wgmma_dots.end()) {
    // The first row of this warpgroup's 64 in tile tm: its warps are 4 consecutive along M.
    llvm::Value* wg_base = b_.CreateMul(b_.CreateUDiv(w.m, i32(4)), i32(64));
    auto wg_row = [&](int64_t tm) { return b_.CreateAdd(wg_base, i32(tm * 16 * l.wm)); };
    regs_[op.result()] = lower_wgmma(wgmma->second, in, K, N / l.wn, mt, n_base, wg_row, acc, accumulate, a_fragments,
                                     /*wait=*/!smem_.deferred_waits.count(&op) && !smem_.first_use_waits.count(&op),
                                     first_step_adds_.count(&op) ? first_step_adds_.at(&op) : nullptr);
    if (smem_.first_use_waits.count(&op)) pending_products_.push_back({{op.result()}, wgmma_groups_ - 1});
    return;
  }
  const auto mma_id = in == DType::bf16 ? llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_bf16
                                        : llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_f32_f32;
  // The f16 form takes its fragments as <2 x half>; the bf16 form as i32.
  auto frag = [&](llvm::Value* x) {
    return in == DType::f16 ? b_.CreateBitCast(x, llvm::FixedVectorType::get(b_.getHalfTy(), 2)) : x;
  };
  for (int64_t k0 = 0; k0 < K / slices; k0 += 16) {
    std::vector<std::vector<llvm::Value*>> afrag = a_fragments(k0);
    // B fragments for pairs of n-tiles: b0 k 0-7, b1 k 8-15 of each.
    std::vector<std::vector<llvm::Value*>> bfrag(nt);
    for (int64_t tn = 0; tn < nt; tn += 2) {
      int count = tn + 1 < nt ? 4 : 2;
      llvm::Value* n0 = b_.CreateAdd(n_base, i32(tn * 8));
      std::vector<llvm::Value*> regs;
      if (!b.transposed) {
        // Stored [k][n]: matrix j covers k0 + (j%2)*8, n0 + (j/2)*8, read transposed.
        llvm::Value* row = b_.CreateAdd(k_at(k0), b_.CreateAdd(l8, b_.CreateMul(j_lo, i32(8))));
        llvm::Value* col = b_.CreateAdd(n0, b_.CreateMul(count == 4 ? j_hi : i32(0), i32(8)));
        regs = ldmatrix(b, row, col, true, count);
      } else {
        // Stored [n][k]: matrix j covers n0 + (j/2)*8, k0 + (j%2)*8.
        llvm::Value* row = b_.CreateAdd(n0, b_.CreateAdd(l8, b_.CreateMul(count == 4 ? j_hi : i32(0), i32(8))));
        llvm::Value* col = b_.CreateAdd(k_at(k0), b_.CreateMul(j_lo, i32(8)));
        regs = ldmatrix(b, row, col, false, count);
      }
      bfrag[tn] = {regs[0], regs[1]};
      if (count == 4) bfrag[tn + 1] = {regs[2], regs[3]};
    }
    for (int64_t tm = 0; tm < mt; ++tm)
      for (int64_t tn = 0; tn < nt; ++tn) {
        int64_t base = (tm * nt + tn) * 4;
        std::vector<llvm::Value*> args = {frag(afrag[tm][0]), frag(afrag[tm][1]), frag(afrag[tm][2]),
                                          frag(afrag[tm][3]), frag(bfrag[tn][0]), frag(bfrag[tn][1]),
                                          acc[base], acc[base + 1],
                                          acc[base + 2], acc[base + 3]};
        llvm::Value* d = b_.CreateIntrinsic(mma_id, {}, args);
        for (int q = 0; q < 4; ++q) acc[base + q] = b_.CreateExtractValue(d, q);
      }
  }
  regs_[op.result()] = slices > 1 ? sum_split_partials(l, slices, acc) : acc;
}

std::vector<llvm::Value*> KernelLowering::sum_split_partials(const Layout& l, int slices,
                                                             const std::vector<llvm::Value*>& acc) {
  // Partial r of slice s at scratch[(s * regs + r) * owners + t], t the thread among the wm x wn warps:
  // consecutive lanes at consecutive words.
  const int64_t owners = int64_t{l.wm} * l.wn * 32, regs = static_cast<int64_t>(acc.size());
  const ByteRange range{smem_.scratch_offset, smem_.scratch_offset + passes::split_dot_scratch_bytes(l, slices)};
  llvm::Value* t = b_.CreateURem(tid_, i32(owners));
  llvm::Value* slice = b_.CreateUDiv(tid_, i32(owners));
  auto addr = [&](llvm::Value* s, int64_t r) {
    return scratch_addr(b_.CreateMul(b_.CreateAdd(b_.CreateMul(b_.CreateAdd(b_.CreateMul(s, i32(regs)), i32(r)), i32(owners)), t), i32(4)));
  };
  before_smem_write(range);
  llvm::BasicBlock* st = llvm::BasicBlock::Create(ctx_, "split.partial", fn_);
  llvm::BasicBlock* cont = llvm::BasicBlock::Create(ctx_, "split.cont", fn_);
  b_.CreateCondBr(b_.CreateICmpULT(slice, i32(slices)), st, cont);  // the other copies' partials repeat these
  b_.SetInsertPoint(st);
  for (int64_t r = 0; r < regs; ++r) b_.CreateStore(acc[r], addr(slice, r));
  b_.CreateBr(cont);
  b_.SetInsertPoint(cont);
  before_smem_read(range);
  std::vector<llvm::Value*> sum(regs);
  for (int64_t r = 0; r < regs; ++r) {
    sum[r] = b_.CreateLoad(b_.getFloatTy(), addr(i32(0), r));
    for (int s = 1; s < slices; ++s) sum[r] = b_.CreateFAdd(sum[r], b_.CreateLoad(b_.getFloatTy(), addr(i32(s), r)));
  }
  return sum;
}

std::vector<llvm::Value*> KernelLowering::lower_wgmma(
    const passes::WgmmaDot& d, DType in, int64_t K, int64_t n_wg, int64_t mt, llvm::Value* n_base,
    const std::function<llvm::Value*(int64_t)>& wg_row, std::vector<llvm::Value*> acc, bool accumulate,
    const std::function<std::vector<std::vector<llvm::Value*>>(int64_t)>& a_fragments, bool wait,
    llvm::Value* first_step_adds) {
  // An operand's matrix descriptor at depth 0 for the rows or columns from `mn` (this warpgroup's): the
  // shared address of its first element (passed as 32 bits, the descriptor made in the instruction's
  // PTX: loop-invariant descriptors hoisted out of loops took two registers each), with the swizzle's
  // strides (smem_plan.h). A K-major step lies in one block (LBO unused); MN-major rows or columns go
  // on from block to block, LBO apart. The start is an 8-row boundary: no swizzle term in its address.
  auto start_address = [&](const passes::WgmmaOperand& o, llvm::Value* mn) {
    llvm::Value* m = b_.CreateAdd(mn, i32(o.k_major ? o.row0 : o.col0));
    llvm::Value* kk = i32(o.k_major ? o.col0 : o.row0);
    llvm::Value* addr = o.k_major ? smem_addr(o.buf, {m, kk}) : smem_addr(o.buf, {kk, m});
    return b_.CreateTrunc(b_.CreatePtrToInt(addr, b_.getInt64Ty()), b_.getInt32Ty());
  };
  auto descriptor_fields = [&](const passes::WgmmaOperand& o) {
    const int64_t W = smem_.buffers.at(o.buf).swizzle_bytes;
    const uint64_t mode = W == 128 ? 1 : W == 64 ? 2 : 3;
    const uint64_t lbo = o.k_major ? 16 : static_cast<uint64_t>(o.buf->type.shape[0] * W), sbo = 8 * W;
    return ((lbo >> 4) & 0x3FFF) << 16 | ((sbo >> 4) & 0x3FFF) << 32 | mode << 62;
  };
  // How far the step at depth k0 starts from depth 0, in the descriptor's 16-byte units: a constant
  // (both starts are unswizzled), added inside the instruction's PTX, so that one address per operand
  // stays alive rather than one descriptor per step.
  auto step_units = [&](const passes::WgmmaOperand& o, int64_t k0) {
    const int64_t W = smem_.buffers.at(o.buf).swizzle_bytes, elem = dtype_bytes(o.buf->type.dtype);
    const int64_t block_cols = W / elem, block_bytes = o.buf->type.shape[0] * W;
    auto along_k = [&](int64_t c) { return c / block_cols * block_bytes + c % block_cols * elem; };
    const int64_t bytes = o.k_major ? along_k(o.col0 + k0) - along_k(o.col0) : k0 * W;
    return bytes / 16;
  };

  // wgmma.mma_async m64nNk16: N/2 f32 accumulators per thread (tied in and out); A as four registers
  // or a descriptor; B's descriptor; whether to add to the accumulators (0 on the first step); B
  // transposed when MN-major (and A when MN-major, from shared memory). Inline PTX: LLVM has no
  // intrinsic for it.
  const bool a_smem = d.a.buf != nullptr;
  const int nacc = static_cast<int>(n_wg / 2), na = a_smem ? 1 : 4;
  const char* ty = in == DType::bf16 ? "bf16" : "f16";
  std::string constraints;
  for (int i = 0; i < nacc; ++i) constraints += "=f,";
  constraints += a_smem ? "r,r,r" : "r,r,r,r,r,r";
  for (int i = 0; i < nacc; ++i) constraints += fmt::format(",{}", i);
  auto f32 = b_.getFloatTy();
  std::vector<llvm::Type*> outs(nacc, f32), params;
  if (a_smem) params = {b_.getInt32Ty()};
  else params = {b_.getInt32Ty(), b_.getInt32Ty(), b_.getInt32Ty(), b_.getInt32Ty()};
  params.push_back(b_.getInt32Ty());
  params.push_back(b_.getInt32Ty());
  params.insert(params.end(), nacc, f32);
  auto* fty = llvm::FunctionType::get(llvm::StructType::get(ctx_, outs), params, false);
  // The descriptor of the step `units` 16-byte units from `addr` (a register), into `reg`.
  auto make_descriptor = [](const std::string& reg, const std::string& addr, int64_t units, uint64_t fields) {
    return fmt::format("shr.u32 t, {}, 4;\nand.b32 t, t, 16383;\nadd.u32 t, t, {};\ncvt.u64.u32 {}, t;\nor.b64 {}, {}, {};\n",
                       addr, units, reg, reg, reg, fields);
  };
  auto instruction = [&](int64_t a_units, int64_t b_units) {
    std::string text = fmt::format("{{\n.reg .pred p;\n.reg .b32 t;\n.reg .b64 da, db;\nsetp.ne.b32 p, ${}, 0;\n", nacc + na + 1);
    text += make_descriptor("db", fmt::format("${}", nacc + na), b_units, descriptor_fields(d.b));
    if (a_smem) text += make_descriptor("da", fmt::format("${}", nacc), a_units, descriptor_fields(d.a));
    text += fmt::format("wgmma.mma_async.sync.aligned.m64n{}k16.f32.{}.{} {{", n_wg, ty, ty);
    for (int i = 0; i < nacc; ++i) text += fmt::format("{}${}", i ? ", " : "", i);
    if (a_smem)
      text += fmt::format("}}, da, db, p, 1, 1, {}, {};\n}}", d.a.k_major ? 0 : 1, d.b.k_major ? 0 : 1);
    else
      text += fmt::format("}}, {{${}, ${}, ${}, ${}}}, db, p, 1, 1, {};\n}}", nacc, nacc + 1, nacc + 2, nacc + 3,
                          d.b.k_major ? 0 : 1);
    return llvm::InlineAsm::get(fty, text, constraints, /*hasSideEffects=*/true);
  };

  // Issued back to back, then waited for as a group (unless `wait` is false: the enclosing loop waits,
  // passes::deferred_wgmma_waits): the accumulators are this dot's result. Where the first step does
  // not add (no `accumulate`), the accumulators' values going in do not matter. wgmma.fence orders the
  // registers' earlier writes before the instructions that read them: once before the first, and
  // after each step's ldmatrix of A (an A fragment written after the fence is undefined to wgmma: the
  // GPU test's products came out wrong without it).
  llvm::Value* b_desc = start_address(d.b, n_base);
  std::vector<llvm::Value*> a_desc(mt);
  if (a_smem)
    for (int64_t tm = 0; tm < mt; ++tm) a_desc[tm] = start_address(d.a, wg_row(tm));
  if (a_smem) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_wgmma_fence_sync_aligned, {});
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    std::vector<std::vector<llvm::Value*>> afrag;
    if (!a_smem) {
      afrag = a_fragments(k0);
      b_.CreateIntrinsic(llvm::Intrinsic::nvvm_wgmma_fence_sync_aligned, {});
    }
    llvm::InlineAsm* mma = instruction(a_smem ? step_units(d.a, k0) : 0, step_units(d.b, k0));
    for (int64_t tm = 0; tm < mt; ++tm) {
      std::vector<llvm::Value*> args;
      if (a_smem) args = {a_desc[tm]};
      else args = {afrag[tm][0], afrag[tm][1], afrag[tm][2], afrag[tm][3]};
      args.push_back(b_desc);
      const bool add = accumulate || k0 > 0 || first_step_adds;
      args.push_back(k0 == 0 && first_step_adds ? first_step_adds : i32(add));
      for (int q = 0; q < nacc; ++q) args.push_back(add ? acc[tm * nacc + q] : llvm::UndefValue::get(f32));
      llvm::Value* r = b_.CreateCall(fty, mma, args);
      for (int q = 0; q < nacc; ++q) acc[tm * nacc + q] = b_.CreateExtractValue(r, q);
    }
  }
  b_.CreateIntrinsic(llvm::Intrinsic::nvvm_wgmma_commit_group_sync_aligned, {});
  ++wgmma_groups_;
  if (wait) b_.CreateIntrinsic(llvm::Intrinsic::nvvm_wgmma_wait_group_sync_aligned, {b_.getInt64(0)});
  return acc;
}

}  // namespace linac::nvptx
