// RetNet retention (Sun et al. 2023, "Retentive Network"), one fixed decay per head:
//   S_t = gamma_h S_{t-1} + k_t^T v_t,   o_t = q_t S_t,   gamma_h = 1 - 2^(-5-h)
#pragma once
#include <memory>

#include "linac/dsl.h"

/// Compile-time parameters: each value gives a different kernel (the runtime shapes B, T, H do not).
struct RetNetConfig {
  int chunk = 64;    // rows per chunk (BT)
  int block_k = 64;  // key dim tile (>= K, a power of two; columns past K load as 0)
  int block_v = 64;  // value columns per program
  linac::DType dtype = linac::DType::f32;  // dtype of q, k, v and o
};

/// The chunked forward kernel. Parameters: q, k [B,T,H,K], v, o [B,T,H,V].
/// Grid: (ceil(V / block_v), B * H).
std::shared_ptr<linac::ir::Kernel> build_retnet(const RetNetConfig& cfg);
