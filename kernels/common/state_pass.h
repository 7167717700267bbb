// The state walk of the split schedules (gla and linear_attn backward, gla's forward split): one program
// per (value block, batch x head, key block) walks the chunks, forward or in reverse, storing its block of
// the carried state X before each chunk's update into a per-chunk table, then
//   X = X .* decay (a per-chunk, per-key-row factor, when given) + scale? A_chunk^T B_chunk
// One product per chunk and nothing else on the serial chain: everything that only depends on the chunk
// (the gates' decays, the outputs) is computed in parallel elsewhere. Dense inputs.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// (Names as string literals: a std::string member assigned a short literal trips GCC 12's
/// -Wmaybe-uninitialized at -O3.)
struct StatePassConfig {
  const char* name = "state_pass";  // the kernel's
  DType dtype = DType::f32;     // of a, b and the table
  int chunk = 64;
  int64_t block_k = 32;         // key columns per program (rows of X)
  int64_t block_v = 32;         // value columns per program
  int num_warps = 4;
  int num_stages = 2;
  bool reverse = false;         // walk from the last chunk
  const char* a = "";           // [B, T, H, K] input: X += a^T b per chunk
  const char* b = "";           // [B, T, H, V] input
  const char* decay = nullptr;  // [B, NT, H, K] fp32 factor on X's rows per chunk (nullptr: none)
  bool scaled = false;          // the product times the scalar "scale"
  const char* init = nullptr;   // [N, H, K, V] fp32 starting X (nullptr: zeros)
  const char* last = nullptr;   // [N, H, K, V] fp32: X after the walk (nullptr: not stored)
  const char* table = "";       // [B, NT, H, K, V] in dtype: X before each chunk's update
};

/// Parameters: a b [decay] [init] [last] table [scale].
std::shared_ptr<ir::Kernel> build_state_pass(const StatePassConfig& cfg);

}  // namespace linac
