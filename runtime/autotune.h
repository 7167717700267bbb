// The autotuner: picks an op's configuration for a GPU, a problem size and a dtype, and remembers it.
//
// Every candidate of OpDef::tuning_space is compiled (in parallel threads); candidates that do not
// fit (shared memory, register spills) are skipped; each survivor must match the CPU interpreter on
// a small input and give bitwise-identical output on a repeat run before it is timed (CUDA events,
// median) at the real size. The winner is stored in <cache dir>/tuning.db, keyed by op, GPU (name,
// SM count, compute capability), shape bucket (T rounded up to a power of two) and dtype, so later
// runs in any process use it without tuning.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "kernels/op.h"

namespace linac {

struct TuneCandidate {
  Config config;
  std::string status;  // "ok", "fastest", or why it was skipped
  double median_ms = 0;
};

struct TuneResult {
  std::vector<TuneCandidate> candidates;
  Config best;
  double best_ms = 0;
  double seconds = 0;  // wall time of the tuning
  ProblemShape timed;  // the shape the candidates were timed at (T capped; see tune)
};

namespace cuda {
struct DeviceInfo;
}

/// The tuning database key of (op, this GPU, shape bucket, dtype[, the backward]).
std::string tuning_key(const OpDef& op, const ProblemShape& shape, DType dtype, bool backward = false);
/// The same for a given device (tests: no GPU needed).
std::string tuning_key_for(const OpDef& op, const ProblemShape& shape, DType dtype, bool backward,
                           const cuda::DeviceInfo& dev);

/// The stored configuration for the key, if any.
std::optional<Config> lookup_tuned(const std::string& key);

/// What a plan launches: each kernel (kernels are memoized per configuration, so equal configurations
/// share them) and its grid, in order. tune() times one candidate per signature.
std::string launch_signature(const OpPlan& plan);

/// Tunes `op` at `shape` for base.dtype on the GPU and stores the winner. `progress` prints a line
/// per candidate on stderr. UserError if no candidate survives. With base.backward, the backward's
/// configuration (op.bwd_tuning_space; checked on dq, dk, dv from a random do), stored under its own key.
TuneResult tune(const OpDef& op, const ProblemShape& shape, const OpOptions& base, bool progress);

/// The configuration run_op (and bench) use on the GPU: opts.config when given, else the tuning
/// database's entry, else a fresh tuning (stored), unless LINAC_AUTOTUNE=0 (then the op's defaults).
/// Forms with kernels of their own that the tuning space, timed on the forward, does not describe
/// (--chunk-size given, --recurrent, --normalize) keep their defaults: {}; so does the delta rules'
/// training pair (saved_* among the inputs or the `wanted` outputs), whose forward saves at the
/// backward's chunk, which a configuration tuned on the plain forward may not share. --backward uses the
/// database's backward entry when `linac tune OP --backward` made one, else its defaults: it never
/// tunes on first use. Prints the choice when LINAC_PRINT_AUTOTUNING=1.
Config autotuned_config(const OpDef& op, const TensorMap& inputs, const OpOptions& opts,
                        const std::vector<std::string>& wanted = {});

}  // namespace linac
