// Shape ops: they move elements and never change them, so no rounding is needed. Values are
// row-major, so expand_dims and reshape are copies; broadcast, transpose and slice are strided
// gathers; concat and place copy rows into place.
#include <algorithm>
#include <fmt/format.h>

#include "compiler/interp/frame.h"
#include "linac/error.h"

namespace linac::interp {
namespace {

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

/// out[idx] = src[sum_i idx[i] * src_strides[i]] for every idx of `shape` (row-major out). The
/// innermost axis is a plain loop; the outer axes advance like an odometer.
void strided_gather(const double* src, const std::vector<int64_t>& src_strides, const std::vector<int64_t>& shape,
                    double* out) {
  const size_t rank = shape.size();
  if (rank == 0) {
    out[0] = src[0];
    return;
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (numel == 0) return;
  const int64_t inner = shape[rank - 1], inner_stride = src_strides[rank - 1];
  std::vector<int64_t> idx(rank, 0);
  int64_t src_off = 0;
  for (int64_t o = 0; o < numel; o += inner) {
    for (int64_t j = 0; j < inner; ++j) out[o + j] = src[src_off + j * inner_stride];
    for (size_t d = rank - 1; d-- > 0;) {
      src_off += src_strides[d];
      if (++idx[d] < shape[d]) break;
      src_off -= shape[d] * src_strides[d];
      idx[d] = 0;
    }
  }
}

void broadcast(const ir::Op& op, const Buffer& in, Buffer& out) {
  const ir::Type& from = op.operands[0]->type;
  const std::vector<int64_t>& to = op.result()->type.shape;
  if (from.is_scalar()) {
    std::fill(out.begin(), out.end(), in[0]);
    return;
  }
  if (from.rank() != static_cast<int>(to.size())) malformed(op, "broadcast changes the rank");
  std::vector<int64_t> strides = row_major_strides(from.shape);
  for (size_t i = 0; i < to.size(); ++i) {
    if (from.shape[i] == to[i]) continue;
    if (from.shape[i] != 1) malformed(op, "broadcast of a dim that is not 1");
    strides[i] = 0;  // every index along an expanded dim reads the one source element
  }
  strided_gather(in.data(), strides, to, out.data());
}

void transpose(const ir::Op& op, const Buffer& in, Buffer& out) {
  const std::vector<int64_t>& from = op.operands[0]->type.shape;
  const std::vector<int64_t>& to = op.result()->type.shape;
  const std::vector<int64_t>& perm = op.attrs.perm;
  if (perm.size() != from.size() || to.size() != from.size()) malformed(op, "perm size differs from the rank");
  std::vector<int64_t> src = row_major_strides(from), strides(perm.size());
  std::vector<bool> seen(perm.size(), false);
  for (size_t i = 0; i < perm.size(); ++i) {
    int64_t p = perm[i];
    if (p < 0 || p >= static_cast<int64_t>(perm.size()) || seen[p]) malformed(op, "perm is not a permutation");
    if (to[i] != from[p]) malformed(op, "result shape does not match the permuted operand shape");
    seen[p] = true;
    strides[i] = src[p];
  }
  strided_gather(in.data(), strides, to, out.data());
}

/// The slice of `in` at `index` along op.attrs.axis: [outer, n, inner] -> [outer, inner].
void take(const ir::Op& op, const Buffer& in, int64_t index, Buffer& out) {
  const std::vector<int64_t>& shape = op.operands[0]->type.shape;
  const int64_t axis = op.attrs.axis;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[axis];
  for (int64_t o = 0; o < outer; ++o)
    std::copy_n(in.begin() + (o * n + index) * inner, inner, out.begin() + o * inner);
}

/// The offset in a row-major buffer of `strides` of the block origin `offsets`.
int64_t origin(const std::vector<int64_t>& offsets, const std::vector<int64_t>& strides) {
  int64_t o = 0;
  for (size_t d = 0; d < offsets.size(); ++d) o += offsets[d] * strides[d];
  return o;
}

/// The block of `in` at `offsets` (op.attrs.offsets plus the dynamic starts) with the result's shape.
void slice(const ir::Op& op, const Buffer& in, const std::vector<int64_t>& offsets, Buffer& out) {
  const std::vector<int64_t>& from = op.operands[0]->type.shape;
  const std::vector<int64_t>& to = op.result()->type.shape;
  std::vector<int64_t> strides = row_major_strides(from);
  strided_gather(in.data() + origin(offsets, strides), strides, to, out.data());
}

/// The operands one after another along op.attrs.axis: [outer, n_i, inner] -> [outer, sum n_i, inner].
void concat(const ir::Op& op, const Frame& f, Buffer& out) {
  const std::vector<int64_t>& shape = op.result()->type.shape;
  const int64_t axis = op.attrs.axis;
  if (axis < 0 || axis >= static_cast<int64_t>(shape.size())) malformed(op, "axis out of range");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t total = shape[axis];
  int64_t start = 0;
  for (size_t i = 0; i < op.operands.size(); ++i) {
    const Buffer& in = f.operand(op, i);
    const int64_t n = op.operands[i]->type.shape.at(axis);
    if (start + n > total || static_cast<int64_t>(in.size()) != outer * n * inner) malformed(op, "parts do not fit");
    for (int64_t o = 0; o < outer; ++o)
      std::copy_n(in.begin() + o * n * inner, n * inner, out.begin() + (o * total + start) * inner);
    start += n;
  }
  if (start != total) malformed(op, "parts do not fill the result");
}

/// `big` with `block` written at op.attrs.offsets: a copy of big, then the block's rows over it.
void place(const ir::Op& op, const Buffer& big, const Buffer& block, Buffer& out) {
  const std::vector<int64_t>& outer = op.result()->type.shape;
  const std::vector<int64_t>& bs = op.operands[1]->type.shape;
  const std::vector<int64_t>& off = op.attrs.offsets;
  if (off.size() != outer.size() || bs.size() != outer.size()) malformed(op, "offsets or rank differ");
  for (size_t d = 0; d < outer.size(); ++d)
    if (off[d] < 0 || off[d] + bs[d] > outer[d]) malformed(op, "the block leaves the tile");
  std::copy(big.begin(), big.end(), out.begin());
  const std::vector<int64_t> strides = row_major_strides(outer);
  const size_t rank = bs.size();
  const int64_t inner = bs[rank - 1];
  std::vector<int64_t> idx(rank, 0);  // the block's index, its last axis walked by the copy
  for (int64_t from = 0; from < static_cast<int64_t>(block.size()); from += inner) {
    int64_t to = 0;
    for (size_t d = 0; d < rank; ++d) to += (idx[d] + off[d]) * strides[d];
    std::copy_n(block.begin() + from, inner, out.begin() + to);
    for (size_t d = rank - 1; d-- > 0;) {
      if (++idx[d] < bs[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

void eval_shape(const ir::Op& op, Frame& f) {
  if (op.code == ir::OpCode::Take) {
    if (op.operands.size() != 2) malformed(op, "expected a tile and an index");
    const double index = f.operand(op, 1)[0];
    const int64_t n = op.operands[0]->type.shape.at(op.attrs.axis);
    if (!(index >= 0 && index < static_cast<double>(n)))
      throw UserError(op.loc, fmt::format("take: index {} is outside axis {} of size {} ({})", index, op.attrs.axis, n,
                                          program_context(f)));
    return take(op, f.operand(op, 0), static_cast<int64_t>(index), f.result(op));
  }
  if (op.code == ir::OpCode::Slice) {
    const std::vector<int64_t>& from = op.operands[0]->type.shape;
    const std::vector<int64_t>& to = op.result()->type.shape;
    if (op.attrs.offsets.size() != from.size() || to.size() != from.size()) malformed(op, "offsets or rank differ");
    if (op.operands.size() != 1 && op.operands.size() != 1 + from.size()) malformed(op, "expected one start per axis");
    std::vector<int64_t> offsets = op.attrs.offsets;
    for (size_t d = 0; d + 1 < op.operands.size(); ++d) {
      const double start = f.operand(op, d + 1)[0];
      const double first = static_cast<double>(offsets[d]) + start;
      if (!(first >= 0 && first + static_cast<double>(to[d]) <= static_cast<double>(from[d])))
        throw UserError(op.loc, fmt::format("slice: {} elements from {} leave axis {} of size {} ({})", to[d], first, d,
                                            from[d], program_context(f)));
      offsets[d] = static_cast<int64_t>(first);
    }
    return slice(op, f.operand(op, 0), offsets, f.result(op));
  }
  if (op.code == ir::OpCode::Concat) return concat(op, f, f.result(op));
  if (op.code == ir::OpCode::Place) {
    if (op.operands.size() != 2) malformed(op, "expected a tile and a block");
    return place(op, f.operand(op, 0), f.operand(op, 1), f.result(op));
  }
  if (op.operands.size() != 1) malformed(op, "expected one operand");
  Buffer& out = f.result(op);
  const Buffer& in = f.operand(op, 0);
  switch (op.code) {
    case ir::OpCode::Splat:
      if (in.size() != 1) malformed(op, "splat of a tile");
      std::fill(out.begin(), out.end(), in[0]);
      return;
    case ir::OpCode::Broadcast:
      return broadcast(op, in, out);
    case ir::OpCode::ExpandDims:
    case ir::OpCode::Reshape:
      if (in.size() != out.size()) malformed(op, "element count changes");
      std::copy(in.begin(), in.end(), out.begin());
      return;
    case ir::OpCode::Transpose:
      return transpose(op, in, out);
    default:
      malformed(op, "not a shape op");
  }
}

}  // namespace linac::interp
