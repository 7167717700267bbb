// Hedgehog linear attention as a user op (linac/user_op.h): the CMake example's DSL kernel
// (hedgehog_kernel.cpp) with a plan, for linac.load() from Python (hedgehog.py).
#include <algorithm>

#include "hedgehog_kernel.cpp"
#include "linac/user_op.h"

LINAC_USER_OP(hedgehog) {
  linac::ops::UserOp op;
  op.summary = "Hedgehog: phi(x) = [softmax(x W_h), softmax(-x W_h)], normalized causal linear attention";
  op.inputs = {"q", "k", "v", "w"};  // q, k [B,T,H,K], v [B,T,H,V], w [H,K,F] (F a power of two >= 16)
  op.outputs = {"o"};
  op.tuning = {{"chunk", {64, 32, 16}}};
  op.plan = [](const linac::ops::UserCall& c) {
    const auto& q = c.inputs.at("q");
    const auto& v = c.inputs.at("v");
    auto pow2 = [](int64_t x) { int64_t p = 16; while (p < x) p *= 2; return p; };
    HedgehogConfig cfg;
    cfg.chunk = static_cast<int>(c.config.at("chunk"));
    cfg.block_k = static_cast<int>(pow2(q.shape[3]));
    cfg.block_v = static_cast<int>(std::min<int64_t>(64, pow2(v.shape[3])));
    cfg.features = static_cast<int>(c.inputs.at("w").shape.at(2));
    cfg.dtype = q.dtype;
    linac::ops::UserPlan p;
    p.outputs["o"] = {q.dtype, v.shape};
    const int64_t value_blocks = (v.shape[3] + cfg.block_v - 1) / cfg.block_v;
    p.launches.push_back({build_hedgehog(cfg), {value_blocks, q.shape[0] * q.shape[2], 1}});
    return p;
  };
  return op;
}
