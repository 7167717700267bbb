#include "kernels/common/l2norm.h"

#include <fmt/format.h>

#include "kernels/common/config_schema.h"
#include "kernels/common/op_support.h"
#include "linac/blocks.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {

/// Rows (tokens) per program: 16 keeps the fp32 kernels at head dim 128 free of spills (32 spilled
/// on sm_90a).
constexpr int64_t kRows = 16;

/// y = x r or dx = (dy - y (y . dy)) r with r = 1 / sqrt(|x|^2 + eps), per row; fp32 inside.
std::shared_ptr<ir::Kernel> build_l2norm(bool backward, DType x_t, DType y_t, int64_t block_d) {
  KernelBuilder kb(backward ? "l2norm_rows_bwd" : "l2norm_rows");
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor x = kb.tensor("x", x_t, 4);
  Tensor y = kb.tensor(backward ? "dy" : "y", y_t, 4);
  Tile eps = kb.scalar("eps", DType::f32);
  Tile i_t = program_id(0), i_bh = program_id(1);
  Tile H = x.dim(2);
  std::vector<Operand> at = {i_bh / H, i_t * kRows, i_bh % H, 0};
  const std::vector<int64_t> block = {kIndex, kRows, kIndex, block_d};
  Tile xs = load(x, at, block).to(DType::f32);
  Tile r = expand_dims(blocks::inverse_norms(xs, 1, eps), 1);
  Tile xn = xs * r;
  if (!backward) {
    store(y, at, block, xn.to(y_t));
  } else {
    Tile dy = load(y, at, block).to(DType::f32);
    store(y, at, block, ((dy - xn * expand_dims(sum(xn * dy, 1), 1)) * r).to(y_t));
  }
  return kb.finish();
}

KernelLaunch launch(const OpPlan& plan, bool backward, const std::string& x, const std::string& y, double eps) {
  const HostTensor& xt = plan.tensors.at(x);
  const HostTensor& yt = plan.tensors.at(y);
  if (xt.rank() != 4 || xt.shape != yt.shape)
    throw InternalError(fmt::format("l2norm of {} {} into {} {}", x, xt.shape_str(), y, yt.shape_str()));
  static KernelMemo memo;
  const int64_t block_d = padded_head_dim(xt.shape[3]);
  auto kernel = memo.get(memo_key(backward, xt.dtype, yt.dtype, block_d),
                         [&] { return build_l2norm(backward, xt.dtype, yt.dtype, block_d); });
  return bound_launch(kernel, {std::max<int64_t>(1, (xt.shape[1] + kRows - 1) / kRows), xt.shape[0] * xt.shape[2], 1},
                      {{"x", x}, {backward ? "dy" : "y", y}}, {{"eps", eps}});
}

}  // namespace

KernelLaunch l2norm_rows_launch(const OpPlan& plan, const std::string& x, const std::string& y, double eps) {
  return launch(plan, false, x, y, eps);
}

KernelLaunch l2norm_rows_bwd_launch(const OpPlan& plan, const std::string& x, const std::string& dy, double eps) {
  return launch(plan, true, x, dy, eps);
}

}  // namespace linac
