// The token-by-token (decode) form of the gated linear-attention family (docs/ops/README.md), what
// `linac run linear_attn|gla --recurrent` runs: one program per (V block, sequence x head) walks the
// tokens of its sequence with the state S [BK, BV] in fp32 registers,
//   S = exp(g_t) S + k_t^T v_t ;  o_t = scale q_t S
// where exp(g_t) is 1 (no gate), a scalar (linear_attn's per-head gate) or a [K] column of row scales
// (gla's per-channel gate). Same inputs, outputs and state conventions as the chunked forms, so the
// two must agree to rounding. Elementwise products and a reduction over K instead of a dot: a
// one-row dot has no tensor-core shape. The kernel in the DSL; its plan is in recurrent_op.h.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// How the decay of a token is given.
enum class RecurrentGate {
  none,     // no g
  scalar,   // g [B,T,H]: one log-decay per token and head
  channel,  // g [B,T,H,K]: one log-decay per token, head and key channel
};

/// Compile-time configuration of the recurrent kernel. Every field specializes the kernel.
struct RecurrentConfig {
  DType dtype = DType::f32;  // q, k, v and o
  int block_k = 64;          // BK >= K (masked past K)
  int block_v = 64;          // BV: value columns per program
  RecurrentGate gate = RecurrentGate::none;
  bool initial_state = false;
  bool final_state = false;
  bool varlen = false;  // cu_seqlens [N+1] present, B == 1
  int num_warps = 4;
};

/// Records the recurrent kernel. Parameters: q k v [g] [initial_state] [final_state] [cu_seqlens] o scale.
std::shared_ptr<ir::Kernel> build_recurrent_fwd(const RecurrentConfig& cfg);

}  // namespace linac
