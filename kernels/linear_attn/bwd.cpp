#include "kernels/linear_attn/bwd.h"

#include <cmath>
#include <fmt/format.h>
#include <map>

#include "kernels/linear_attn/split_bwd.h"
#include "kernels/common/log_decay.h"
#include "kernels/common/op_support.h"
#include "kernels/common/sequence_bounds.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

// Notation (one sequence, one head): S_t = a_t S_{t-1} + k_t^T v_t, a_t = exp(g_t), o_t = scale q_t S_t,
// dH_t = dL/dS_t = scale q_t^T do_t + a_{t+1} dH_{t+1}, seeded by dS_T = dfinal_state. Then
//   dq_t = scale do_t S_t^T,  dk_t = v_t dH_t^T,  dv_t = k_t dH_t,  dinitial_state = a_1 dH_1,
//   dg_t = sum_{s>=t} (q_s.dq_s - k_s.dk_s) + <dfinal_state, S_T>   (= a_t <dH_t, S_{t-1}>).
//
// Each of dq, dk, dv is a walk with the shape of the forward, out = a X + ((a b^T) .* D) c and
// X <- decay X + b^T c, for roles (a, b, c) and a state X that needs no transpose:
//   dq: forward walk, a = do, b = v, c = k, X = S^T [V, K]   (dq = scale (do S^T + (do v^T .* M) k))
//   dk: reverse walk, a = v, b = do, c = q, X = dH^T [V, K]  (dk = v dH^T + scale (v do^T .* M^T) q)
//   dv: reverse walk, a = k, b = q, c = do, X = dH [K, V]    (dv = k dH + scale (k q^T .* M^T) do)
// The contraction a.b runs over a whole head dim; c, out and X's columns are split in blocks across
// programs (bk for dq and dk, bv for dv), so a head is spread over K/bk or V/bv programs. Per chunk,
// b is the chunk-local cumulative log-decay (zeros without a gate) and b_C its last row: forward walks
// weigh the state term by exp(b_r), pairs by exp(b_r - b_s) (s <= r) and the update rows by
// exp(b_C - b_s); reverse walks by exp(b_C - b_r), exp(b_s - b_r) (s >= r) and exp(b_s).
// dg's row sums (q.dq, k.dk) are split the same way: each dq/dk program writes its block's partial
// sum, and a last kernel adds the blocks in a fixed order and takes the suffix sums (deterministic).

namespace {

/// A block loaded (or stored) transposed: the state's rows c0.. as columns.
const AccessOptions kTransposed{.limits = {}, .transpose = true};

struct WalkRoles {
  const char* name;
  bool reverse;
  const char* a;
  const char* b;
  const char* c;
  const char* out;
  bool state_rows_k;  // X is [K, BC] (dv) rather than [V, BC] (dq, dk)
  const char* a2;     // the denominator's pair (LinearAttnBwdConfig::denominator), one column each
  const char* b2;
};

WalkRoles roles_of(LinearAttnBwdKernel which) {
  switch (which) {
    case LinearAttnBwdKernel::dq: return {"linear_attn_bwd_dq", false, "do", "v", "k", "dq", false, "den_do", "ones"};
    case LinearAttnBwdKernel::dk: return {"linear_attn_bwd_dk", true, "v", "do", "q", "dk", false, "ones", "den_do"};
    case LinearAttnBwdKernel::dv: return {"linear_attn_bwd_dv", true, "k", "q", "do", "dv", true, nullptr, nullptr};
    case LinearAttnBwdKernel::dg: break;
  }
  throw InternalError("roles_of: dg is not a walk");
}

std::shared_ptr<ir::Kernel> build_walk(const LinearAttnBwdConfig& cfg, LinearAttnBwdKernel which) {
  const WalkRoles r = roles_of(which);
  const int64_t BT = cfg.chunk;
  const int64_t W = r.state_rows_k ? cfg.block_k : cfg.block_v;  // a and b: a whole head dim
  const int64_t BC = r.state_rows_k ? cfg.split_v : cfg.split_k;  // c, out, X's columns: one block
  const DType dt = cfg.dtype;
  const bool is_dq = which == LinearAttnBwdKernel::dq, is_dk = which == LinearAttnBwdKernel::dk;
  const bool den = cfg.denominator && r.a2;
  constexpr int64_t W2 = 16;  // the denominator pair's one column, padded to the smallest dot
  const bool state_term = cfg.gated && cfg.final_state_grad;  // dg's <dfinal_state, S_T>
  KernelBuilder kb(r.name);
  kb.set_num_warps(cfg.num_warps);
  // One program per SM holds a head's column block for the whole walk: registers over a second block
  // (at 8 warps and 64-row chunks ptxas otherwise caps at 128 registers and spills 12-40 bytes).
  kb.set_min_ctas_per_sm(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor dout = kb.tensor("do", dt, 4);
  Tensor g = cfg.gated ? kb.tensor("g", DType::f32, 3) : Tensor();
  Tensor h0 = is_dq && cfg.initial_state ? kb.tensor("initial_state", DType::f32, 4) : Tensor();
  Tensor dht = (!is_dq && cfg.final_state_grad) || (is_dq && state_term) ? kb.tensor("dfinal_state", DType::f32, 4)
                                                                         : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor den_do = den ? kb.tensor("den_do", dt, 4) : Tensor();
  Tensor ones = den ? kb.tensor("ones", dt, 4) : Tensor();
  Tensor out = kb.tensor(r.out, dt, 4);
  const bool dg_part = cfg.gated && (is_dq || is_dk);
  Tensor part = dg_part ? kb.tensor(is_dq ? "dg_q" : "dg_k", DType::f32, 4) : Tensor();  // [blocks, B, T, H]
  Tensor state_part = is_dq && state_term ? kb.tensor("dg_s", DType::f32, 3) : Tensor();  // [blocks, N, H]
  Tensor dh0 = !is_dq && !is_dk && cfg.initial_state_grad ? kb.tensor("dinitial_state", DType::f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", DType::f32);
  const std::map<std::string, Tensor> by_name = {{"q", q}, {"k", k}, {"v", v}, {"do", dout}, {"den_do", den_do},
                                                 {"ones", ones}};

  Tile i_c = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq_rows = sequence_bounds(q, cu, cfg.varlen, i_n);
  const Tile b = seq_rows.b, bos = seq_rows.bos, eos = seq_rows.eos;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile c0 = i_c * BC;

  // X starts at h0^T (dq) or dfinal_state^T (dk) or dfinal_state (dv): the block of columns c0.. of
  // the state's transpose is the block of rows c0.. of the state, loaded transposed.
  Tile X = zeros({W, BC}, DType::f32);
  if (h0.value()) X = load(h0, {i_n, i_h, c0, 0}, {kIndex, kIndex, BC, W}, kTransposed);
  if (!is_dq && dht.value())
    X = r.state_rows_k ? load(dht, {i_n, i_h, 0, c0}, {kIndex, kIndex, W, BC})
                       : load(dht, {i_n, i_h, c0, 0}, {kIndex, kIndex, BC, W}, kTransposed);

  // The denominator's state: the one-column pair's X (no initial or final state: --normalize has none).
  Tile X2 = den ? zeros({W2, BC}, DType::f32) : Tile();

  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile pairs = r.reverse ? row <= col : row >= col;  // forward: r receives from s <= r; reverse: s >= r
  AccessOptions in_seq{.limits = {{1, eos}}};

  auto body = [&](Tile j) {
    Tile i = r.reverse ? num_chunks - 1 - j : j;
    Tile t0 = bos + i * BT;
    Tile A_ = load(by_name.at(r.a), {b, t0, i_h, 0}, {kIndex, BT, kIndex, W}, in_seq);
    Tile B_ = load(by_name.at(r.b), {b, t0, i_h, 0}, {kIndex, BT, kIndex, W}, in_seq);
    Tile C_ = load(by_name.at(r.c), {b, t0, i_h, c0}, {kIndex, BT, kIndex, BC}, in_seq);
    Tile AB = dot(A_, B_.T());
    Tile A2, B2;  // the denominator's pair: [BT, 16] tiles whose columns past the first load zeros
    if (den) {
      A2 = load(by_name.at(r.a2), {b, t0, i_h, 0}, {kIndex, BT, kIndex, W2}, in_seq);
      B2 = load(by_name.at(r.b2), {b, t0, i_h, 0}, {kIndex, BT, kIndex, W2}, in_seq);
      AB = AB + dot(A2, B2.T());
    }
    Tile P = where(pairs, AB * scale, 0.0f);
    Tile inter, update_rows;  // the state term of out; the rows of b weighted for the state update
    Tile update_rows2;          // the same for the denominator's pair
    Tile decay_all;           // exp(b_C): the state's decay over the chunk
    if (cfg.gated) {
      // Rows past the sequence end load g = 0, so b stops growing there and b_C = b at the last row.
      // Gates of -inf are floored (kernels/common/log_decay.h): b_r - b_c would be -inf - -inf.
      Tile gc = floor_log_decay(load(g, {b, t0, i_h}, {kIndex, BT, kIndex}, in_seq));
      Tile bg = cumsum(gc, 0);
      Tile b_last = sum(gc, 0);
      Tile br = expand_dims(bg, 1), bc = expand_dims(bg, 0);
      // Exponentiate only the pairs that interact: the others would overflow.
      P = P * exp(where(pairs, r.reverse ? bc - br : br - bc, 0.0f));
      Tile row_weight = r.reverse ? exp(b_last - bg) : exp(bg);
      Tile update_weight = r.reverse ? exp(bg) : exp(b_last - bg);
      Tile rows_in = dot(A_, X.to(dt));
      if (den) rows_in = rows_in + dot(A2, X2.to(dt));
      inter = rows_in * expand_dims(row_weight, 1);
      update_rows = (B_.to(DType::f32) * expand_dims(update_weight, 1)).to(dt);
      if (den) update_rows2 = (B2.to(DType::f32) * expand_dims(update_weight, 1)).to(dt);
      decay_all = exp(b_last);
    } else {
      inter = dot(A_, X.to(dt));
      if (den) inter = inter + dot(A2, X2.to(dt));
      update_rows = B_;
      update_rows2 = B2;
    }
    // P carries scale. For dq the state term needs it too; for dk and dv the state dH carries it in
    // its updates (dfinal_state, where it starts, has none).
    Tile O = (is_dq ? inter * scale : inter) + dot(P.to(dt), C_);
    Tile update = dot(update_rows.T(), C_);
    if (!is_dq) update = update * scale;
    X = cfg.gated ? X * decay_all + update : X + update;
    if (den) {
      Tile update2 = dot(update_rows2.T(), C_);
      if (!is_dq) update2 = update2 * scale;
      X2 = cfg.gated ? X2 * decay_all + update2 : X2 + update2;
    }
    store(out, {b, t0, i_h, c0}, {kIndex, BT, kIndex, BC}, O.to(dt), in_seq);
    if (dg_part) {
      // This block's share of q.dq (dq) or k.dk (dk), in fp32 before the gradient is rounded.
      Tile own = load(is_dq ? q : k, {b, t0, i_h, c0}, {kIndex, BT, kIndex, BC}, in_seq);
      store(part, {i_c, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, sum(own.to(DType::f32) * O, 1),
            {.limits = {{2, eos}}});
    }
  };
  if (den)
    for_range(0, num_chunks, body, X, X2);
  else
    for_range(0, num_chunks, body, X);

  if (state_part.value()) {
    Tile dS = load(dht, {i_n, i_h, c0, 0}, {kIndex, kIndex, BC, W}, kTransposed);
    store(state_part, {i_c, i_n, i_h}, {kIndex, kIndex, kIndex}, sum(sum(dS * X, 1), 0));
  }
  // After the reverse walk X = dL/dS_0 = a_1 dH_1 (its last step applied the first chunk's decay).
  if (dh0.value()) store(dh0, {i_n, i_h, 0, c0}, {kIndex, kIndex, W, BC}, X);
  return kb.finish();
}

/// dg_t = sum_{s>=t} (q_s.dq_s - k_s.dk_s) + <dfinal_state, S_T>: adds the per-block partial sums of
/// the dq and dk kernels in block order and takes suffix sums by a reverse walk over the chunks.
std::shared_ptr<ir::Kernel> build_dg(const LinearAttnBwdConfig& cfg) {
  const int64_t BT = cfg.chunk;
  const int64_t blocks = cfg.block_k / cfg.split_k;
  const bool state_term = cfg.final_state_grad;
  KernelBuilder kb("linear_attn_bwd_dg");
  kb.set_num_warps(1);
  Tensor q = kb.tensor("q", cfg.dtype, 4);  // for the sequence bounds (B, T, H)
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor dg_q = kb.tensor("dg_q", DType::f32, 4);
  Tensor dg_k = kb.tensor("dg_k", DType::f32, 4);
  Tensor dg_s = state_term ? kb.tensor("dg_s", DType::f32, 3) : Tensor();
  Tensor dg = kb.tensor("dg", DType::f32, 3);

  Tile i_nh = program_id(0);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq_rows = sequence_bounds(q, cu, cfg.varlen, i_n);
  const Tile b = seq_rows.b, bos = seq_rows.bos, eos = seq_rows.eos;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;

  Tile acc = constant(0.0, DType::f32);
  if (state_term)
    for (int64_t c = 0; c < blocks; ++c) acc = acc + load(dg_s, {c, i_n, i_h}, {kIndex, kIndex, kIndex});
  for_range(0, num_chunks, [&](Tile j) {
    Tile t0 = bos + (num_chunks - 1 - j) * BT;
    AccessOptions in_seq{.limits = {{2, eos}}};
    Tile x = zeros({BT}, DType::f32);
    for (int64_t c = 0; c < blocks; ++c)
      x = x + load(dg_q, {c, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, in_seq) -
          load(dg_k, {c, b, t0, i_h}, {kIndex, kIndex, BT, kIndex}, in_seq);
    store(dg, {b, t0, i_h}, {kIndex, BT, kIndex}, cumsum(x, 0, true) + acc, {.limits = {{1, eos}}});
    acc = acc + sum(x, 0);
  }, acc);
  return kb.finish();
}

}  // namespace

std::shared_ptr<ir::Kernel> build_linear_attn_bwd(const LinearAttnBwdConfig& cfg, LinearAttnBwdKernel which) {
  if (cfg.block_k % cfg.split_k || cfg.block_v % cfg.split_v)
    throw InternalError("linear_attn bwd: the column blocks must divide the padded head dims");
  return which == LinearAttnBwdKernel::dg ? build_dg(cfg) : build_walk(cfg, which);
}

namespace {

/// Defaults measured on an H200 at B8 T4096 H16 D128 bf16 (backward ms, per-kernel medians of dq, dk,
/// dv within 5%): chunk 64 with one program per head (bk = bv = 128, 8 warps) 0.82; chunk 32 at 128
/// 0.91; bk = bv = 64 (two programs per head) 1.19 at 8 warps, 1.04 at 4; 32-column blocks 1.57.
/// Shared memory bounds it: 16-bit gated at chunk 64 and 128 columns plans 175 KB (an H100/H200 block
/// has 227 KB); fp32 tiles are twice as large, so fp32 takes chunks of 32 and 64 columns (168 KB gated;
/// at chunk 64 it needed 292 KB). Gated, 16-bit: chunk 32 at 128 columns 1.76 ms, chunk 64 2.14 (its dq
/// and dk kernels spill 84-96 bytes there; the dg kernel walks twice as many chunks, 0.11 vs 0.24 ms).
int default_bwd_chunk(DType dt, bool gated) { return dt == DType::f32 || gated ? 32 : 64; }
/// fp32 above head dim 128: chunk 16 (the gated walks plan 285 KB of shared memory at 32 with K = V = 256,
/// the normalized ones 238 KB; 176 and 156 KB at 16).
int wide_heads_bwd_chunk(DType dt) { return dt == DType::f32 ? 16 : 32; }
int64_t default_bwd_split(DType dt, int64_t padded) { return std::min<int64_t>(padded, dt == DType::f32 ? 64 : 128); }

std::shared_ptr<ir::Kernel> cached_bwd(const LinearAttnBwdConfig& cfg, LinearAttnBwdKernel which) {
  static KernelMemo memo;
  std::string key = fmt::format("{}/{}/{}/{}/{}/{}/{}/{}{}{}{}{}{}/{}", static_cast<int>(which), dtype_name(cfg.dtype),
                                cfg.chunk, cfg.block_k, cfg.block_v, cfg.split_k, cfg.split_v, cfg.gated,
                                cfg.initial_state, cfg.final_state_grad, cfg.initial_state_grad, cfg.varlen,
                                cfg.denominator, cfg.num_warps);
  return memo.get(key, [&] { return build_linear_attn_bwd(cfg, which); });
}

/// Few (sequence, head) pairs leave SMs idle: each walk program takes a head's column block through every
/// chunk. Below 65 programs per walk the default halves the column blocks (down to 32) until there are
/// more, with chunks of 32 and 4 warps. Measured on an H200 (bf16, backward ms): B2 T16384 H16 D128
/// 3.25 at the defaults, 2.54 at bk = bv = 32 with chunk 64, 1.94 with chunk 32 (gated 6.58 -> 4.32),
/// and `linac tune --backward` chose the same at B4 T2048 H16 D128 (64-column blocks) and B8 T1024 H8
/// D64 (32). From 96 heads on (B1 H96, B8 H16) the wide defaults stand.
int64_t narrowed_split(int64_t split, int64_t padded, int64_t heads) {
  while (heads > 0 && split > 32 && heads * (padded / split) <= 64) split /= 2;
  return split;
}

/// Reads chunk, bk, bv and warps from opts (defaults otherwise) for padded head dims block_k, block_v;
/// `heads` (sequences x heads, 0 when unknown) narrows the default column blocks (narrowed_split).
void configure(LinearAttnBwdConfig& cfg, const OpOptions& opts, int64_t heads = 0) {
  const int64_t wide_k = default_bwd_split(cfg.dtype, cfg.block_k), wide_v = default_bwd_split(cfg.dtype, cfg.block_v);
  const int64_t bk = narrowed_split(wide_k, cfg.block_k, heads), bv = narrowed_split(wide_v, cfg.block_v, heads);
  const bool narrowed = bk < wide_k || bv < wide_v;
  // Head dims over 128: the walks' [chunk, K] and [chunk, V] tiles at chunk 64 take 239616 bytes of shared
  // memory in 16-bit, over an sm_90 block's 232448 (test_default_plans_fit); chunk 32 takes 154624
  // (fp32: wide_heads_bwd_chunk).
  const bool wide_heads = std::max(cfg.block_k, cfg.block_v) > 128;
  cfg.chunk = checked_chunk_size(opts.chunk_size,
                                 wide_heads ? wide_heads_bwd_chunk(cfg.dtype)
                                 : narrowed ? 32 : default_bwd_chunk(cfg.dtype, cfg.gated));
  cfg.chunk = static_cast<int>(config_value(opts, "chunk", cfg.chunk, {16, 32, 64, 128}));
  cfg.split_k = config_value(opts, "bk", bk, {16, 32, 64, 128, 256});
  cfg.split_v = config_value(opts, "bv", bv, {16, 32, 64, 128, 256});
  if (cfg.split_k > cfg.block_k || cfg.split_v > cfg.block_v)
    throw UserError(fmt::format("linear_attn --backward: --config bk={} bv={} exceed the padded head dims {} and {}",
                                cfg.split_k, cfg.split_v, cfg.block_k, cfg.block_v));
  cfg.num_warps = static_cast<int>(config_value(opts, "warps", narrowed ? 4 : 8, {2, 4, 8}));
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& linear_attn_bwd_config_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"chunk", "rows per chunk (16, 32, 64, 128)"},
      {"bk", "--backward: key columns per program of the dq and dk kernels (16..256)"},
      {"bv", "--backward: value columns per program of the dv kernel (16..256)"},
      {"warps", "warps per program (2, 4, 8)"},
      {"split", "--backward: 1 = the split schedule (plain form, head dims up to 128; varlen walks): state passes "
                "storing the state and its gradient per chunk, then every chunk's gradients in parallel"},
      {"sbk", "--backward split=1: key columns per program of the state passes (16..128, default 32)"},
      {"sbv", "--backward split=1: value columns per program of the state passes (16..128, default 32)"},
  };
  return keys;
}

namespace {

/// The split schedule's plan (linear_attn_split_bwd.h): dense inputs, plain form.
OpPlan plan_split_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted,
                      const SequenceLayout& seq, const LinearAttnBwdConfig& walks, double scale) {
  LinearAttnSplitBwdConfig cfg;
  cfg.dtype = walks.dtype;
  // Its own defaults (the walks' narrow ones are for the walks): chunk 64 in 16-bit, 32 in fp32 (the
  // per-chunk kernel holds S and dS' whole); 8 warps.
  cfg.chunk = static_cast<int>(config_value(
      opts, "chunk", checked_chunk_size(opts.chunk_size, cfg.dtype == DType::f32 ? 32 : 64), {16, 32, 64, 128}));
  cfg.block_k = walks.block_k;
  cfg.block_v = walks.block_v;
  cfg.state_block_k = std::min<int64_t>(config_value(opts, "sbk", 32, {16, 32, 64, 128}), cfg.block_k);
  cfg.state_block_v = std::min<int64_t>(config_value(opts, "sbv", 32, {16, 32, 64, 128}), cfg.block_v);
  cfg.state_stages = cfg.dtype == DType::f32 ? 1 : 2;
  cfg.num_warps = static_cast<int>(config_value(opts, "warps", 8, {2, 4, 8}));
  cfg.initial_state = walks.initial_state;
  cfg.final_state_grad = walks.final_state_grad;
  cfg.initial_state_grad = walks.initial_state_grad;
  static KernelMemo memo;
  const std::string key = fmt::format("{}/{}/{}/{}/{}/{}/{}/{}{}{}", dtype_name(cfg.dtype), cfg.chunk, cfg.block_k,
                                      cfg.block_v, cfg.state_block_k, cfg.state_block_v, cfg.num_warps,
                                      cfg.initial_state, cfg.final_state_grad, cfg.initial_state_grad);
  auto kernel = [&](const char* which, auto build) { return memo.get(key + which, [&] { return build(cfg); }); };

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {"initial_state", "dfinal_state"});
  const int64_t chunks = (seq.T + cfg.chunk - 1) / cfg.chunk;
  for (const char* name : {"h", "dh"})
    plan.tensors[name] = HostTensor::zeros(cfg.dtype, {seq.B, std::max<int64_t>(chunks, 1), seq.H, seq.K, seq.V});
  plan.tensors["dq"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  if (cfg.initial_state_grad)
    plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});
  const std::array<int64_t, 3> state_grid{(seq.V + cfg.state_block_v - 1) / cfg.state_block_v, seq.N * seq.H,
                                          (seq.K + cfg.state_block_k - 1) / cfg.state_block_k};
  plan.launches.push_back(plan_launch(plan, kernel("states", build_linear_attn_bwd_states), state_grid, {}));
  plan.launches.push_back(
      plan_launch(plan, kernel("dstates", build_linear_attn_bwd_dstates), state_grid, {{"scale", scale}}));
  if (chunks > 0)
    plan.launches.push_back(plan_launch(plan, kernel("chunk", build_linear_attn_bwd_chunk),
                                        {chunks, seq.N * seq.H, 1}, {{"scale", scale}}));
  for (const char* name : {"dq", "dk", "dv", "dinitial_state"})
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

OpPlan plan_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted,
                bool denominator) {
  SequenceLayout seq = check_qkv_inputs("linear_attn", inputs);
  if (!inputs.count("do")) throw UserError("linear_attn --backward: missing input 'do' (dL/do, [B,T,H,V])");
  check_shape("do", inputs.at("do"), {seq.B, seq.T, seq.H, seq.V});
  const bool gated = inputs.count("g") > 0;
  if (gated) check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H});
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});
  const bool has_dht = inputs.count("dfinal_state") > 0;
  if (has_dht) check_shape("dfinal_state", inputs.at("dfinal_state"), {seq.N, seq.H, seq.K, seq.V});
  for (const auto& w : wanted) {
    if (w != "dq" && w != "dk" && w != "dv" && w != "dg" && w != "dinitial_state")
      throw UserError(fmt::format("linear_attn --backward produces dq, dk, dv, dg and dinitial_state, not '{}'", w));
  }
  if (wants(wanted, "dg") && !gated) throw UserError("linear_attn --backward: -o dg needs the gate input g");

  check_config_keys("linear_attn --backward", opts, linear_attn_bwd_config_keys());
  LinearAttnBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(seq.K);
  cfg.block_v = padded_head_dim(seq.V);
  cfg.gated = gated;
  configure(cfg, opts, seq.N * seq.H);
  cfg.initial_state = has_h0;
  cfg.final_state_grad = has_dht;
  cfg.initial_state_grad = wants(wanted, "dinitial_state");
  cfg.varlen = seq.varlen;
  cfg.denominator = denominator;
  if (denominator && (has_h0 || has_dht || cfg.initial_state_grad))
    throw InternalError("linear_attn bwd: the denominator form has no states");
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));
  // The split schedule by default where the walks leave most SMs idle: plain form, 16-bit, dense, head
  // dims up to 128, at most 32 sequences x heads over at least 1024 tokens. H200 bf16 backward ms, split
  // vs walks: B2 T16384 H16 D128 1.23 vs 1.93; at 64 heads it depends (B8 T1024 H8 D64 0.070 vs 0.092,
  // B4 T2048 H16 D128 0.372 vs 0.356: `linac tune --backward` times both there); 128 heads and more
  // favour the walks (B8 T4096 H16 1.40 vs 0.83, B1 T8192 H96 2.04 vs 1.63).
  const bool split_by_default = !gated && !denominator && !seq.varlen && cfg.dtype != DType::f32 &&
                                std::max(cfg.block_k, cfg.block_v) <= 128 && seq.N * seq.H <= 32 && seq.T >= 1024;
  if (config_value(opts, "split", split_by_default ? 1 : 0, {0, 1}) == 1) {
    if (gated || denominator || std::max(cfg.block_k, cfg.block_v) > 128)
      throw UserError("linear_attn --backward --config split=1 takes the plain form (no g, no --normalize) with "
                      "head dims up to 128");
    if (!seq.varlen) return plan_split_bwd(inputs, opts, wanted, seq, cfg, scale);
  }
  const int64_t k_blocks = cfg.block_k / cfg.split_k, v_blocks = cfg.block_v / cfg.split_v;

  OpPlan plan;
  add_backward_inputs(plan, inputs, seq, cfg.dtype, {"g", "initial_state", "dfinal_state"});
  plan.tensors["dq"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dk"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
  plan.tensors["dv"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  if (gated) {
    plan.tensors["dg"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H});
    // Per key block, the partial row sums q.dq and k.dk (O(T) scratch).
    plan.tensors["dg_q"] = HostTensor::zeros(DType::f32, {k_blocks, seq.B, seq.T, seq.H});
    plan.tensors["dg_k"] = HostTensor::zeros(DType::f32, {k_blocks, seq.B, seq.T, seq.H});
    if (has_dht) plan.tensors["dg_s"] = HostTensor::zeros(DType::f32, {k_blocks, seq.N, seq.H});
  }
  if (cfg.initial_state_grad)
    plan.tensors["dinitial_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});
  if (denominator)
    for (const char* name : {"den_do", "ones"}) {
      check_shape(name, inputs.at(name), {seq.B, seq.T, seq.H, 1});
      plan.tensors[name] = inputs.at(name).cast(cfg.dtype);
    }

  auto launch = [&](LinearAttnBwdKernel which, int64_t blocks) {
    const std::array<int64_t, 3> grid =
        which == LinearAttnBwdKernel::dg ? std::array<int64_t, 3>{seq.N * seq.H, 1, 1}
                                         : std::array<int64_t, 3>{blocks, seq.N * seq.H, 1};
    plan.launches.push_back(plan_launch(plan, cached_bwd(cfg, which), grid, {{"scale", scale}}));
  };
  launch(LinearAttnBwdKernel::dq, k_blocks);
  launch(LinearAttnBwdKernel::dk, k_blocks);
  launch(LinearAttnBwdKernel::dv, v_blocks);
  if (gated) launch(LinearAttnBwdKernel::dg, 1);
  for (const char* name : {"dq", "dk", "dv", "dg", "dinitial_state"})
    if (wants(wanted, name)) plan.outputs[name] = name;
  return plan;
}

}  // namespace

OpPlan plan_linear_attn_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  if (opts.normalize || opts.recurrent)
    throw UserError("linear_attn: --backward is not implemented with --normalize or --recurrent");
  return plan_bwd(inputs, opts, wanted, false);
}

OpPlan plan_linear_attn_bwd_with_denominator(const TensorMap& inputs, const OpOptions& opts,
                                             const std::vector<std::string>& wanted) {
  OpOptions o = opts;
  o.normalize = false;
  return plan_bwd(inputs, o, wanted, true);
}

std::vector<std::shared_ptr<ir::Kernel>> linear_attn_bwd_kernels(const OpOptions& opts) {
  // Head dim 64, plain and with every option; the dq and dk walks also with --normalize's denominator
  // in 16-bit (these lists feed test_ptxas's zero-spill check: in fp32 the denominator's walks spill
  // 4-12 bytes at 255 registers, so they are left out there).
  std::vector<std::shared_ptr<ir::Kernel>> out;
  LinearAttnBwdConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = cfg.block_v = 64;
  LinearAttnBwdConfig gated = cfg;
  gated.gated = gated.initial_state = gated.final_state_grad = gated.initial_state_grad = true;
  configure(cfg, opts);
  configure(gated, opts);
  for (const auto& c : {cfg, gated})
    for (auto which : {LinearAttnBwdKernel::dq, LinearAttnBwdKernel::dk, LinearAttnBwdKernel::dv})
      out.push_back(cached_bwd(c, which));
  out.push_back(cached_bwd(gated, LinearAttnBwdKernel::dg));
  for (bool g : {false, true}) {
    if (opts.dtype == DType::f32) break;
    LinearAttnBwdConfig norm = cfg;
    norm.gated = g;
    norm.denominator = true;
    configure(norm, opts);
    for (auto which : {LinearAttnBwdKernel::dq, LinearAttnBwdKernel::dk}) out.push_back(cached_bwd(norm, which));
  }
  // The split schedule at its defaults, with both states.
  LinearAttnSplitBwdConfig split;
  split.dtype = opts.dtype;
  split.chunk = opts.dtype == DType::f32 ? 32 : 64;
  split.state_stages = opts.dtype == DType::f32 ? 1 : 2;
  split.initial_state = split.final_state_grad = split.initial_state_grad = true;
  out.push_back(build_linear_attn_bwd_states(split));
  out.push_back(build_linear_attn_bwd_dstates(split));
  out.push_back(build_linear_attn_bwd_chunk(split));
  return out;
}

}  // namespace linac
