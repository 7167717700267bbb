// Load and store: a block of a tensor at runtime offsets, masked against min(limit, dim) per tensor
// dim, moved between host memory (in the tensor's storage format) and held doubles.
//
// Tile axis a walks tensor dim dims[a]; tensor dims that no tile axis walks stay at their offset.
// Masking is therefore a box: along each tile axis the in-bounds positions form one interval, and a
// tensor dim outside the tile masks the whole block. Only in-bounds elements are ever addressed.
#include <algorithm>
#include <atomic>
#include <cstring>

#include <fmt/ranges.h>

#include "compiler/interp/frame.h"
#include "compiler/interp/number_formats.h"

namespace linac::interp {
namespace {

/// The in-bounds part of one load/store block.
struct BlockAccess {
  bool empty = false;           // every element masked
  int64_t base = 0;             // tensor element index of tile position (0, ..., 0)
  std::vector<int64_t> shape;   // block shape, one entry per tile axis
  std::vector<int64_t> stride;  // tensor stride walked by each tile axis
  std::vector<int64_t> lo, hi;  // in-bounds positions [lo, hi) along each tile axis
};

BlockAccess plan_access(const ir::Op& op, const Frame& f, const TensorArg& t, const std::vector<int64_t>& block_shape) {
  const size_t rank = t.shape.size();
  const std::vector<int64_t>& dims = op.attrs.dims;
  if (dims.size() != block_shape.size()) malformed(op, "attrs.dims does not give one tensor dim per tile axis");
  std::vector<int64_t> offset(rank), bound(rank), axis_of_dim(rank, -1);
  for (size_t d = 0; d < rank; ++d) {
    if (!op.operands[1 + d]->type.is_scalar() || !op.operands[1 + rank + d]->type.is_scalar())
      malformed(op, "offsets and limits must be scalars");
    offset[d] = to_i64(f.scalar_operand(op, 1 + d));
    bound[d] = std::min(to_i64(f.scalar_operand(op, 1 + rank + d)), t.shape[d]);
  }
  for (size_t a = 0; a < dims.size(); ++a) {
    if (dims[a] < 0 || dims[a] >= static_cast<int64_t>(rank) || axis_of_dim[dims[a]] != -1)
      malformed(op, "attrs.dims must name distinct tensor dims");
    axis_of_dim[dims[a]] = static_cast<int64_t>(a);
  }
  BlockAccess acc;
  acc.shape = block_shape;
  for (size_t d = 0; d < rank; ++d)
    if (axis_of_dim[d] == -1 && (offset[d] < 0 || offset[d] >= bound[d])) acc.empty = true;
  for (size_t a = 0; a < dims.size(); ++a) {
    const int64_t d = dims[a];
    acc.stride.push_back(t.strides[d]);
    acc.lo.push_back(std::clamp<int64_t>(-offset[d], 0, block_shape[a]));
    acc.hi.push_back(std::clamp<int64_t>(bound[d] - offset[d], 0, block_shape[a]));
    if (acc.lo.back() >= acc.hi.back()) acc.empty = true;
  }
  // Offsets of a non-empty block are within a block size of the tensor, so this cannot overflow.
  if (!acc.empty)
    for (size_t d = 0; d < rank; ++d) acc.base += offset[d] * t.strides[d];
  return acc;
}

/// Calls fn(tile_index, element_index, count, element_stride) for each in-bounds run of the block
/// along its last tile axis.
template <class Fn>
void for_each_run(const BlockAccess& acc, Fn fn) {
  if (acc.empty) return;
  const size_t n = acc.shape.size();
  if (n == 0) {
    fn(int64_t{0}, acc.base, int64_t{1}, int64_t{0});
    return;
  }
  std::vector<int64_t> idx(acc.lo.begin(), acc.lo.end());
  while (true) {
    int64_t tile = 0, elem = acc.base;
    for (size_t a = 0; a < n; ++a) {
      tile = tile * acc.shape[a] + idx[a];
      elem += idx[a] * acc.stride[a];
    }
    fn(tile, elem, acc.hi[n - 1] - acc.lo[n - 1], acc.stride[n - 1]);
    size_t a = n - 1;  // advance the outer axes like an odometer within [lo, hi)
    while (a-- > 0) {
      if (++idx[a] < acc.hi[a]) break;
      idx[a] = acc.lo[a];
    }
    if (a == static_cast<size_t>(-1)) return;
  }
}

template <class T>
T read(const std::byte* data, int64_t elem) {
  T v;
  std::memcpy(&v, data + elem * static_cast<int64_t>(sizeof(T)), sizeof(T));  // tensors need not be aligned
  return v;
}

template <class T>
void write(std::byte* data, int64_t elem, T v) {
  std::memcpy(data + elem * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
}

void read_run(DType t, const std::byte* data, int64_t elem, int64_t count, int64_t stride, double* out) {
  switch (t) {
    case DType::i1:
      for (int64_t j = 0; j < count; ++j) out[j] = read<uint8_t>(data, elem + j * stride) != 0 ? 1.0 : 0.0;
      return;
    case DType::i32:
      for (int64_t j = 0; j < count; ++j) out[j] = read<int32_t>(data, elem + j * stride);
      return;
    case DType::i64:
      for (int64_t j = 0; j < count; ++j) out[j] = static_cast<double>(read<int64_t>(data, elem + j * stride));
      return;
    case DType::f16:
      for (int64_t j = 0; j < count; ++j) out[j] = from_f16_bits(read<uint16_t>(data, elem + j * stride));
      return;
    case DType::bf16:
      for (int64_t j = 0; j < count; ++j) out[j] = from_bf16_bits(read<uint16_t>(data, elem + j * stride));
      return;
    case DType::f32:
      for (int64_t j = 0; j < count; ++j) out[j] = read<float>(data, elem + j * stride);
      return;
    case DType::f64:
      for (int64_t j = 0; j < count; ++j) out[j] = read<double>(data, elem + j * stride);
      return;
  }
}

/// Writes held values in the tensor's format, converting first (a store may narrow, e.g. an f32
/// tile into a bf16 tensor).
void write_run(DType t, std::byte* data, int64_t elem, int64_t count, int64_t stride, const double* in) {
  for (int64_t j = 0; j < count; ++j) {
    const int64_t e = elem + j * stride;
    const double x = in[j];
    switch (t) {
      case DType::i1:
        write<uint8_t>(data, e, x != 0 ? 1 : 0);
        break;
      case DType::i32:
        write<int32_t>(data, e, static_cast<int32_t>(round_to(t, x)));
        break;
      case DType::i64:
        write<int64_t>(data, e, to_i64(x));
        break;
      case DType::f16:
        write<uint16_t>(data, e, f16_bits(x));
        break;
      case DType::bf16:
        write<uint16_t>(data, e, bf16_bits(x));
        break;
      case DType::f32:
        write<float>(data, e, static_cast<float>(x));
        break;
      case DType::f64:
        write<double>(data, e, x);
        break;
    }
  }
}

void check_operand_count(const ir::Op& op, const TensorArg& t, size_t extra) {
  if (op.operands.size() != 1 + 2 * t.shape.size() + extra)
    malformed(op, "expected a tensor, an offset and a limit per tensor dim");
}

}  // namespace

void eval_memory(const ir::Op& op, Frame& f) {
  const TensorArg& t = f.tensor_operand(op, 0);
  if (op.code == ir::OpCode::Load) {
    check_operand_count(op, t, 0);
    const ir::Type& rt = op.result()->type;
    if (!op.attrs.shape.empty() && op.attrs.shape != rt.shape)
      malformed(op, "attrs.shape differs from the result shape");
    Buffer& out = f.result(op);
    std::fill(out.begin(), out.end(), 0.0);  // masked elements read 0
    const auto* data = static_cast<const std::byte*>(t.data);
    for_each_run(plan_access(op, f, t, rt.shape), [&](int64_t tile, int64_t elem, int64_t count, int64_t stride) {
      read_run(t.dtype, data, elem, count, stride, out.data() + tile);
    });
    if (rt.dtype != t.dtype) round_in_place(rt.dtype, out.data(), out.size());
    return;
  }
  if (op.code == ir::OpCode::Store) {
    check_operand_count(op, t, 1);
    const Buffer& value = f.operand(op, op.operands.size() - 1);
    auto* data = static_cast<std::byte*>(t.data);
    for_each_run(plan_access(op, f, t, op.operands.back()->type.shape),
                 [&](int64_t tile, int64_t elem, int64_t count, int64_t stride) {
                   write_run(t.dtype, data, elem, count, stride, value.data() + tile);
                 });
    return;
  }
  malformed(op, "not a memory op");
}

void eval_flag(const ir::Op& op, Frame& f) {
  const TensorArg& t = f.tensor_operand(op, 0);
  const size_t rank = t.shape.size();
  if (t.dtype != DType::i32 || op.operands.size() != 1 + rank + (op.code == ir::OpCode::Wait ? 1 : 0))
    malformed(op, "signal/wait needs an i32 tensor and one offset per dim (and wait a count)");
  int64_t at = 0;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t i = static_cast<int64_t>(f.scalar_operand(op, 1 + d));
    if (i < 0 || i >= t.shape[d])
      throw UserError(op.loc, fmt::format("{}: offset {} of dim {} is outside the flags tensor [{}] ({})",
                                          ir::opcode_name(op.code), i, d, fmt::join(t.shape, ", "), program_context(f)));
    at += i * t.strides[d];
  }
  // Programs of one launch run on several host threads: the flag is an atomic counter.
  std::atomic_ref<int32_t> flag(static_cast<int32_t*>(t.data)[at]);
  if (op.code == ir::OpCode::Signal) {
    flag.fetch_add(1);
    return;
  }
  // The CPU runs launches one after another: a producer's signals all precede this launch, so a flag
  // short of its count would never be reached (on the GPU, a wait for ever).
  const int64_t count = static_cast<int64_t>(f.scalar_operand(op, 1 + rank));
  if (count <= 0) return;  // waits for nothing
  const int64_t now = flag.load();
  if (now < count)
    throw UserError(op.loc, fmt::format("wait: the flag is {} but {} is waited for, and no launch before this one "
                                        "signalled it that often ({})", now, count, program_context(f)));
}

}  // namespace linac::interp
