// DeltaNet and gated DeltaNet backward in chunks: the UT transform recomputed, a forward walk storing the state
// before each chunk, a reverse walk storing the state gradient after each chunk, then every chunk's
// gradients in parallel (the equations are at the top of bwd.cpp). Memory: the
// per-chunk states, 2 * T*K*V/chunk elements in the input dtype, plus O(T*D) scratch: linear in T.
#pragma once
#include <cstdint>
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

struct DeltaChunkedBwdConfig {
  DType dtype = DType::f32;
  int chunk = 32;
  int64_t block_k = 64;  // K padded (the whole key dim in every kernel)
  int64_t block_v = 64;  // value columns per program of the walks (delta_rule_wy's U blocks: delta_wy_block_v)
  int64_t full_v = 64;   // V padded
  int64_t chunk_v = 64;  // value columns per step of the per-chunk kernel (delta_bwd_chunk_columns)
  int64_t chunk_k = 64;  // key columns per program of the per-chunk work: under block_k, in two kernels
  int keys_warps = 8;    // warps of build_delta_bwd_chunk_keys (its dots are [chunk, chunk_k])
  int walk_warps = 8;    // warps of the state walks (build_delta_bwd_states, build_delta_bwd_dstates)
  int step_stages = 1;   // pipeline stages of the per-chunk work's value-step loads (2: the next step's are
                         // prefetched): the key-block kernel's, or the one per-chunk kernel's where it steps
  int walk_producer_warps = 0;  // 4: a warpgroup of its own fills the state walks' TMA rings (sm_90a)
  bool gated = false;    // gated_delta_rule: g [B,T,H] in, dg out
  bool initial_state = false;
  bool final_state = false;  // the state pass also stores S after the last chunk (the forward's split schedule)
  bool final_state_grad = false;
  bool initial_state_grad = false;
  bool varlen = false;
  int num_warps = 4;  // of the per-chunk kernel (build_delta_bwd_chunk), and the default of keys_warps
};

/// The state pass: one program per (V block, sequence x head) walks the chunks storing the state before
/// each (h) and V_new (v_new); also the forward's split schedule (delta_rule --config split=1). Gated, the
/// two walks read the gates' sums (gate_b gate_cuts gate_totals, kernels/common/chunk_gate_sums.h) by
/// global chunk, as delta_rule_fwd does.
std::shared_ptr<ir::Kernel> build_delta_bwd_states(const DeltaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_delta_bwd_dstates(const DeltaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_delta_bwd_chunk(const DeltaChunkedBwdConfig& cfg);
/// The per-chunk work in key blocks of chunk_k columns: the value sums per (chunk, key block), then the
/// UT adjoint per chunk (see above build_delta_bwd_chunk_keys in the .cpp).
std::shared_ptr<ir::Kernel> build_delta_bwd_chunk_keys(const DeltaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_delta_bwd_chunk_ut(const DeltaChunkedBwdConfig& cfg);

}  // namespace linac
