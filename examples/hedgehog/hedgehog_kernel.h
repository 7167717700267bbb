// Hedgehog linear attention (Zhang et al. 2024, "The Hedgehog & the Porcupine"): a learned feature
// map phi(x) = [softmax(x W_h), softmax(-x W_h)] (softmax over the F features) replaces softmax
// attention, with the normalized causal linear-attention output
//   S_t = S_{t-1} + phi(k_t)^T v_t,   z_t = z_{t-1} + phi(k_t),   o_t = phi(q_t) S_t / (phi(q_t) . z_t)
#pragma once
#include <memory>

#include "linac/dsl.h"

/// Compile-time parameters: each value gives a different kernel (the runtime shapes B, T, H do not).
struct HedgehogConfig {
  int chunk = 64;     // rows per chunk (BT)
  int block_k = 64;   // key dim tile (>= K, a power of two; columns past K load as 0)
  int block_v = 64;   // value columns per program
  int features = 32;  // F, features per half of phi (a power of two): phi(x) has 2F entries
  linac::DType dtype = linac::DType::f32;  // dtype of q, k, v, w and o
};

/// The chunked forward kernel. Parameters: q, k [B,T,H,K], v [B,T,H,V], w [H,K,F], o [B,T,H,V].
/// Grid: (ceil(V / block_v), B * H).
std::shared_ptr<linac::ir::Kernel> build_hedgehog(const HedgehogConfig& cfg);
