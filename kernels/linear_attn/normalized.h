// Normalized linear attention (docs/ops/linear_attn.md), `linac run linear_attn --normalize`:
//   o_t = scale q_t S_t / (scale q_t z_t + eps),  z_t = exp(g_t) z_{t-1} + k_t  (g = 0 without a gate)
// with S_t as in linear attention and eps = kNormalizedLinearAttnEps. The denominator is fp32. It can
// be near zero or negative unless q . k > 0 (e.g. positive feature maps such as elu + 1): the kernel
// does not check. No initial or final state (the normalizer z would have to travel with S): the
// op rejects them with --normalize.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// Added to the denominator scale q_t . z_t.
inline constexpr double kNormalizedLinearAttnEps = 1e-6;

/// Compile-time configuration of the normalized forward kernel. Every field specializes the kernel.
struct LinearAttnNormalizedConfig {
  DType dtype = DType::f32;  // q, k, v and o
  int chunk = 64;            // BT: rows per chunk
  int block_k = 64;          // BK >= K (masked past K)
  int block_v = 64;          // BV: value columns per program
  bool gated = false;        // g [B,T,H] present
  bool varlen = false;       // cu_seqlens [N+1] present, B == 1
  int num_warps = 4;
  int num_stages = 2;
  int segment = 0;           // rows per segment (a multiple of chunk); 0: one walk per sequence
};

/// Records the normalized forward kernel. Parameters: q k v [g] [cu_seqlens] o scale. With segments
/// (kernels/common/segments.h; dense inputs), one program per (V block, sequence x head, segment) walks
/// its segment from the states entering it: also segment_inputs [N, segments, H, K, V] (S) and
/// normalizer_inputs [N, segments, H, K, 1] (z), both fp32.
std::shared_ptr<ir::Kernel> build_linear_attn_normalized_fwd(const LinearAttnNormalizedConfig& cfg);

}  // namespace linac
