#include "kernels/linear_attn/normalized_bwd.h"

#include <cmath>
#include <fmt/format.h>

#include "kernels/linear_attn/fwd.h"
#include "kernels/linear_attn/bwd.h"
#include "kernels/linear_attn/normalized.h"
#include "kernels/common/op_support.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {

/// Rows per program of the prep kernel. (At 64 it held three [64, V] f32 tiles in 224 registers per
/// thread and took 0.35 ms at B8 T4096 H16 D128 bf16 on an H200, ~4x its bytes at HBM speed.)
constexpr int64_t kRows = 16;

/// One program per (kRows tokens, batch x head): from do, the numerator N and the denominator
/// D (without eps) of the forward, o = N / (D + eps) and
///   dN = do / (D + eps),   dD = -rowsum(do .* o) / (D + eps)      (fp32; stored in the input dtype)
/// Per token, so varlen needs nothing here (packed sequences are rows of B = 1).
std::shared_ptr<ir::Kernel> build_normalized_bwd_prep(DType dt, int64_t block_v) {
  const DType f32 = DType::f32;
  KernelBuilder kb("linear_attn_normalized_bwd_prep");
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor d_o = kb.tensor("do", dt, 4);
  Tensor num = kb.tensor("num", dt, 4);
  Tensor den = kb.tensor("den", dt, 4);
  Tensor dnum = kb.tensor("dnum", dt, 4);
  Tensor dden = kb.tensor("dden", dt, 4);
  Tile i_t = program_id(0), i_bh = program_id(1);
  Tile H = d_o.dim(2);
  Tile b = i_bh / H, h = i_bh % H, t0 = i_t * kRows;
  Tile DO = load(d_o, {b, t0, h, 0}, {kIndex, kRows, kIndex, block_v}).to(f32);
  Tile N = load(num, {b, t0, h, 0}, {kIndex, kRows, kIndex, block_v}).to(f32);
  Tile inv = 1.0f / (load(den, {b, t0, h, 0}, {kIndex, kRows, kIndex, kIndex}).to(f32) + kNormalizedLinearAttnEps);
  Tile inv2 = expand_dims(inv, 1);
  store(dnum, {b, t0, h, 0}, {kIndex, kRows, kIndex, block_v}, (DO * inv2).to(dt));
  Tile dD = -(sum(DO * (N * inv2), 1) * inv);
  store(dden, {b, t0, h, 0}, {kIndex, kRows, kIndex, kIndex}, dD.to(dt));
  return kb.finish();
}

std::shared_ptr<ir::Kernel> cached_prep(DType dt, int64_t block_v) {
  static KernelMemo memo;
  return memo.get(fmt::format("{}/{}", dtype_name(dt), block_v), [&] { return build_normalized_bwd_prep(dt, block_v); });
}

/// Appends `part`'s launches to `plan`. Its tensors are renamed `prefix + name`, except those named in
/// `shared` (part's name -> plan's name), which are the plan's own: how the sub-plans of one op
/// hand tensors to each other.
void append_plan(OpPlan& plan, OpPlan part, const std::string& prefix, const std::map<std::string, std::string>& shared) {
  auto rename = [&](const std::string& name) {
    auto it = shared.find(name);
    return it != shared.end() ? it->second : prefix + name;
  };
  for (auto& [name, t] : part.tensors)
    if (!shared.count(name)) plan.tensors[prefix + name] = std::move(t);
  for (auto& l : part.launches) {
    for (auto& [param, tensor] : l.tensors) tensor = rename(tensor);
    plan.launches.push_back(std::move(l));
  }
}

}  // namespace

OpPlan plan_linear_attn_normalized_bwd(const TensorMap& inputs, const OpOptions& opts,
                                       const std::vector<std::string>& wanted) {
  SequenceLayout seq = check_qkv_inputs("linear_attn", inputs);
  if (opts.recurrent) throw UserError("linear_attn: --backward is not implemented with --recurrent");
  if (inputs.count("initial_state") || inputs.count("dfinal_state"))
    throw UserError("linear_attn --normalize has no states, so no initial_state or dfinal_state either");
  if (!inputs.count("do")) throw UserError("linear_attn --backward: missing input 'do' (dL/do, [B,T,H,V])");
  check_shape("do", inputs.at("do"), {seq.B, seq.T, seq.H, seq.V});
  const bool gated = inputs.count("g") > 0;
  for (const auto& w : wanted) {
    if (w != "dq" && w != "dk" && w != "dv" && w != "dg")
      throw UserError(fmt::format("linear_attn --normalize --backward produces dq, dk, dv and dg, not '{}'", w));
  }
  if (wants(wanted, "dg") && !gated) throw UserError("linear_attn --backward: -o dg needs the gate input g");
  const DType dt = opts.dtype;

  // o = N / (D + eps) with N = LA(q, k, v) and D = LA(q, k, 1) (both with the scale), so
  //   (dq, dk, dg) = LA_bwd(q, k, v; dN) + LA_bwd(q, k, 1; dD),  dv = LA_bwd(q, k, v; dN)'s dv
  // with dN, dD from the prep kernel: plain linear attention's kernels do all the chunked work, the
  // two backwards in one set of walks (plan_linear_attn_bwd_with_denominator: the dq and dk walks
  // carry D's one-column pair beside N's; measured on an H200 at B8 T4096 H16 D128 bf16, the
  // backward was 2.70 ms as two backwards plus elementwise sums).
  TensorMap base;
  for (const char* name : {"q", "k", "v", "g", "cu_seqlens"})
    if (inputs.count(name)) base[name] = inputs.at(name);
  TensorMap ones_in = base;
  HostTensor ones = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, 1});
  for (int64_t i = 0; i < ones.numel(); ++i) ones.set(i, 1.0);
  ones_in["v"] = ones;

  // The sub-plans are plain linear attention: no normalization, and no noise-dropout (the caller
  // applies it once, to this plan's do).
  OpOptions fwd = opts;
  fwd.noise_dropout.reset();
  fwd.backward = fwd.normalize = false;
  fwd.config.clear();  // the user's --config is for the backward kernels
  fwd.chunk_size.reset();
  OpOptions bwd = opts;
  bwd.noise_dropout.reset();
  bwd.normalize = false;
  const OpDef la = linear_attn_op();

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, dt, {"g"});
  plan.tensors["ones"] = ones.cast(dt);
  const std::map<std::string, std::string> common = {{"q", "q"}, {"k", "k"}, {"g", "g"}, {"cu_seqlens", "cu_seqlens"}};
  auto with = [&](std::map<std::string, std::string> m) {
    m.insert(common.begin(), common.end());
    return m;
  };
  // Forward recomputation: the numerator and the denominator.
  append_plan(plan, la.prepare(base, fwd, {"o"}), "num_", with({{"v", "v"}}));
  append_plan(plan, la.prepare(ones_in, fwd, {"o"}), "den_", with({{"v", "ones"}}));
  // dN, dD.
  plan.tensors["dnum"] = HostTensor::zeros(dt, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dden"] = HostTensor::zeros(dt, {seq.B, seq.T, seq.H, 1});
  KernelLaunch prep;
  prep.kernel = cached_prep(dt, padded_head_dim(seq.V));
  prep.grid = {std::max<int64_t>(1, (seq.T + kRows - 1) / kRows), seq.B * seq.H, 1};
  prep.tensors = {{"do", "do"}, {"num", "num_o"}, {"den", "den_o"}, {"dnum", "dnum"}, {"dden", "dden"}};
  plan.launches.push_back(std::move(prep));
  // Both backwards at once: dq, dk (and dg) come out as the sums.
  std::vector<std::string> grads = {"dq", "dk", "dv"};
  if (gated) grads.push_back("dg");
  TensorMap bwd_in = base;
  bwd_in["do"] = inputs.at("do");
  bwd_in["den_do"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, 1});  // placeholders: the
  bwd_in["ones"] = ones;                                                      // plan's own are bound
  append_plan(plan, plan_linear_attn_bwd_with_denominator(bwd_in, bwd, grads), "",
              with({{"v", "v"}, {"do", "dnum"}, {"den_do", "dden"}, {"ones", "ones"}}));
  for (const auto& name : grads)
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> linear_attn_normalized_bwd_kernels(const OpOptions& opts) {
  // (The walks with the denominator folded in are among linear_attn_bwd_kernels.)
  return {cached_prep(opts.dtype, 64)};
}

}  // namespace linac
