// DeltaNet and gated DeltaNet backward in chunks: the UT transform recomputed, a forward walk storing the state
// before each chunk, a reverse walk storing the state gradient after each chunk, then every chunk's
// gradients in parallel (the equations are at the top of delta_rule_chunked_bwd.cpp). Memory: the
// per-chunk states, 2 * T*K*V/chunk elements in the input dtype, plus O(T*D) scratch: linear in T.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/op.h"
#include "kernels/common/op_support.h"

namespace linac {

/// Sequences x heads up to which the delta rules' walks (forward and backward) default to 64-column
/// value blocks instead of 128 (more programs where few heads leave SMs idle).
inline constexpr int64_t kDeltaFewHeads = 64;

struct DeltaChunkedBwdConfig {
  DType dtype = DType::f32;
  int chunk = 32;
  int64_t block_k = 64;  // K padded (the whole key dim in every kernel)
  int64_t block_v = 64;  // value columns per program of the walks (and of delta_rule_wy's u blocks)
  int64_t full_v = 64;   // V padded
  int64_t chunk_v = 64;  // value columns per step of the per-chunk kernel (delta_bwd_chunk_columns)
  int64_t chunk_k = 64;  // key columns per program of the per-chunk work: under block_k, in two kernels
  int keys_warps = 8;    // warps of build_delta_bwd_chunk_keys (its dots are [chunk, chunk_k])
  int keys_stages = 1;   // pipeline stages of its value-step loads (2: the next step's are prefetched)
  bool gated = false;    // gated_delta_rule: g [B,T,H] in, dg out
  bool initial_state = false;
  bool final_state = false;  // the state pass also stores S after the last chunk (the forward's split schedule)
  bool final_state_grad = false;
  bool initial_state_grad = false;
  bool varlen = false;
  int num_warps = 4;
};

/// The state pass: one program per (V block, sequence x head) walks the chunks storing the state before
/// each (h) and V_new (v_new); also the forward's split schedule (delta_rule --config split=1).
std::shared_ptr<ir::Kernel> build_delta_bwd_states(const DeltaChunkedBwdConfig& cfg);
/// build_delta_bwd_states, recorded once per configuration.
std::shared_ptr<ir::Kernel> delta_state_pass_kernel(const DeltaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_delta_bwd_dstates(const DeltaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_delta_bwd_chunk(const DeltaChunkedBwdConfig& cfg);
/// The per-chunk work in key blocks of chunk_k columns: the value sums per (chunk, key block), then the
/// UT adjoint per chunk (see above build_delta_bwd_chunk_keys in the .cpp).
std::shared_ptr<ir::Kernel> build_delta_bwd_chunk_keys(const DeltaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_delta_bwd_chunk_ut(const DeltaChunkedBwdConfig& cfg);

/// Chunk offsets per sequence ([N+1]: the first global chunk of each) and (sequence, chunk of it) per
/// global chunk ([chunks, 2]), both int32, for chunks of BT rows; returns the number of chunks. The
/// per-chunk state tables (h, dh) are indexed by global chunk.
int64_t delta_chunk_tables(const SequenceLayout& seq, int64_t BT, HostTensor* offsets, HostTensor* indices);

/// One of the forward's tensors that the backward takes instead of recomputing it (an output of the
/// forward, an input of --backward), in the input dtype.
struct DeltaSavedTensor {
  std::string name;    // saved_w, saved_t, saved_h, saved_v_new
  std::string tensor;  // the plan tensor that holds it on both sides (w, t_mat, h, v_new)
  const char* shape;   // as `linac list` shows it
  const char* what;
};
const std::vector<DeltaSavedTensor>& delta_saved_tensors();

/// Value columns per step of the per-chunk kernel for V padded to full_v: all of them while its shared
/// memory allows, else steps that divide full_v.
int64_t delta_bwd_chunk_columns(DType dtype, int64_t full_v);

/// Key columns per program of the per-chunk work for K padded to block_k: all of them (one kernel) up to
/// 128, blocks of 128 above (two kernels: build_delta_bwd_chunk_keys).
int64_t delta_bwd_chunk_key_columns(int64_t block_k, bool gated);
/// Pipeline stages of the key-block kernel's value steps by default (2: the next step prefetched).
int delta_bwd_keys_stages(DType dtype);

/// The backward's default chunk for head dims K, V in `dtype` (the per-chunk kernel's shared memory).
int delta_bwd_default_chunk(DType dtype, int64_t K, int64_t V);

/// Tuning keys of the chunked backward (chunk, bv, warps).
const std::vector<std::pair<std::string, std::string>>& delta_chunked_bwd_config_keys();

/// The plan of `linac run delta_rule|gated_delta_rule ... --backward` (inputs checked by the caller:
/// beta, do and for the gated form g present).
OpPlan plan_delta_rule_chunked_bwd(bool gated, const TensorMap& inputs, const OpOptions& opts,
                                   const std::vector<std::string>& wanted);

/// Representative kernels (head dim 64, plain and with every option) for dump/compile and test_ptxas.
std::vector<std::shared_ptr<ir::Kernel>> delta_chunked_bwd_kernels(bool gated, const OpOptions& opts);

}  // namespace linac
