// The backward of the op "poly" (docs/ops/poly.md): the plan of the pairwise form (bwd.h).
#include <cmath>
#include <fmt/format.h>

#include "kernels/common/op_support.h"
#include "kernels/poly/bwd.h"
#include "kernels/poly/op.h"
#include "linac/error.h"

namespace linac {

namespace {

std::shared_ptr<ir::Kernel> cached_poly_bwd(const PolyBwdConfig& cfg, bool q_kernel) {
  static KernelMemo memo;
  return memo.get(fmt::format("{}/{}/{}/{}/{}{}", q_kernel, dtype_name(cfg.dtype), cfg.block_k, cfg.block_v,
                              cfg.normalize, cfg.varlen),
                  [&] { return q_kernel ? build_poly_bwd_q(cfg) : build_poly_bwd_kv(cfg); });
}

}  // namespace

OpPlan plan_poly_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted, double a,
                     double b, double c) {
  if (opts.recurrent) throw UserError("poly: --backward is not implemented with --recurrent");
  if (opts.chunk_size || !opts.config.empty())
    throw UserError("poly --backward runs the pairwise form: --chunk-size and --config do not apply");
  SequenceLayout seq = check_qkv_inputs("poly", inputs);
  if (!inputs.count("do")) throw UserError("poly --backward: missing input 'do' (dL/do, [B,T,H,V])");
  check_shape("do", inputs.at("do"), {seq.B, seq.T, seq.H, seq.V});
  for (const auto& w : wanted)
    if (w != "dq" && w != "dk" && w != "dv") throw UserError(fmt::format("poly --backward produces dq, dk and dv, not '{}'", w));
  PolyBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(seq.K);
  cfg.block_v = padded_head_dim(seq.V);
  cfg.normalize = !opts.no_normalize;
  cfg.varlen = seq.varlen;

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {});
  plan.tensors["dn"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dd"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
  plan.tensors["dq"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));
  const std::array<int64_t, 3> grid = {seq.N * seq.H, 1, 1};
  const std::map<std::string, double> scalars = {{"a", a}, {"b", b}, {"c", c}, {"scale", scale}};
  plan.launches.push_back(plan_launch(plan, cached_poly_bwd(cfg, true), grid,
                                      {"q", "k", "v", "do", "cu_seqlens", "dn", "dd", "dq"}, scalars));
  plan.launches.push_back(plan_launch(plan, cached_poly_bwd(cfg, false), grid,
                                      {"q", "k", "v", "cu_seqlens", "dn", "dd", "dk", "dv"}, scalars));
  for (const char* n : {"dq", "dk", "dv"})
    if (wants(wanted, n)) plan.outputs[n] = n;
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> poly_bwd_kernels(const OpOptions& opts) {
  PolyBwdConfig cfg;
  cfg.dtype = opts.dtype;
  return {cached_poly_bwd(cfg, true), cached_poly_bwd(cfg, false)};
}

}  // namespace linac
