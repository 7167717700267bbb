// Gated linear attention forward (docs/ops/gla.md) with a per-channel log-decay g [B,T,H,K]:
//   S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t ;  o_t = scale q_t S_t
// chunked with decay-aware secondary chunking (16-row sub-chunks): the kernels in the DSL and the op.
// gla_chunk prepares every chunk in parallel (its decayed queries and keys, its attention [BT, BT] with
// the diagonal 16x16 blocks at fp32 accuracy, its log-decay); then either gla_fwd walks the chunks with the
// state in registers (the default), or (config split=1, dense inputs) a state pass stores the state
// before every chunk (kernels/gla/split_bwd.h) and gla_out computes all chunks' outputs in parallel.
// The backward (--backward) is in bwd.h, its plans in op_bwd.cpp.
#pragma once
#include <memory>

#include "linac/blocks.h"
#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// Rows per sub-chunk: the diagonal blocks of the intra-chunk attention are this size.
inline constexpr int kGlaSubChunk = 16;
/// The largest spread of a sub-chunk's cumulative gates (per channel, over its 16 rows) for which
/// gla_chunk and gla_bwd_intra compute the diagonal block as a product of factors within exp(+-30)
/// (blocks::gated_scores_diagonal).
inline constexpr double kGlaFactorSpread = blocks::kFactorSpread;

/// What one program of gla_fwd walks (the segment-parallel schedule, kernels/common/segments.h): its
/// whole sequence, or one segment of it (grid axis 2), from zero to the segment's state and its total
/// log-decay per key channel (no outputs), or from the state entering the segment to its outputs.
enum class GlaWalk : uint8_t { sequence, segment_states, segment_outputs };

/// Compile-time configuration of the chunked forward kernels. Every field specializes the kernel.
/// (The op's defaults depend on the head dims: see gla_config in op.cpp.)
struct GlaConfig {
  DType dtype = DType::f32;  // q, k, v and o (g and the states are fp32)
  int chunk = 64;            // BT: rows per chunk, a multiple of kGlaSubChunk
  int block_k = 64;          // BK >= K (the whole key dim lives in one program; masked past K)
  int block_v = 32;          // BV: value columns per program
  bool initial_state = false;
  bool final_state = false;
  bool varlen = false;  // cu_seqlens [N+1] present, B == 1
  int num_warps = 8;
  int num_stages = 1;
  bool split = false;  // the split schedule (a state pass + gla_out; dense inputs only)
  int state_block_k = 0;  // the split schedule's state pass: key columns per program (0: block_k)
  GlaWalk walk = GlaWalk::sequence;
  int segment = 0;        // rows per segment (a multiple of chunk) when walking segments
  int producer_warps = 0;  // 4: a warpgroup of its own fills the walk's TMA ring (sm_90a)
};

/// Records the kernel that prepares every chunk, one program per (chunk, sequence x head): grid (chunks,
/// B * H), or (all sequences' chunks, H) with varlen (chunk_tables' chunk_indices). Writes qg and kg
/// [B, T, H, K] and a [B, T, H, chunk] (dtype), chunk_decay [chunks, H, K] (fp32, chunks numbered over
/// all sequences); the diagonal blocks of a at fp32 accuracy, a product of bounded factors where the
/// gates allow (three tf32 tensor-core products for 16-bit inputs, fp32 FMAs for fp32), else
/// elementwise. Uses dtype, chunk, block_k and varlen. Parameters: q k g [cu_seqlens chunk_indices] qg
/// kg a chunk_decay scale.
std::shared_ptr<ir::Kernel> build_gla_chunk(const GlaConfig& cfg);
/// Records the chunk loop on gla_chunk's operands. Parameters: qg kg v a chunk_decay chunk_offsets
/// [initial_state] [final_state] [cu_seqlens] o scale. A segment_states walk takes kg v chunk_decay
/// chunk_offsets and writes segment_states [N, segments, H, K, V] and segment_decays [N, segments, H, K]
/// instead; a segment_outputs walk reads segment_inputs [N, segments, H, K, V] instead of initial_state
/// and writes no final state.
std::shared_ptr<ir::Kernel> build_gla_fwd(const GlaConfig& cfg);

/// The split schedule's outputs, one program per (chunk, sequence x head, V block) from h and
/// gla_chunk's operands. Parameters: qg v a h o scale.
std::shared_ptr<ir::Kernel> build_gla_out(const GlaConfig& cfg);

}  // namespace linac
