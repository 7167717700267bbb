// Argument checks, kernel memos and launch helpers shared by the ops of the library (configurations:
// config_schema.h).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/op.h"

namespace linac {

/// The sequence layout implied by q/k/v and an optional cu_seqlens.
struct SequenceLayout {
  int64_t B = 0, T = 0, H = 0, K = 0, V = 0;
  int64_t N = 0;          // number of sequences: B, or len(cu_seqlens) - 1 when varlen
  bool varlen = false;
  HostTensor cu_seqlens;  // int32 copy when varlen

  /// Tokens in the longest sequence (T without varlen): the grid of kernels with a program per chunk.
  int64_t longest_sequence() const;
};

/// Checks q [B,T,H,K], k [B,T,H,K], v [B,T,H,V] and cu_seqlens (B == 1, starts at 0, non-decreasing,
/// ends at T); rejects inputs the op does not know. UserError naming the op and the argument otherwise.
SequenceLayout check_qkv_inputs(const std::string& op, const TensorMap& inputs);
/// UserError unless `t` has exactly `shape`.
void check_shape(const std::string& name, const HostTensor& t, const std::vector<int64_t>& shape);
/// The chunk size to use: `requested` if set (must be 16, 32, 64 or 128), else `dflt`.
int checked_chunk_size(std::optional<int> requested, int dflt);
/// Kernels recorded once per configuration key and shared by every later call (the IR is immutable
/// once built). Thread-safe; one per kernel family.
class KernelMemo {
 public:
  std::shared_ptr<ir::Kernel> get(const std::string& key, const std::function<std::shared_ptr<ir::Kernel>()>& build);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<ir::Kernel>> kernels_;
};

/// float32 values uniform in [-1, 1) from a fixed seed (fast enough for the largest benchmark shapes).
HostTensor random_uniform(std::vector<int64_t> shape, uint64_t seed);
/// float32 log-decays logsigmoid(3u), u uniform in [-1, 1): values in about (-3.05, -0.05).
HostTensor random_log_decay(std::vector<int64_t> shape, uint64_t seed);

/// Every op reads q, k and v in the kernel dtype (its prepare casts them; gates, betas and states stay
/// f32). Converting them once up front turns each later prepare of the same inputs into a plain copy,
/// which matters where full-size inputs are prepared many times (the tuner: once per candidate).
void cast_qkv(TensorMap& inputs, DType dtype);

/// The tensors every forward plan starts from: q, k, v cast to `dtype`, g and initial_state (when the
/// call has them) in fp32, o [B, T, H, V] and with `final_state` final_state [N, H, K, V] fp32, cu_seqlens.
void add_forward_tensors(OpPlan& plan, const TensorMap& inputs, const SequenceLayout& seq, DType dtype,
                         bool final_state = false);

/// The attention scale: --scale, else K^-1/2.
double attention_scale(const OpOptions& opts, int64_t K);

/// The inputs every backward plan starts from: q, k, v and do in the kernels' dtype, each of the fp32
/// inputs named in `fp32` that was given (gates, betas, initial_state, dfinal_state), and cu_seqlens
/// for varlen.
void add_backward_inputs(OpPlan& plan, const TensorMap& inputs, const SequenceLayout& seq, DType dtype,
                         std::initializer_list<const char*> fp32);

/// A launch of `kernel` on `grid` that binds each of `names` the plan holds to the kernel parameter of
/// the same name (names the plan lacks, e.g. optional states, are skipped), with `scalars`.
KernelLaunch plan_launch(const OpPlan& plan, std::shared_ptr<ir::Kernel> kernel, std::array<int64_t, 3> grid,
                         std::initializer_list<const char*> names, std::map<std::string, double> scalars);
/// The same for kernels that declare exactly the parameters they use: every declared parameter that
/// names a plan tensor is bound to it, and every one named in `scalars` to that value; `renames`
/// (parameter -> plan tensor) binds a parameter to a tensor of another name instead.
KernelLaunch plan_launch(const OpPlan& plan, std::shared_ptr<ir::Kernel> kernel, std::array<int64_t, 3> grid,
                         const std::map<std::string, double>& scalars,
                         const std::map<std::string, std::string>& renames = {});
/// A launch whose tensor parameters bind plan tensors of other names (`tensors`: parameter -> plan
/// tensor): kernels that plans call on tensors of any name (elementwise updates, l2norm) and
/// parameters bound to a sub-plan's renamed tensors.
KernelLaunch bound_launch(std::shared_ptr<ir::Kernel> kernel, std::array<int64_t, 3> grid,
                          std::map<std::string, std::string> tensors, std::map<std::string, double> scalars = {});

/// Whether `--config tokenwise=1` (config_schema.h's tokenwise_key) asks for a backward's token-by-token
/// reference form; the key is taken out of `opts` either way, leaving the rest for the form that runs (0 or
/// absent: the chunked one).
bool take_tokenwise(OpOptions& opts);

/// Chunk offsets per sequence ([N+1]: the first global chunk of each) and (sequence, chunk of it) per
/// global chunk ([chunks, 2]), both int32, for chunks of `rows` rows; returns the number of chunks.
/// Per-chunk tables (delta_rule's h, dh; poly's per-segment states with rows = a segment) are indexed
/// by global chunk.
int64_t chunk_tables(const SequenceLayout& seq, int64_t rows, HostTensor* offsets, HostTensor* indices);

/// The tile size that covers a head dim: the next power of two, at least 16.
int padded_head_dim(int64_t d);
inline bool wants(const std::vector<std::string>& wanted, const std::string& name) {
  for (auto& w : wanted)
    if (w == name) return true;
  return false;
}

}  // namespace linac
