// Linear attention forward (FlashLinearAttention, docs/ops/linear_attn.md), optionally gated by a
// per-head scalar log-decay g: the kernel in the DSL. The op that runs it is in op.h.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

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
};

/// Records the forward kernel for `cfg`. Parameters: q k v [g] [h0] [ht] [cu_seqlens] o scale.
std::shared_ptr<ir::Kernel> build_linear_attn_fwd(const LinearAttnConfig& cfg);

}  // namespace linac
