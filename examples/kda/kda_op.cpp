// Kimi Delta Attention as user ops (linac/user_op.h): the CMake example's DSL kernels (kda_kernel.cpp)
// with a plan, for linac.load() from Python (kda.py): `kda` (chunked) and `kda_recurrent`.
#include <algorithm>
#include <cmath>

#include "kda_kernel.cpp"
#include "linac/user_op.h"

namespace {

/// q, k [B,T,H,K], v [B,T,H,V], g [B,T,H,K] and beta [B,T,H] (f32), initial_state [B,H,K,V] (f32,
/// optional) -> o [B,T,H,V], final_state [B,H,K,V] (f32).
linac::ops::UserOp kda_op(bool chunked) {
  linac::ops::UserOp op;
  op.summary = chunked ? "Kimi Delta Attention, chunked: S_t = (I - beta k k^T) diag(exp(g_t)) S_{t-1} + beta k v^T"
                       : "Kimi Delta Attention, token by token (the recurrence as written)";
  op.inputs = {"q", "k", "v", "g", "beta"};
  op.optional_inputs = {"initial_state"};
  op.outputs = {"o", "final_state"};
  if (chunked) op.tuning = {{"chunk", {32, 16, 64}}};
  op.plan = [chunked](const linac::ops::UserCall& c) {
    const auto& q = c.inputs.at("q");
    const auto& v = c.inputs.at("v");
    auto pow2 = [](int64_t x) { int64_t p = 16; while (p < x) p *= 2; return p; };
    KdaConfig cfg;
    if (chunked) cfg.chunk = static_cast<int>(c.config.at("chunk"));
    cfg.block_k = static_cast<int>(pow2(q.shape[3]));
    // The state block [BK, BV] in fp32 at most 64 x 64: at K = 128 and 64 value columns the chunked
    // kernel's fp32 tiles need 236 KB of shared memory, more than a block gets.
    cfg.block_v = static_cast<int>(std::min<int64_t>(std::max<int64_t>(16, 4096 / cfg.block_k), pow2(v.shape[3])));
    cfg.dtype = q.dtype;
    cfg.initial_state = c.inputs.count("initial_state") > 0;
    const int64_t B = q.shape[0], H = q.shape[2];
    linac::ops::UserPlan p;
    p.outputs["o"] = {q.dtype, v.shape};
    p.outputs["final_state"] = {linac::DType::f32, {B, H, q.shape[3], v.shape[3]}};
    const int64_t value_blocks = (v.shape[3] + cfg.block_v - 1) / cfg.block_v;
    p.launches.push_back({chunked ? build_kda_chunked(cfg) : build_kda_recurrent(cfg),
                          {value_blocks, B * H, 1}, {}, {{"scale", 1.0 / std::sqrt(double(q.shape[3]))}}});
    return p;
  };
  return op;
}

}  // namespace

LINAC_USER_OP(kda) { return kda_op(true); }

LINAC_USER_OP(kda_recurrent) { return kda_op(false); }
