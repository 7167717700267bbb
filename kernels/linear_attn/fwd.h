// Linear attention forward (FlashLinearAttention, docs/ops/linear_attn.md), optionally gated by a
// per-head scalar log-decay g: the kernel in the DSL. The op that runs it is in op.h.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// What one program of the forward walks (the segment-parallel schedule is docs/ops/linear_attn.md,
/// "Segments"): its whole sequence, or one segment of it (grid axis 2), from zero to the segment's
/// state and total log-decay (no outputs), or from the state entering the segment to its outputs.
enum class LinearAttnWalk : uint8_t { sequence, segment_states, segment_outputs };

/// Compile-time configuration of the forward kernel. Every field specializes the kernel.
struct LinearAttnConfig {
  DType dtype = DType::f32;  // q, k, v and o
  int chunk = 64;            // BT: rows per chunk
  int block_k = 64;          // BK >= K (the whole key dim lives in one program; masked past K)
  int block_v = 64;          // BV: value columns per program
  bool gated = false;        // g [B,T,H] present
  bool initial_state = false;
  bool final_state = false;
  bool varlen = false;       // cu_seqlens [N+1] present, B == 1
  int num_warps = 4;
  int num_stages = 2;        // 2: chunk loads are pipelined one iteration ahead (cp.async)
  LinearAttnWalk walk = LinearAttnWalk::sequence;
  int segment = 0;           // rows per segment (a multiple of chunk) when walking segments
  int producer_warps = 0;    // 4: a warpgroup of its own fills the chunk loads' TMA ring (sm_90a)
};

/// Records the forward kernel for `cfg`. Parameters: q k v [g] [h0] [ht] [cu_seqlens] o scale; a
/// segment_states walk takes q k v [g] and writes segment_states [N, segments, H, K, V] (and
/// segment_decays [N, segments, H] when gated) instead of o; a segment_outputs walk reads
/// segment_inputs [N, segments, H, K, V] instead of h0 and writes no final state.
std::shared_ptr<ir::Kernel> build_linear_attn_fwd(const LinearAttnConfig& cfg);


}  // namespace linac
