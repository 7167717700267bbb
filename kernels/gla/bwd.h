// GLA backward in chunks (the equations are at the top of bwd.cpp): an intra-chunk
// kernel over every chunk in parallel, walks shaped like the forward (dq forward in time; dk and dv
// backward, in one walk where the state is whole) that recompute the state rather than store it, and
// a dg walk. Memory O(T*D).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

struct GlaChunkedBwdConfig {
  DType dtype = DType::f32;
  int chunk = 16;        // rows per step of the walks and per program of gla_bwd_intra (16, 32, 64)
  int64_t block_k = 64;  // K padded
  int64_t block_v = 64;  // V padded
  int64_t split_k = 64;  // key columns per program of the dq and dk walks
  int64_t split_v = 64;  // value columns per program of the dv walk
  bool initial_state = false;
  bool final_state_grad = false;
  bool initial_state_grad = false;
  bool varlen = false;
  int num_warps = 4;     // of the walks
  int walk_stages = 2;   // the walks' chunk loads pipelined one chunk ahead (2) or not (1)
  int walk_producer_warps = 0;  // 4: a warpgroup of its own fills the walks' TMA ring (sm_90a)
  int intra_warps = 4;   // of gla_bwd_intra
  bool take = true;      // gla_bwd_intra picks dA's entries with take (false: masked row sums)
  bool fuse_dkdv = true; // one walk for dk and dv where both blocks are whole (false: two walks)
  bool dg_in_walk = true; // the fused dk/dv walk forms dg from the dq walk's q .* dq (false: gla_bwd_dg)
  // The split schedule (split_bwd.h; dense inputs): state passes in blocks of state_block_k x
  // state_block_v, then every chunk's gradients in parallel.
  bool split = false;
  int64_t state_block_k = 32;
  int64_t state_block_v = 32;
  int state_stages = 2;  // the state passes' chunk loads pipelined one chunk ahead (2) or not (1)
};

/// The walks: dq forward in time; dk and dv backward, separately or (dkdv) in one walk over the whole
/// state, which with dg_in_walk also forms dg from the dq walk's q .* dq.
enum class GlaBwdWalk { dq, dk, dv, dkdv };

std::shared_ptr<ir::Kernel> build_gla_bwd_intra(const GlaChunkedBwdConfig& cfg);
std::shared_ptr<ir::Kernel> build_gla_bwd_walk(const GlaChunkedBwdConfig& cfg, GlaBwdWalk which);
/// gla_bwd_dg: one program per (sequence x head, block of gla_dg_columns(block_k) key columns), grid
/// (B * H or N * H, block_k / columns).
std::shared_ptr<ir::Kernel> build_gla_bwd_dg(const GlaChunkedBwdConfig& cfg);
/// Key columns per program of gla_bwd_dg: 32, so that the walks over the suffix sums are many (one per
/// sequence x head left most SMs idle at few heads: docs/ops/gla.md, "Measured").
inline int64_t gla_dg_columns(int64_t block_k) { return std::min<int64_t>(block_k, 32); }

/// Rows per step of a walk that only sums fp32 rows of `columns` (gla_bwd_dg, gla_bwd_dg_offsets): `rows`,
/// halved (down to 16) while a step's tile holds more than 4096 values. Each step's tile is planned
/// three times (two pipelined copies and the reverse cumsum's result): at 8192 values, 197 KB, more than
/// an A100 block's 163 KB (K = 256 at 32 rows, K = 128 at 64).
inline int64_t summing_rows(int64_t rows, int64_t columns) {
  while (rows > 16 && rows * columns > 4096) rows /= 2;
  return rows;
}

}  // namespace linac
