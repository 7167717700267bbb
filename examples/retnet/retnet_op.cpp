// RetNet retention as a user op (linac/user_op.h): the CMake example's DSL kernel (retnet_kernel.cpp)
// with a plan, for linac.load() from Python (retnet.py).
#include <algorithm>

#include "linac/user_op.h"
#include "retnet_kernel.cpp"

LINAC_USER_OP(retnet) {
  linac::ops::UserOp op;
  op.summary = "RetNet retention: S_t = gamma_h S_{t-1} + k_t^T v_t, o_t = q_t S_t, gamma_h = 1 - 2^(-5-h)";
  op.inputs = {"q", "k", "v"};
  op.outputs = {"o"};
  op.tuning = {{"chunk", {64, 32, 16, 128}}};
  op.plan = [](const linac::ops::UserCall& c) {
    const auto& q = c.inputs.at("q");
    const auto& v = c.inputs.at("v");
    auto pow2 = [](int64_t x) { int64_t p = 16; while (p < x) p *= 2; return p; };
    RetNetConfig cfg;
    cfg.chunk = static_cast<int>(c.config.at("chunk"));
    cfg.block_k = static_cast<int>(pow2(q.shape[3]));
    cfg.block_v = static_cast<int>(std::min<int64_t>(64, pow2(v.shape[3])));
    cfg.dtype = q.dtype;
    linac::ops::UserPlan p;
    p.outputs["o"] = {q.dtype, v.shape};
    const int64_t value_blocks = (v.shape[3] + cfg.block_v - 1) / cfg.block_v;
    p.launches.push_back({build_retnet(cfg), {value_blocks, q.shape[0] * q.shape[2], 1}});
    return p;
  };
  return op;
}
