// Views: ops that move coordinates and never compute (expand_dims, broadcast, reshape, transpose, take,
// slice) and the ops that assemble a tile from others (concat, place). None has registers of its own:
// each is evaluated where it is used, at the consumer's coordinates, by reading its operands there.
// Over data tiles that means their shared-memory copies (smem_plan.h), the same copies that move a tile
// between layouts; a concat or place whose parts are all in shared memory reads each element once,
// from the address of the part that holds it.
#include <algorithm>

#include <fmt/format.h>

#include "compiler/nvptx/lowering.h"

namespace linac::nvptx {

using ir::OpCode;
using passes::ValueClass;

std::pair<const ir::Value*, Coords> KernelLowering::view_source(const ir::Op& op, const Coords& c) {
  const ir::Value* src = op.operands[0];
  switch (op.code) {
    case OpCode::ExpandDims: {
      Coords s = c;
      s.erase(s.begin() + op.attrs.axis);
      return {src, s};
    }
    case OpCode::Broadcast: {
      Coords s = c;
      for (size_t d = 0; d < s.size(); ++d)
        if (src->type.shape[d] == 1) s[d] = i32(0);
      return {src, s};
    }
    case OpCode::Transpose: {
      Coords s(c.size());
      for (size_t i = 0; i < c.size(); ++i) s[op.attrs.perm[i]] = c[i];
      return {src, s};
    }
    case OpCode::Take: {  // the source at c with the index put back on the taken axis
      Coords s = c;
      s.insert(s.begin() + op.attrs.axis, scalar(op.operands[1]));
      return {src, s};
    }
    case OpCode::Slice: {  // static offsets, plus one start per axis where they are dynamic
      Coords s = c;
      for (size_t d = 0; d < c.size(); ++d) {
        if (op.attrs.offsets[d]) s[d] = b_.CreateAdd(s[d], i32(op.attrs.offsets[d]));
        if (op.operands.size() > 1) s[d] = b_.CreateAdd(s[d], scalar(op.operands[d + 1]));
      }
      return {src, s};
    }
    case OpCode::Reshape: {
      const auto& dst = op.result()->type.shape;
      const auto& shape = src->type.shape;
      llvm::Value* lin = i32(0);
      for (size_t d = 0; d < dst.size(); ++d) lin = b_.CreateAdd(b_.CreateMul(lin, i32(dst[d])), c[d]);
      Coords s(shape.size());
      for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
        s[d] = b_.CreateURem(lin, i32(shape[d]));
        lin = b_.CreateUDiv(lin, i32(shape[d]));
      }
      return {src, s};
    }
    default: break;
  }
  throw InternalError(fmt::format("{} is not a view with one source", ir::opcode_name(op.code)));
}

KernelLowering::Assembly KernelLowering::assembly_parts(const ir::Op& op, const Coords& c, bool clamped) {
  // Part i of a concat covers [start_i, start_i + n_i) of the axis; place's block covers
  // [offset, offset + size) of every axis and the big tile the rest.
  Assembly a;
  a.parts.assign(op.operands.begin(), op.operands.end());
  a.at.assign(a.parts.size(), c);
  a.take.resize(a.parts.size() - 1);
  auto clamp = [&](llvm::Value* x, int64_t n) -> llvm::Value* {
    if (!clamped) return x;
    return b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, x, i32(0)),
                                    i32(n - 1));
  };
  if (op.code == OpCode::Concat) {
    const size_t axis = static_cast<size_t>(op.attrs.axis);
    int64_t start = 0;
    for (size_t i = 0; i < a.parts.size(); ++i) {
      const int64_t n = a.parts[i]->type.shape[axis];
      a.at[i][axis] = clamp(b_.CreateSub(c[axis], i32(start)), n);
      if (i + 1 < a.parts.size()) a.take[i] = b_.CreateICmpSLT(c[axis], i32(start + n));
      start += n;
    }
    return a;
  }
  LINAC_INTERNAL_CHECK(op.code == OpCode::Place, "not a concat or place");
  std::swap(a.parts[0], a.parts[1]);  // (block, big): the block wins where it lies
  const auto& bs = a.parts[0]->type.shape;
  llvm::Value* inside = b_.getTrue();
  for (size_t d = 0; d < c.size(); ++d) {
    llvm::Value* x = b_.CreateSub(c[d], i32(op.attrs.offsets[d]));
    inside = b_.CreateAnd(inside, b_.CreateICmpULT(x, i32(bs[d])));  // 0 <= x < size (a negative x wraps)
    a.at[0][d] = clamp(x, bs[d]);
  }
  a.take[0] = inside;
  return a;
}

bool KernelLowering::in_smem(const ir::Value* v) const {
  if (v->type.is_scalar()) return false;
  switch (cls(v)) {
    case ValueClass::Data: return smem_.buffers.count(v) > 0;
    case ValueClass::View:
      if (v->def->code == OpCode::Concat || v->def->code == OpCode::Place) {
        for (const ir::Value* o : v->def->operands)
          if (!in_smem(o)) return false;
        return true;
      }
      return in_smem(v->def->operands[0]);
    default: return false;
  }
}

llvm::Value* KernelLowering::smem_element_addr(const ir::Value* v, const Coords& c, std::vector<ByteRange>* reads) {
  if (cls(v) == ValueClass::Data) {
    reads->push_back(smem_range(v));
    return smem_addr(v, c);
  }
  const ir::Op& op = *v->def;
  if (op.code != OpCode::Concat && op.code != OpCode::Place) {
    auto [src, sc] = view_source(op, c);
    return smem_element_addr(src, sc, reads);
  }
  // One address is chosen and read: the parts' coordinates need no clamping.
  Assembly a = assembly_parts(op, c, /*clamped=*/false);
  const bool one_value = std::all_of(a.parts.begin(), a.parts.end(), [&](const ir::Value* p) { return p == a.parts[0]; });
  if (one_value) {  // a roll (concat({x, x})): choose the coordinates, then compute one address
    Coords at = a.at.back();
    for (size_t i = a.parts.size() - 1; i-- > 0;)
      for (size_t d = 0; d < at.size(); ++d) at[d] = b_.CreateSelect(a.take[i], a.at[i][d], at[d]);
    return smem_element_addr(a.parts[0], at, reads);
  }
  llvm::Value* addr = smem_element_addr(a.parts.back(), a.at.back(), reads);
  for (size_t i = a.parts.size() - 1; i-- > 0;)
    addr = b_.CreateSelect(a.take[i], smem_element_addr(a.parts[i], a.at[i], reads), addr);
  return addr;
}

llvm::Value* KernelLowering::eval_view(const ir::Op& op, const Coords& c) {
  if (op.code != OpCode::Concat && op.code != OpCode::Place) {
    auto [src, sc] = view_source(op, c);
    return eval_at(src, sc);
  }
  // Every part in shared memory: choose the address, read once.
  if (in_smem(op.result())) {
    std::vector<ByteRange> reads;
    llvm::Value* addr = smem_element_addr(op.result(), c, &reads);
    before_smem_access(reads, {});
    const DType t = op.result()->type.dtype;
    llvm::Value* x = b_.CreateLoad(t == DType::i1 ? b_.getInt8Ty() : llvm_type(t), addr);
    return t == DType::i1 ? b_.CreateICmpNE(x, b_.getInt8(0)) : x;
  }
  // Otherwise (index math among the parts) evaluate every part and choose the value.
  Assembly a = assembly_parts(op, c, /*clamped=*/true);
  llvm::Value* x = eval_at(a.parts.back(), a.at.back());
  for (size_t i = a.parts.size() - 1; i-- > 0;) x = b_.CreateSelect(a.take[i], eval_at(a.parts[i], a.at[i]), x);
  return x;
}

}  // namespace linac::nvptx
