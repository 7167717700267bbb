// The op "poly" (docs/ops/poly.md): its registry entry and what its files share. op.cpp holds the
// registry entry and the forward's plans and defaults, op_bwd.cpp the backward's; the kernels they
// launch are in fwd.h and bwd.h (the math alone).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/config_schema.h"
#include "kernels/common/op_support.h"
#include "kernels/op.h"
#include "kernels/poly/fwd.h"

namespace linac {

/// The op "poly" for the registry.
OpDef poly_op();

/// Finite coefficients, and with `normalize` a positive f (c > 0 with b^2 < 4ac, or b = c = 0 < a):
/// UserError naming the coefficients otherwise.
void check_poly_coefficients(double a, double b, double c, bool normalize);

/// poly's kernels.
enum class PolyKernel {
  sums, scan, out, recurrent, bwd_sums, bwd_scan, bwd_prepare, bwd_from_saved, bwd_dq, bwd_dkv, bwd_coefficients
};

/// What the forward saves for the backward (outputs saved_*, --backward inputs of the same names with
/// the forward's o): the states before each segment and, normalized, their normalizer and den.
struct PolySavedTensor {
  const char* name;    // saved_states, saved_zstates, saved_den
  const char* tensor;  // the plan tensor that holds it on both sides
  const char* shape;   // as `linac list` shows it
  bool normalized_only;
};
const std::vector<PolySavedTensor>& poly_saved_tensors();

/// Kernel `which` at `cfg`, recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> poly_kernel(const PolyConfig& cfg, PolyKernel which);

/// The configuration of kernel `which` for head dims K, V (opts.config and --chunk-size override the
/// defaults, for every kernel alike); `quadratic`: c != 0; `backward`: for a kernel of the backward's plan
/// (whole rows of V), `coefficient_grads`: a plan that also computes da, db, dc (its dq sums them). The
/// pipeline stages are the first proposal whose plan fits the call's GPU (varlen aside, which the
/// caller sets and which plans the same shared memory).
PolyConfig poly_config(const OpOptions& opts, int64_t K, int64_t V, PolyKernel which, bool quadratic = true,
                       bool backward = false, bool coefficient_grads = false);

/// The segmented schedule's tables in a plan (fwd.h): segment and chunk tables with varlen, the
/// per-segment sums scratch, and the launch grids.
struct SegmentedPlan {
  int64_t segments = 0, chunks = 0, blocks = 0, z_rows = 0, v_blocks = 0;
  int64_t chunks_per_axis = 0, heads_axis = 0;  // per-chunk grids: (chunks_per_axis, .., heads_axis)
  std::array<int64_t, 3> sums_grid{}, scan_grid{};
};
/// Adds the tables for `cfg` (nothing when every sequence is empty: segments == 0).
SegmentedPlan add_segment_tables(OpPlan& plan, const SequenceLayout& seq, const PolyConfig& cfg);
/// Adds the per-segment states the scan writes: before each segment (states, zstates) or, `reverse`,
/// after it (rstates, rzstates).
void add_states(OpPlan& plan, const SequenceLayout& seq, const PolyConfig& cfg, const SegmentedPlan& sp, bool reverse);

/// The backward's switch to the pairwise form (take_tokenwise reads it).
TuningKey poly_tokenwise_key();

/// The plan of `linac run poly --backward` for coefficients a, b, c.
OpPlan plan_poly_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted, double a,
                     double b, double c);
/// The backward's kernels at head dims 64 and 128 (the segmented ones, then in fp32 the pairwise form's
/// at 64), for dump/compile and the ptxas check.
std::vector<std::shared_ptr<ir::Kernel>> poly_bwd_kernels(const OpOptions& opts);

}  // namespace linac
