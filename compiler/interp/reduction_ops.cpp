// Ops that combine elements along an axis: reduce, scan and dot. All of them accumulate in double
// and round to the result dtype at the end (scan: each output), so that the result does not depend
// on an accumulation order that the GPU is free to choose differently.
#include <cmath>
#include <limits>

#include "compiler/interp/frame.h"
#include "compiler/interp/number_formats.h"

namespace linac::interp {
namespace {

/// A tile viewed as [outer, n, inner] around one axis: element (o, k, i) is at (o * n + k) * inner + i.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};

AxisView view_around(const ir::Op& op, const std::vector<int64_t>& shape, int64_t axis) {
  if (axis < 0 || axis >= static_cast<int64_t>(shape.size())) malformed(op, "axis out of range");
  AxisView v;
  for (int64_t d = 0; d < axis; ++d) v.outer *= shape[d];
  v.n = shape[axis];
  for (size_t d = axis + 1; d < shape.size(); ++d) v.inner *= shape[d];
  return v;
}

double combine(ir::ReduceKind kind, double acc, double x) {
  switch (kind) {
    case ir::ReduceKind::sum:
      return acc + x;
    case ir::ReduceKind::max:
      return std::fmax(acc, x);  // NaN-ignoring, like the elementwise max
    case ir::ReduceKind::min:
      return std::fmin(acc, x);
  }
  return acc;
}

double identity(ir::ReduceKind kind) {
  switch (kind) {
    case ir::ReduceKind::sum:
      return 0.0;
    case ir::ReduceKind::max:
      return -std::numeric_limits<double>::infinity();
    case ir::ReduceKind::min:
      return std::numeric_limits<double>::infinity();
  }
  return 0.0;
}

void reduce(const ir::Op& op, const Buffer& in, Buffer& out) {
  const AxisView v = view_around(op, op.operands[0]->type.shape, op.attrs.axis);
  if (static_cast<int64_t>(out.size()) != v.outer * v.inner) malformed(op, "result shape does not drop the axis");
  const ir::ReduceKind kind = op.attrs.reduce;
  // Walk k outermost within each outer slice so both reads and the accumulator row are contiguous.
  for (int64_t o = 0; o < v.outer; ++o) {
    double* acc = out.data() + o * v.inner;
    for (int64_t i = 0; i < v.inner; ++i) acc[i] = identity(kind);
    for (int64_t k = 0; k < v.n; ++k) {
      const double* row = in.data() + (o * v.n + k) * v.inner;
      for (int64_t i = 0; i < v.inner; ++i) acc[i] = combine(kind, acc[i], row[i]);
    }
  }
}

void scan(const ir::Op& op, const Buffer& in, Buffer& out) {
  const AxisView v = view_around(op, op.operands[0]->type.shape, op.attrs.axis);
  if (out.size() != in.size()) malformed(op, "scan changes the shape");
  const ir::ReduceKind kind = op.attrs.reduce;
  const DType t = op.result()->type.dtype;
  std::vector<double> acc(v.inner);
  for (int64_t o = 0; o < v.outer; ++o) {
    std::fill(acc.begin(), acc.end(), identity(kind));
    for (int64_t step = 0; step < v.n; ++step) {
      const int64_t k = op.attrs.reverse ? v.n - 1 - step : step;  // reverse: suffix sums
      const int64_t base = (o * v.n + k) * v.inner;
      for (int64_t i = 0; i < v.inner; ++i) {
        acc[i] = combine(kind, acc[i], in[base + i]);
        out[base + i] = acc[i];  // rounded below; the running value stays unrounded
      }
    }
  }
  round_in_place(t, out.data(), out.size());
}

/// c[M,N] = a[M,K] b[K,N] in the i-k-j order: the inner loop runs over contiguous rows of b and of
/// the accumulator, which the compiler vectorizes. Products of f32 (or narrower) values are exact in
/// double, so only the sum rounds, and only in the final conversion to f32.
void dot(const ir::Op& op, const Frame& f, Buffer& out) {
  if (op.operands.size() != 2) malformed(op, "expected two operands");
  const std::vector<int64_t>& as = op.operands[0]->type.shape;
  const std::vector<int64_t>& bs = op.operands[1]->type.shape;
  const std::vector<int64_t>& cs = op.result()->type.shape;
  if (as.size() != 2 || bs.size() != 2 || cs.size() != 2 || as[1] != bs[0] || cs[0] != as[0] || cs[1] != bs[1])
    malformed(op, "dot shapes do not match [M,K] x [K,N] -> [M,N]");
  const int64_t m = as[0], kk = as[1], n = bs[1];
  const double* a = f.operand(op, 0).data();
  const double* b = f.operand(op, 1).data();
  for (int64_t i = 0; i < m; ++i) {
    double* __restrict acc = out.data() + i * n;
    for (int64_t j = 0; j < n; ++j) acc[j] = 0.0;
    for (int64_t k = 0; k < kk; ++k) {
      const double aik = a[i * kk + k];
      const double* __restrict brow = b + k * n;
      for (int64_t j = 0; j < n; ++j) acc[j] += aik * brow[j];
    }
  }
  round_in_place(op.result()->type.dtype, out.data(), out.size());
}

}  // namespace

void eval_reduction(const ir::Op& op, Frame& f) {
  Buffer& out = f.result(op);
  switch (op.code) {
    case ir::OpCode::Reduce:
      if (op.operands.size() != 1) malformed(op, "expected one operand");
      reduce(op, f.operand(op, 0), out);
      round_in_place(op.result()->type.dtype, out.data(), out.size());
      return;
    case ir::OpCode::Scan:
      if (op.operands.size() != 1) malformed(op, "expected one operand");
      return scan(op, f.operand(op, 0), out);
    case ir::OpCode::Dot:
      return dot(op, f, out);
    default:
      malformed(op, "not a reduction");
  }
}

}  // namespace linac::interp
