#include "kernels/common/elementwise.h"

#include <fmt/format.h>

#include "kernels/common/config_schema.h"
#include "kernels/common/op_support.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {

/// Tokens per program.
constexpr int64_t kRows = 64;

std::shared_ptr<ir::Kernel> build_update(ElementwiseUpdate kind, DType acc_t, DType x_t, int rank, int64_t block_d) {
  KernelBuilder kb(fmt::format("{}_rank{}", kind == ElementwiseUpdate::add ? "accumulate" : "multiply", rank));
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor acc = kb.tensor("acc", acc_t, rank);
  Tensor x = kb.tensor("x", x_t, rank);
  Tile i_t = program_id(0), i_bh = program_id(1);
  Tile H = acc.dim(2);
  Tile b = i_bh / H, h = i_bh % H, t0 = i_t * kRows;
  std::vector<Operand> at = {b, t0, h};
  std::vector<int64_t> block = {kIndex, kRows, kIndex};
  if (rank == 4) at.push_back(0), block.push_back(block_d);
  Tile a = load(acc, at, block).to(DType::f32), y = load(x, at, block).to(DType::f32);
  store(acc, at, block, (kind == ElementwiseUpdate::add ? a + y : a * y).to(acc_t));
  return kb.finish();
}

/// Elements per program of a conversion.
constexpr int64_t kConvertBlock = 1024;

std::shared_ptr<ir::Kernel> build_convert(DType from, DType to) {
  KernelBuilder kb(fmt::format("convert_{}_to_{}", dtype_name(from), dtype_name(to)));
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor x = kb.tensor("x", from, 1);
  Tensor o = kb.tensor("o", to, 1);
  Tile start = program_id(0) * kConvertBlock;
  Tile v = load(x, {start}, {kConvertBlock});
  store(o, {start}, {kConvertBlock}, from == to ? v : v.to(to));
  return kb.finish();
}

}  // namespace

std::shared_ptr<ir::Kernel> convert_kernel(DType from, DType to) {
  static KernelMemo memo;
  return memo.get(memo_key(from, to), [&] { return build_convert(from, to); });
}

std::array<int64_t, 3> convert_grid(int64_t length) {
  return {std::max<int64_t>(1, (length + kConvertBlock - 1) / kConvertBlock), 1, 1};
}

std::shared_ptr<ir::Kernel> elementwise_update_kernel(ElementwiseUpdate kind, DType acc_t, DType x_t, int rank,
                                                      int64_t block_d) {
  if (rank != 3 && rank != 4) throw InternalError(fmt::format("elementwise update of rank {}", rank));
  static KernelMemo memo;
  // block_d is read at rank 4 only: one kernel for every block_d at rank 3.
  if (rank != 4) block_d = 0;
  return memo.get(memo_key(kind, acc_t, x_t, rank, block_d),
                  [&] { return build_update(kind, acc_t, x_t, rank, block_d); });
}

KernelLaunch elementwise_update_launch(const OpPlan& plan, ElementwiseUpdate kind, const std::string& acc,
                                       const std::string& x) {
  const HostTensor& a = plan.tensors.at(acc);
  const int rank = a.rank();
  return bound_launch(elementwise_update_kernel(kind, a.dtype, plan.tensors.at(x).dtype, rank,
                                                rank == 4 ? padded_head_dim(a.shape[3]) : 0),
                      {std::max<int64_t>(1, (a.shape[1] + kRows - 1) / kRows), a.shape[0] * a.shape[2], 1},
                      {{"acc", acc}, {"x", x}});
}

}  // namespace linac
