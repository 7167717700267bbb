// dot on tensor cores: operands in shared memory (row-major, padded rows), fragments loaded with
// ldmatrix (.trans where the stored orientation is the other one), mma.sync m16n8k16 with f32
// accumulators in the mma layout.
//
// f32 operands: in kernels marked tensor_core_f32, on the tensor cores as three tf32 products
// (mma.sync m16n8k8): with x = x_big + x_small, both rounded to tf32 (11 significant bits each),
// a b ~ a_small b_big + a_big b_small + a_big b_big leaves out only a_small b_small (about 2^-22 of
// a b): fp32-level accuracy, where one tf32 product (2^-11) would not be. Their fragments are read
// element by element from the shared copies, in a loop over the 8-wide steps (unrolled, the reads of
// all steps were scheduled first and fp32 walks spilled up to 900 bytes). Elsewhere (and where the
// result is not in the mma layout) the slower path: FMA loops over the shared copies. Opt-in, because
// in kernels full of fp32 state products the split fragments still cost spills (4-byte spills in
// three kernels under ptxas even with the loop).
#include <fmt/format.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include <array>
#include <utility>

#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

using ir::OpCode;
using passes::Layout;
using passes::ValueClass;

namespace {

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
  SmemOperand a = operand(op.operands[0]), b = operand(op.operands[1]);
  const int64_t M = op.operands[0]->type.shape[0], K = op.operands[0]->type.shape[1];
  const int64_t N = op.operands[1]->type.shape[1];
  const DType in = op.operands[0]->type.dtype;
  const Layout& l = layout(op.result());
  auto f32 = b_.getFloatTy();

  before_smem_access({smem_range(a.buf), smem_range(b.buf)}, {});
  auto read = [&](const SmemOperand& o, llvm::Value* i, llvm::Value* j) {
    return b_.CreateLoad(llvm_type(o.buf->type.dtype), o.transposed ? stored_addr(o, j, i) : stored_addr(o, i, j));
  };

  const bool tensor_cores = (in == DType::bf16 || in == DType::f16) && l.kind == Layout::Kind::Mma && K % 16 == 0;
  const bool tf32x3 = k_.tensor_core_f32 && in == DType::f32 && l.kind == Layout::Kind::Mma && K % 8 == 0;
  if (!tensor_cores && !tf32x3) {
    // The slower path: each thread computes its accumulator elements with an FMA loop over K.
    Layout out_l = l;
    int n = out_l.regs_per_thread();
    std::vector<Coords> cs;
    for (int r = 0; r < n; ++r) cs.push_back(coords_of(out_l, r));
    std::vector<llvm::Value*> init(n, llvm::ConstantFP::get(f32, 0.0));
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

  // Tensor cores. Each warp owns a [M/wm, N/wn] block: mt x nt tiles of 16 x 8.
  const int64_t mt = M / l.wm / 16, nt = N / l.wn / 8;
  llvm::Value* warp = b_.CreateUDiv(tid_, i32(32));
  llvm::Value* lane = b_.CreateURem(tid_, i32(32));
  llvm::Value* warp_n = b_.CreateURem(warp, i32(l.wn));
  llvm::Value* warp_m = b_.CreateURem(b_.CreateUDiv(warp, i32(l.wn)), i32(l.wm));
  llvm::Value* m_base = b_.CreateMul(warp_m, i32(M / l.wm));
  llvm::Value* n_base = b_.CreateMul(warp_n, i32(N / l.wn));
  if (tf32x3) {
    // m16n8k8 fragments (g = lane / 4, t = lane % 4): a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
    // of the 16x8 A tile; b0 (t, g), b1 (t+4, g) of the 8x8 B tile; the accumulators as in m16n8k16.
    llvm::Value* g = b_.CreateUDiv(lane, i32(4));
    llvm::Value* t = b_.CreateURem(lane, i32(4));
    auto split = [&](llvm::Value* x) -> std::pair<llvm::Value*, llvm::Value*> {
      llvm::Value* big = b_.CreateIntrinsic(llvm::Intrinsic::nvvm_f2tf32_rna, {}, {x});
      llvm::Value* rest = b_.CreateFSub(x, b_.CreateBitCast(big, f32));
      return {big, b_.CreateIntrinsic(llvm::Intrinsic::nvvm_f2tf32_rna, {}, {rest})};
    };
    std::vector<llvm::Value*> init(mt * nt * 4, llvm::ConstantFP::get(f32, 0.0));
    auto step = [&](llvm::Value* ks, const std::vector<llvm::Value*>& cur) {
      std::vector<llvm::Value*> acc = cur;
      llvm::Value* k_lo = b_.CreateAdd(b_.CreateMul(ks, i32(8)), t);
      llvm::Value* k_hi = b_.CreateAdd(k_lo, i32(4));
      std::vector<std::array<std::pair<llvm::Value*, llvm::Value*>, 4>> af(mt);
      for (int64_t tm = 0; tm < mt; ++tm) {
        llvm::Value* r0 = b_.CreateAdd(m_base, b_.CreateAdd(i32(tm * 16), g));
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
          // The small terms first, so that they are not lost against the large one.
          for (int term = 0; term < 3; ++term) {
            auto pick_a = [&](int q) { return term == 0 ? af[tm][q].second : af[tm][q].first; };
            auto pick_b = [&](int q) { return term == 1 ? bf[tn][q].second : bf[tn][q].first; };
            std::vector<llvm::Value*> args = {pick_a(0), pick_a(1), pick_a(2), pick_a(3), pick_b(0), pick_b(1),
                                              acc[base], acc[base + 1], acc[base + 2], acc[base + 3]};
            llvm::Value* d = b_.CreateIntrinsic(llvm::Intrinsic::nvvm_mma_m16n8k8_row_col_tf32, {}, args);
            for (int q = 0; q < 4; ++q) acc[base + q] = b_.CreateExtractValue(d, q);
          }
        }
      return acc;
    };
    std::vector<llvm::Value*> acc = emit_counted_loop(i32(0), i32(K / 8), init, step);
    regs_[op.result()] = acc;
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

  std::vector<llvm::Value*> acc(mt * nt * 4, llvm::ConstantFP::get(f32, 0.0));
  const auto mma_id = in == DType::bf16 ? llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_bf16
                                        : llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_f32_f32;
  // The f16 form takes its fragments as <2 x half>; the bf16 form as i32.
  auto frag = [&](llvm::Value* x) {
    return in == DType::f16 ? b_.CreateBitCast(x, llvm::FixedVectorType::get(b_.getHalfTy(), 2)) : x;
  };
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    // A fragments: a0 rows 0-7/k 0-7, a1 rows 8-15/k 0-7, a2 rows 0-7/k 8-15, a3 rows 8-15/k 8-15.
    std::vector<std::vector<llvm::Value*>> afrag(mt);
    for (int64_t tm = 0; tm < mt; ++tm) {
      llvm::Value* m0 = b_.CreateAdd(m_base, i32(tm * 16));
      if (!a.transposed) {
        // Stored [m][k]: lane l addresses row m0 + l%16 at column k0 + (l/16)*8.
        llvm::Value* row = b_.CreateAdd(m0, b_.CreateURem(lane, i32(16)));
        llvm::Value* col = b_.CreateAdd(i32(k0), b_.CreateMul(b_.CreateUDiv(lane, i32(16)), i32(8)));
        afrag[tm] = ldmatrix(a, row, col, false, 4);
      } else {
        // Stored [k][m]: matrix j covers m0 + (j%2)*8, k0 + (j/2)*8, read transposed.
        llvm::Value* row = b_.CreateAdd(i32(k0), b_.CreateAdd(l8, b_.CreateMul(j_hi, i32(8))));
        llvm::Value* col = b_.CreateAdd(m0, b_.CreateMul(j_lo, i32(8)));
        afrag[tm] = ldmatrix(a, row, col, true, 4);
      }
    }
    // B fragments for pairs of n-tiles: b0 k 0-7, b1 k 8-15 of each.
    std::vector<std::vector<llvm::Value*>> bfrag(nt);
    for (int64_t tn = 0; tn < nt; tn += 2) {
      int count = tn + 1 < nt ? 4 : 2;
      llvm::Value* n0 = b_.CreateAdd(n_base, i32(tn * 8));
      std::vector<llvm::Value*> regs;
      if (!b.transposed) {
        // Stored [k][n]: matrix j covers k0 + (j%2)*8, n0 + (j/2)*8, read transposed.
        llvm::Value* row = b_.CreateAdd(i32(k0), b_.CreateAdd(l8, b_.CreateMul(j_lo, i32(8))));
        llvm::Value* col = b_.CreateAdd(n0, b_.CreateMul(count == 4 ? j_hi : i32(0), i32(8)));
        regs = ldmatrix(b, row, col, true, count);
      } else {
        // Stored [n][k]: matrix j covers n0 + (j/2)*8, k0 + (j%2)*8.
        llvm::Value* row = b_.CreateAdd(n0, b_.CreateAdd(l8, b_.CreateMul(count == 4 ? j_hi : i32(0), i32(8))));
        llvm::Value* col = b_.CreateAdd(i32(k0), b_.CreateMul(j_lo, i32(8)));
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
  regs_[op.result()] = acc;
}

}  // namespace linac::nvptx
