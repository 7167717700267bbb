// The backward of the op "poly" (docs/ops/poly.md): the plan of the segmented analytic form (bwd.h), or
// with --config tokenwise=1 the pairwise O(T^2) form (bwd_pairwise.h), kept as a reference.
#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "kernels/common/config_schema.h"
#include "kernels/common/op_support.h"
#include "kernels/poly/bwd.h"
#include "kernels/poly/bwd_pairwise.h"
#include "kernels/poly/features.h"
#include "kernels/poly/op.h"
#include "linac/error.h"

namespace linac {

namespace {

/// The pairwise form's configuration (bwd_pairwise.h): nothing tuned (it takes no --config).
const ConfigSchema<PolyBwdConfig>& pairwise_schema() {
  using C = PolyBwdConfig;
  static const ConfigSchema<C> schema(field<&C::dtype>(), field<&C::block_k>(), field<&C::block_v>(),
                                      field<&C::normalize>(), field<&C::varlen>());
  return schema;
}

std::shared_ptr<ir::Kernel> cached_poly_bwd_pairwise(const PolyBwdConfig& cfg, bool q_kernel) {
  static KernelMemo memo;
  return memo.get(pairwise_schema().key(cfg, q_kernel),
                  [&] { return q_kernel ? build_poly_bwd_q(cfg) : build_poly_bwd_kv(cfg); });
}

PolyBwdConfig pairwise_config(const OpOptions& opts, const SequenceLayout& seq) {
  PolyBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(seq.K);
  cfg.block_v = padded_head_dim(seq.V);
  cfg.normalize = !opts.no_normalize;
  cfg.varlen = seq.varlen;
  return cfg;
}

OpPlan plan_pairwise(const OpOptions& opts, const SequenceLayout& seq, OpPlan plan,
                     const std::map<std::string, double>& scalars) {
  if (opts.chunk_size || !opts.config.empty())
    throw UserError("poly --backward runs the pairwise form here (--config tokenwise=1, or fp32 with K > 64): --chunk-size and other --config keys do not apply");
  const PolyBwdConfig cfg = pairwise_config(opts, seq);
  plan.tensors["dn"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["dd"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
  const std::array<int64_t, 3> grid = {seq.N * seq.H, 1, 1};
  plan.launches.push_back(plan_launch(plan, cached_poly_bwd_pairwise(cfg, true), grid,
                                      {"q", "k", "v", "do", "cu_seqlens", "dn", "dd", "dq"}, scalars));
  plan.launches.push_back(plan_launch(plan, cached_poly_bwd_pairwise(cfg, false), grid,
                                      {"q", "k", "v", "cu_seqlens", "dn", "dd", "dk", "dv"}, scalars));
  return plan;
}

}  // namespace

TuningKey poly_tokenwise_key() {
  return tokenwise_key("--backward: 1 = the pairwise O(T^2) form (the reference; fp32 above head dim 64 takes it)");
}

OpPlan plan_poly_bwd(const TensorMap& inputs, const OpOptions& opts_in, const std::vector<std::string>& wanted, double a,
                     double b, double c) {
  if (opts_in.recurrent) throw UserError("poly: --backward is not implemented with --recurrent");
  OpOptions opts = opts_in;
  SequenceLayout seq = check_qkv_inputs("poly", inputs);
  // fp32 at K > 64: the segmented kernels' [128, 128] fp32 tiles (states, their rolled rows, the roll)
  // are more shared memory than a block has; that case takes the pairwise form (slow, O(T^2)).
  const bool pairwise = take_tokenwise(opts) || (opts.dtype == DType::f32 && padded_head_dim(seq.K) > 64);
  if (!inputs.count("do")) throw UserError("poly --backward: missing input 'do' (dL/do, [B,T,H,V])");
  check_shape("do", inputs.at("do"), {seq.B, seq.T, seq.H, seq.V});
  const std::vector<std::string> gradients = {"dq", "dk", "dv", "da", "db", "dc"};
  for (const auto& w : wanted)
    if (std::find(gradients.begin(), gradients.end(), w) == gradients.end())
      throw UserError(fmt::format("poly --backward produces dq, dk, dv, da, db and dc, not '{}'", w));
  const bool coefficient_grads = wants(wanted, "da") || wants(wanted, "db") || wants(wanted, "dc");

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, opts.dtype, {});
  plan.tensors["dq"] = HostTensor::zeros(opts.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(opts.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(opts.dtype, {seq.B, seq.T, seq.H, seq.V});
  for (const char* n : {"dq", "dk", "dv"})
    if (wants(wanted, n)) plan.outputs[n] = n;
  const double scale = attention_scale(opts, seq.K);
  std::map<std::string, double> scalars = {{"a", a}, {"b", b}, {"c", c}, {"scale", scale}};
  if (pairwise) {
    if (coefficient_grads)
      throw UserError("poly --backward: the pairwise form (--config tokenwise=1, or fp32 with K > 64) computes no da, db, dc");
    return plan_pairwise(opts, seq, std::move(plan), scalars);
  }

  // The segmented form: the forward's states (before each segment), dn and dd from a forward pass over
  // the outputs (normalize; else dn = do), the backward's states (after each segment), then dq and dk, dv.
  // One V block: dd and the products with the states' transposes need whole rows of v.
  auto config_of = [&](PolyKernel which) {
    PolyConfig cfg = poly_config(opts, seq.K, seq.V, which, c != 0, /*backward=*/true, coefficient_grads);
    cfg.varlen = seq.varlen;
    return cfg;
  };
  const PolyConfig cfg = config_of(PolyKernel::bwd_dq);
  if (!cfg.quadratic) scalars.erase("c");
  if (coefficient_grads)
    for (const char* n : {"da", "db", "dc"}) {
      plan.tensors[n] = HostTensor::zeros(DType::f32, {1});
      if (wants(wanted, n)) plan.outputs[n] = n;
    }
  // What the forward saved (saved_states, and normalized saved_zstates, saved_den with its o): all of it
  // or none. With it the backward skips the forward's sums and scan and the pass that recomputes the
  // outputs for dn and dd.
  std::vector<std::string> saved_names;
  size_t saved_count = 0;
  for (const auto& t : poly_saved_tensors()) {
    if (t.normalized_only && !cfg.normalize) continue;
    saved_names.push_back(t.name);
    saved_count += inputs.count(t.name);
  }
  if (cfg.normalize) saved_names.push_back("o"), saved_count += inputs.count("o");
  const bool saved = saved_count == saved_names.size();
  if (saved_count > 0 && !saved)
    throw UserError(fmt::format("poly --backward: give all of {} (the forward's, with -o) or none of them",
                                fmt::join(saved_names, ", ")));
  const SegmentedPlan sp = add_segment_tables(plan, seq, cfg);
  if (saved) {
    const std::map<std::string, std::vector<int64_t>> shapes = {
        {"states", {sp.segments, seq.H, sp.blocks, cfg.block_k, seq.V}},
        {"zstates", {sp.segments, seq.H, sp.z_rows, cfg.block_k}},
        {"den", {seq.B, seq.T, seq.H}}};
    for (const auto& t : poly_saved_tensors()) {
      if (t.normalized_only && !cfg.normalize) continue;
      const HostTensor& x = inputs.at(t.name);
      if (x.shape != shapes.at(t.tensor))
        throw UserError(fmt::format("poly --backward: {} has shape {}, expected {} (the forward's at this size, "
                                    "with the same --config segment and head dims)",
                                    t.name, x.shape_str(), fmt::format("[{}]", fmt::join(shapes.at(t.tensor), ", "))));
      plan.tensors[t.tensor] = x.cast(std::string(t.tensor) == "states" ? cfg.dtype : DType::f32);
    }
    if (cfg.normalize) {
      check_shape("o", inputs.at("o"), {seq.B, seq.T, seq.H, seq.V});
      plan.tensors["o"] = inputs.at("o").cast(cfg.dtype);
    }
  } else {
    add_states(plan, seq, cfg, sp, /*reverse=*/false);
  }
  if (sp.segments == 0) return plan;  // every sequence is empty
  add_states(plan, seq, cfg, sp, /*reverse=*/true);
  const std::array<int64_t, 3> per_chunk = {sp.chunks_per_axis, 1, sp.heads_axis};
  auto launch = [&](PolyKernel which, std::array<int64_t, 3> grid, const std::map<std::string, double>& s) {
    plan.launches.push_back(plan_launch(plan, poly_kernel(config_of(which), which), grid, s));
  };
  if (!saved) {
    launch(PolyKernel::sums, sp.sums_grid, {});
    launch(PolyKernel::scan, sp.scan_grid, {});
  }
  if (cfg.normalize) {
    plan.tensors["dn"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
    plan.tensors["dd"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
    if (saved)
      launch(PolyKernel::bwd_from_saved, {sp.chunks_per_axis, sp.heads_axis, 1}, {});
    else
      launch(PolyKernel::bwd_prepare, per_chunk, scalars);
  } else {
    plan.tensors["dn"] = plan.tensors.at("do");
  }
  launch(PolyKernel::bwd_sums, sp.sums_grid, {});
  launch(PolyKernel::bwd_scan, sp.scan_grid, {});
  if (coefficient_grads)
    plan.tensors["coef_partials"] = HostTensor::zeros(DType::f32, {sp.chunks_per_axis * sp.heads_axis, kSumColumns});
  launch(PolyKernel::bwd_dq, {sp.chunks_per_axis, sp.heads_axis, 1}, scalars);
  if (coefficient_grads) launch(PolyKernel::bwd_coefficients, {1, 1, 1}, {});
  launch(PolyKernel::bwd_dkv, {sp.chunks_per_axis, sp.heads_axis, 1}, scalars);
  return plan;
}

std::vector<std::shared_ptr<ir::Kernel>> poly_bwd_kernels(const OpOptions& opts) {
  // The segmented form at K = V = 64 and 128, one V block as its plan has.
  std::vector<std::shared_ptr<ir::Kernel>> out;
  for (int64_t d : {64, 128}) {
    if (d > 64 && opts.dtype == DType::f32) continue;  // the pairwise form's (plan_poly_bwd)
    for (PolyKernel which : {PolyKernel::bwd_prepare, PolyKernel::bwd_from_saved, PolyKernel::bwd_sums, PolyKernel::bwd_scan, PolyKernel::bwd_dq,
                             PolyKernel::bwd_dkv}) {
      out.push_back(poly_kernel(poly_config(opts, d, d, which, true, /*backward=*/true), which));
    }
  }
  // dq with the coefficients' gradients (at the chunks of 64 its plan gives it), and their sum.
  for (PolyKernel which : {PolyKernel::bwd_dq, PolyKernel::bwd_coefficients}) {
    out.push_back(poly_kernel(poly_config(opts, 64, 64, which, true, /*backward=*/true, /*coefficient_grads=*/true), which));
  }
  // The pairwise form: its 16-bit variants spill 4-16 bytes on sm_80 / sm_90a (ptxas keeps them at
  // 32-64 registers, at 2 or 4 warps alike): left out of the zero-spill list, like linear_attn's fp32
  // backward, until they do not.
  if (opts.dtype == DType::f32) {
    PolyBwdConfig pairwise;
    pairwise.dtype = opts.dtype;
    out.push_back(cached_poly_bwd_pairwise(pairwise, true));
    out.push_back(cached_poly_bwd_pairwise(pairwise, false));
  }
  return out;
}

}  // namespace linac
