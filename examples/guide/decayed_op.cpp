// docs/dsl-guide.md, "From Python": decayed linear attention token by token, o_t = q_t S_t with
// S_t = 0.9 S_{t-1} + k_t^T v_t, head dims up to 64; one program per (batch row, head).
#include "linac/dsl.h"
#include "linac/user_op.h"
using namespace linac::dsl;

LINAC_USER_OP(decayed) {
  linac::ops::UserOp op;
  op.inputs = {"q", "k", "v"};
  op.outputs = {"o"};
  op.plan = [](const linac::ops::UserCall& c) {
    const auto& q = c.inputs.at("q");
    KernelBuilder kb("decayed");
    const linac::DType dt = q.dtype, f32 = linac::DType::f32;
    Tensor tq = kb.tensor("q", dt, 4), tk = kb.tensor("k", dt, 4), tv = kb.tensor("v", dt, 4);
    Tensor to = kb.tensor("o", dt, 4);
    Tile b = program_id(0) / tq.dim(2), h = program_id(0) % tq.dim(2), S = zeros({64, 64}, f32);
    for_range(0, tq.dim(1), [&](Tile t) {
      auto row = [&](const Tensor& x) { return load(x, {b, t, h, 0}, {kIndex, kIndex, kIndex, 64}).to(f32); };
      S = S * 0.9f + expand_dims(row(tk), 1) * expand_dims(row(tv), 0);
      store(to, {b, t, h, 0}, {kIndex, kIndex, kIndex, 64}, sum(expand_dims(row(tq), 1) * S, 0).to(dt));
    }, S);
    linac::ops::UserPlan p;
    p.outputs["o"] = {dt, c.inputs.at("v").shape};
    p.launches.push_back({kb.finish(), {q.shape[0] * q.shape[2], 1, 1}});
    return p;
  };
  return op;
}
