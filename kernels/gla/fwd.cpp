#include "kernels/gla/fwd.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <functional>
#include <map>
#include <mutex>

#include "kernels/gla/bwd_tokenwise.h"
#include "kernels/gla/bwd.h"
#include "kernels/gla/split_bwd.h"
#include "kernels/common/log_decay.h"
#include "kernels/common/op_support.h"
#include "kernels/common/sequence_bounds.h"
#include "kernels/common/recurrent.h"
#include "linac/dsl.h"
#include "linac/error.h"

namespace linac {

using namespace dsl;

// One program per (16-row sub-chunk, sequence x head), all independent: the diagonal block
//   A_ii[r, c] = scale sum_d q_rd k_cd exp(L_rd - L_cd)  (r >= c; 0 above the diagonal)
// with L the cumulative sum of the sub-chunk's gates from its first row, in fp32, written to a_diag
// [B, T, H, 16] (fp32). Two ways, chosen per program:
//  - factored, when the gates' spread over the sub-chunk (max_r L_rd - min_r L_rd, largest over the
//    channels d) is at most kGlaFactorSpread: with a reference m_d midway between the extremes,
//      A_ii = scale (Q .* exp(L - m)) (K .* exp(m - L))^T   (an fp32 product on the CUDA cores)
//    every factor is within exp(+-kGlaFactorSpread / 2), so neither overflows nor underflows, and each
//    term q_rd k_cd exp(L_rd - m_d) exp(m_d - L_cd) is its exact value to a few fp32 ulps: 2 x 16 exps per
//    channel instead of 16 x 16. logsigmoid gates spread about 25 over 16 rows (fla's benchmark);
//  - elementwise otherwise (steep gates, e.g. -5 per token or -1e4): one column c at a time (row c of
//    K and L), masked to r >= c before exp, every exponent L_r - L_c <= 0.
std::shared_ptr<ir::Kernel> build_gla_intra(const GlaConfig& cfg) {
  const int64_t BK = cfg.block_k, BC = kGlaSubChunk;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_intra");
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor a_diag = kb.tensor("a_diag", f32, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_s = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(q, cu, cfg.varlen, i_n);
  Tile b = seq.b;
  Tile ti = seq.bos + i_s * BC;  // at or past eos for the sub-chunks of the longest sequence only
  AccessOptions in_seq{.limits = {{1, seq.eos}}};

  Tile Qf = load(q, {b, ti, i_h, 0}, {kIndex, BC, kIndex, BK}, in_seq).to(f32);
  Tile Kf = load(k, {b, ti, i_h, 0}, {kIndex, BC, kIndex, BK}, in_seq).to(f32);
  // Gates floored (kernels/common/log_decay.h), here and in the elementwise form's rows: the spread and
  // L_r - L_c of -inf gates are NaN.
  Tile L = cumsum(floor_log_decay(load(g, {b, ti, i_h, 0}, {kIndex, BC, kIndex, BK}, in_seq)), 0);
  Tile rows = expand_dims(iota(BC), 1), cols = expand_dims(iota(BC), 0);
  Tile L_hi = max(L, 0), L_lo = min(L, 0);
  Tile spread = max(L_hi - L_lo, 0);  // NaN gates compare false: the elementwise way
  Tile A = zeros({BC, BC}, f32);
  if_then_else(spread <= kGlaFactorSpread, [&] {
    Tile m = expand_dims((L_hi + L_lo) * 0.5f, 0);
    A = where(rows >= cols, dot(Qf * exp(L - m), (Kf * exp(m - L)).T()), 0.0f);
  }, [&] {
    Tile Lc = zeros({BK}, f32);  // row c of L, summed in the cumsum's order: L_r - L_c is 0 at r = c
    // Row c of k and g, loaded one step ahead (carried) so that their latency overlaps a step: 0.78 ->
    // 0.71 ms on an H200 at B8 T4096 H16 D128.
    auto row_of = [&](const Tensor& t, const Operand& r) {
      return load(t, {b, ti + r, i_h, 0}, {kIndex, kIndex, kIndex, BK}, in_seq);
    };
    Tile k_row = row_of(k, 0), g_row = floor_log_decay(row_of(g, 0));
    for_range(0, BC, [&](Tile c) {
      Tile k_ahead = row_of(k, c + 1), g_ahead = floor_log_decay(row_of(g, c + 1));  // row 16 at the last step: unused
      Tile kc = k_row.to(f32);
      Lc = Lc + g_row;
      k_row = k_ahead;
      g_row = g_ahead;
      Tile below = rows >= c;
      // exp(..) first, so the product computes in the f32 math's layout and the Qf load follows it
      // (passes: loads take their consumer's layout); Qf * kc first would fix the product in the 16-bit
      // load's layout and copy each exp tile through shared memory.
      Tile x = exp(where(below, L - expand_dims(Lc, 0), 0.0f)) * Qf * expand_dims(kc, 0);
      A = A + where((cols == c) & below, expand_dims(sum(x, 1), 1), 0.0f);  // rows reduce in registers
    }, A, Lc, k_row, g_row);
  }, A);
  store(a_diag, {b, ti, i_h, 0}, {kIndex, BC, kIndex, BC}, A * scale, in_seq);
  return kb.finish();
}

namespace {

/// Where a chunk is: batch row, head, first row, first value column, and the sequence-end mask.
struct GlaChunk {
  Tile b, i_h, t0, v0;
  AccessOptions in_seq;
};

/// The diagonal block A_ii (from gla_intra) of sub-chunk i of the chunk at rows t0.., [16, 16].
Tile load_diagonal_block(const Tensor& a_diag, const Tile& b, const Tile& i_h, const Tile& t0, int64_t i,
                         const AccessOptions& in_seq) {
  return load(a_diag, {b, t0 + i * kGlaSubChunk, i_h, 0}, {kIndex, kGlaSubChunk, kIndex, kGlaSubChunk}, in_seq);
}

/// All the chunk's diagonal blocks, one per sub-chunk.
std::vector<Tile> load_diagonal_blocks(const GlaConfig& cfg, const Tensor& a_diag, const Tile& b, const Tile& i_h,
                                       const Tile& t0, const AccessOptions& in_seq) {
  std::vector<Tile> A;
  for (int64_t i = 0; i < cfg.chunk / kGlaSubChunk; ++i) A.push_back(load_diagonal_block(a_diag, b, i_h, t0, i, in_seq));
  return A;
}

/// The outputs of the chunk at rows t0.. (NC sub-chunks of 16 rows) from Sd, the state before the
/// chunk in the input dtype; stores o. Returns, per sub-chunk, V_i, Kr_i = K_i .* exp(R_i) and tot_i
/// (see build_gla_fwd) for a state update.
struct GlaChunkTerms {
  std::vector<Tile> V, Kr, tot;
  Tile P;  // tot_0 + ... + tot_{NC-1}: G_C
};

GlaChunkTerms gla_chunk_outputs(const GlaConfig& cfg, const GlaChunk& c, const Tile& Sd, const Tensor& q,
                                const Tensor& k, const Tensor& v, const Tensor& g,
                                const std::function<Tile(int)>& diagonal_block, const Tensor& o, const Tile& scale) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v, BC = kGlaSubChunk;
  const int NC = static_cast<int>(cfg.chunk / BC);
  const DType dt = cfg.dtype, f32 = DType::f32;
  GlaChunkTerms r;
  r.V.resize(NC), r.Kr.resize(NC), r.tot.resize(NC);
  for (int i = 0; i < NC; ++i) {
    Tile ti = c.t0 + i * BC;
    Tile Qf = load(q, {c.b, ti, c.i_h, 0}, {kIndex, BC, kIndex, BK}, c.in_seq).to(f32);
    Tile Kf = load(k, {c.b, ti, c.i_h, 0}, {kIndex, BC, kIndex, BK}, c.in_seq).to(f32);
    r.V[i] = load(v, {c.b, ti, c.i_h, c.v0}, {kIndex, BC, kIndex, BV}, c.in_seq);
    Tile gi = floor_log_decay(load(g, {c.b, ti, c.i_h, 0}, {kIndex, BC, kIndex, BK}, c.in_seq));
    Tile L = cumsum(gi, 0);
    r.tot[i] = sum(gi, 0);  // the cumsum's last row, summed in the same order
    Tile g0 = floor_log_decay(load(g, {c.b, ti, c.i_h, 0}, {kIndex, kIndex, kIndex, BK}, c.in_seq));
    Tile A = diagonal_block(i);  // A_ii

    // Q_i .* exp(G_i - G_n) and K_i .* exp(R_i); the other decays multiply these (factors <= 1).
    Tile Qn = Qf * exp(L - expand_dims(g0, 0));
    r.Kr[i] = Kf * exp(expand_dims(r.tot[i], 0) - L);
    Tile Gn = i == 0 ? g0 : g0 + r.P;
    Tile O = dot((Qn * expand_dims(exp(Gn), 0)).to(dt), Sd) * scale;
    O = O + dot(A.to(dt), r.V[i]);
    Tile Qnd = Qn.to(dt);
    Tile decay = g0;  // from the end of sub-chunk j to the first row of sub-chunk i
    for (int j = i - 1; j >= 0; --j) {
      Tile Kn = (r.Kr[j] * expand_dims(exp(decay), 0)).to(dt);
      O = O + dot((dot(Qnd, Kn.T()) * scale).to(dt), r.V[j]);
      if (j > 0) decay = decay + r.tot[j];
    }
    store(o, {c.b, ti, c.i_h, c.v0}, {kIndex, BC, kIndex, BV}, O.to(dt), c.in_seq);
    r.P = i == 0 ? r.tot[0] : r.P + r.tot[i];
  }
  return r;
}

}  // namespace

// One program per (V block, sequence x head) walks the chunks of its sequence in order, carrying the
// state S [BK, BV] in registers (the "fused chunk" schedule). A chunk is NC sub-chunks of 16 rows.
// For sub-chunk i: L_i is the cumulative sum of its gates from its first row (inclusive), tot_i its
// total, g0_i its first row, R_i = tot_i - L_i (the decay from a row to the sub-chunk's end) and
// P_i = tot_0 + ... + tot_{i-1}, so that G = P_i + L_i is the chunk-local cumulative gate and
// G_n = P_i + g0_i its value at the first row of sub-chunk i (the reference gate). Then
//   O_i  = scale (Q_i .* exp(G_i)) S + A_ii V_i + sum_{j<i} A_ij V_j
//   A_ij = scale (Q_i .* exp(L_i - g0_i)) (K_j .* exp(R_j + g0_i + tot_{j+1} + ... + tot_{i-1}))^T
//        = scale (Q_i .* exp(G_i - G_n)) (K_j .* exp(G_n - G_j))^T
//   S    = diag(exp(G_C)) S + sum_i (K_i .* exp(R_i + tot_{i+1} + ... + tot_{NC-1}))^T V_i
// with A_ii from gla_intra. Every exponent is a sum of gates, so <= 0. The decays between rows are
// sums over the rows in between rather than differences of G, so a sub-chunk of very negative gates
// (say -1e4) does not wipe out the precision of the sub-chunks after it in the same chunk. Rows past
// the sequence end load q = k = v = g = 0.
std::shared_ptr<ir::Kernel> build_gla_fwd(const GlaConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v, BC = kGlaSubChunk;
  if (BT % BC != 0) throw InternalError(fmt::format("gla: chunk {} is not a multiple of {}", BT, BC));
  const int NC = static_cast<int>(BT / BC);
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_fwd");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor a_diag = kb.tensor("a_diag", f32, 4);
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor ht = cfg.final_state ? kb.tensor("final_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(q, cu, cfg.varlen, i_n);
  Tile num_chunks = (seq.eos - seq.bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;

  Tile S = zeros({BK, BV}, f32);
  if (cfg.initial_state) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});
  AccessOptions in_seq{.limits = {{1, seq.eos}}};

  // The diagonal blocks are loaded one chunk ahead (carried), so that their latency overlaps a step:
  // [16, 16] fp32 tiles are too small for cp.async pipelining, and waiting on them was the walk's top
  // stall (13% of its samples on the H200). Past the last chunk the loads are masked (zeros, unused).
  std::vector<Tile> A = load_diagonal_blocks(cfg, a_diag, seq.b, i_h, seq.bos, in_seq);
  std::vector<Tile*> carried = {&S};
  for (Tile& a : A) carried.push_back(&a);
  dsl::detail::for_range(0, num_chunks, [&](Tile ic) {
    GlaChunk c{seq.b, i_h, seq.bos + ic * BT, v0, in_seq};
    std::vector<Tile> A_ahead = load_diagonal_blocks(cfg, a_diag, seq.b, i_h, c.t0 + BT, in_seq);
    GlaChunkTerms t = gla_chunk_outputs(cfg, c, S.to(dt), q, k, v, g, [&](int i) { return A[i]; }, o, scale);
    Tile S_next = S * expand_dims(exp(t.P), 1);  // t.P is G_C
    Tile after;                                  // tot_{i+1} + ... + tot_{NC-1}
    for (int i = NC - 1; i >= 0; --i) {
      Tile Kc = i == NC - 1 ? t.Kr[i] : t.Kr[i] * expand_dims(exp(after), 0);
      S_next = S_next + dot(Kc.to(dt).T(), t.V[i]);
      after = i == NC - 1 ? t.tot[i] : after + t.tot[i];
    }
    S = S_next;
    A = A_ahead;
  }, carried);

  if (cfg.final_state) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

// The split schedule (dense inputs), for parallelism where the fused one has too few programs to
// fill the GPU: gla_bwd_gates decays every chunk's keys in parallel (K .* exp(R), exp(tot)), the state
// pass gla_bwd_states walks the chunks of each (V block, sequence x head, K block) storing the state
// before every chunk into h [B, NT, H, K, V] (input dtype, as the fused kernel rounds it for the
// product), then gla_out computes every chunk's outputs in parallel from h. The first two are the
// backward's split schedule's (kernels/gla/split_bwd.h).

std::shared_ptr<ir::Kernel> build_gla_out(const GlaConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v, BC = kGlaSubChunk;
  if (BT % BC != 0) throw InternalError(fmt::format("gla: chunk {} is not a multiple of {}", BT, BC));
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("gla_out");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor g = kb.tensor("g", f32, 4);
  Tensor a_diag = kb.tensor("a_diag", f32, 4);
  Tensor h = kb.tensor("h", dt, 5);
  Tensor o = kb.tensor("o", dt, 4);
  // (BK is the padded key dim: h's load masks past K.)
  Tile scale = kb.scalar("scale", f32);

  Tile ic = program_id(0);
  Tile i_nh = program_id(1);
  Tile i_v = program_id(2);
  Tile H = q.dim(2), T = q.dim(1);
  Tile b = i_nh / H, i_h = i_nh % H;
  Tile v0 = i_v * BV;
  Tile Sd = load(h, {b, ic, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
  GlaChunk c{b, i_h, ic * BT, v0, AccessOptions{.limits = {{1, T}}}};
  // Each A_ii loaded where it is used (loaded together up front, gla_out spilled 4 bytes in fp16).
  auto diagonal_block = [&](int i) { return load_diagonal_block(a_diag, c.b, c.i_h, c.t0, i, c.in_seq); };
  gla_chunk_outputs(cfg, c, Sd, q, k, v, g, diagonal_block, o, scale);
  return kb.finish();
}

namespace {

/// Sequences x heads below which the tuner also times the split schedule (fewer fused walks than an
/// H100/H200 has SMs, with room for them to be starved).
constexpr int64_t kSplitCandidatesBelowHeads = 64;

const std::vector<std::pair<std::string, std::string>>& gla_config_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"chunk", "rows per chunk (16, 32, 64, 128; sub-chunks of 16)"},
      {"bv", "value columns per program (16..128)"},
      {"warps", "warps per program (2, 4, 8)"},
      {"stages", "pipeline stages of the chunk loads (1 or 2)"},
      {"split", "1: state pass + parallel outputs (dense inputs; varlen runs fused), 0: fused chunk loop; "
                "--backward: state passes (states and their gradients per chunk), then per-chunk gradients"},
      {"sbk", "split=1: key columns per program of the state pass (16..128; default all; --backward 32)"},
  };
  return keys;
}

enum class GlaKernel { intra, fused, gates, state, out };

/// The split schedule's state pass (and its decayed keys) as the backward's kernels take it.
GlaSplitBwdConfig split_state_config(const GlaConfig& cfg) {
  GlaSplitBwdConfig s;
  s.dtype = cfg.dtype;
  s.chunk = cfg.chunk;
  s.block_k = cfg.block_k;
  s.block_v = cfg.block_v;
  s.state_block_k = cfg.state_block_k > 0 ? cfg.state_block_k : cfg.block_k;
  s.state_block_v = cfg.block_v;
  s.state_warps = cfg.num_warps;
  s.state_stages = cfg.num_stages;
  s.initial_state = cfg.initial_state;
  s.final_state = cfg.final_state;
  s.decay_queries = false;
  return s;
}

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_gla_kernel(const GlaConfig& cfg, GlaKernel which) {
  static KernelMemo memo;
  std::string key = which == GlaKernel::intra
                        ? fmt::format("intra/{}/{}/{}", dtype_name(cfg.dtype), cfg.block_k, cfg.varlen)
                        : fmt::format("{}/{}/{}/{}/{}/{}{}{}/{}/{}", static_cast<int>(which), dtype_name(cfg.dtype),
                                      cfg.chunk, cfg.block_k, cfg.block_v, cfg.initial_state, cfg.final_state,
                                      cfg.varlen, cfg.num_warps, cfg.num_stages) +
                              (which == GlaKernel::state ? fmt::format("/{}", cfg.state_block_k) : "");
  return memo.get(key, [&] {
    switch (which) {
      case GlaKernel::intra: return build_gla_intra(cfg);
      case GlaKernel::fused: return build_gla_fwd(cfg);
      case GlaKernel::gates: return build_gla_bwd_gates(split_state_config(cfg));
      case GlaKernel::state: return build_gla_bwd_states(split_state_config(cfg));
      case GlaKernel::out: return build_gla_out(cfg);
    }
    throw InternalError("bad gla kernel");
  });
}

/// The configuration for head dims K and V (opts.config and --chunk-size override the defaults).
GlaConfig gla_config(const OpOptions& opts, int64_t K, int64_t V) {
  check_config_keys("gla", opts, gla_config_keys());
  GlaConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(K);
  // Until the autotuner covers gla, defaults measured on an H200 (bf16, B=8, H=16, T=2048..4096):
  // chunks of 16 (the state absorbs the off-diagonal blocks) beat chunks of 32 and 64 in every
  // configuration measured; one program per 128 value columns for K = 128 (each program redoes the key-side
  // decay math), 32 columns otherwise. These are spill-free for K = V = 64 and 128 (test_ptxas).
  const int64_t bv = std::min<int64_t>(padded_head_dim(V), cfg.block_k == 128 ? 128 : 32);
  cfg.chunk = static_cast<int>(config_value(opts, "chunk", checked_chunk_size(opts.chunk_size, 16), {16, 32, 64, 128}));
  cfg.block_v = static_cast<int>(config_value(opts, "bv", bv, {16, 32, 64, 128}));
  cfg.num_warps = static_cast<int>(config_value(opts, "warps", 8, {2, 4, 8}));
  // The chunk loads pipelined (cp.async one chunk ahead) for 16-bit tiles: H200 B8 T4096 H16 D128 bf16
  // forward 1.42 ms vs 1.91 with stages=1 (gla_fwd 0.70 vs 1.19; the tuner had been picking it).
  // fp32 blocks keep one stage (twice the shared memory).
  cfg.num_stages = static_cast<int>(config_value(opts, "stages", dtype_bytes(cfg.dtype) == 2 ? 2 : 1, {1, 2}));
  cfg.split = config_value(opts, "split", 0, {0, 1}) == 1;
  cfg.state_block_k = static_cast<int>(std::min<int64_t>(config_value(opts, "sbk", cfg.block_k, {16, 32, 64, 128}), cfg.block_k));
  return cfg;
}

OpPlan plan_gla(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  if (opts.backward) return plan_gla_bwd(inputs, opts, wanted);
  for (const char* name : {"do", "dfinal_state"})
    if (inputs.count(name)) throw UserError(fmt::format("gla: input '{}' is a gradient; it needs --backward", name));
  if (opts.recurrent)
    return plan_recurrent("gla", RecurrentGate::channel, true, gla_config_keys(), inputs, opts, wanted);
  SequenceLayout seq = check_qkv_inputs("gla", inputs);
  if (!inputs.count("g")) throw UserError("gla: missing input 'g'");
  check_shape("g", inputs.at("g"), {seq.B, seq.T, seq.H, seq.K});
  const bool has_h0 = inputs.count("initial_state") > 0;
  if (has_h0) check_shape("initial_state", inputs.at("initial_state"), {seq.N, seq.H, seq.K, seq.V});

  GlaConfig cfg = gla_config(opts, seq.K, seq.V);
  cfg.initial_state = has_h0;
  cfg.final_state = wants(wanted, "final_state");
  cfg.varlen = seq.varlen;

  OpPlan plan;
  for (const char* name : {"q", "k", "v"}) plan.tensors[name] = inputs.at(name).cast(cfg.dtype);
  plan.tensors["g"] = inputs.at("g").cast(DType::f32);
  plan.tensors["o"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  plan.tensors["a_diag"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, kGlaSubChunk});
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));
  if (seq.varlen) plan.tensors["cu_seqlens"] = seq.cu_seqlens;

  // The diagonal blocks: one program per sub-chunk of the longest sequence (shorter ones mask).
  const int64_t longest = seq.longest_sequence();
  KernelLaunch intra;
  intra.kernel = cached_gla_kernel(cfg, GlaKernel::intra);
  intra.grid = {std::max<int64_t>(1, (longest + kGlaSubChunk - 1) / kGlaSubChunk), seq.N * seq.H, 1};
  for (const char* name : {"q", "k", "g", "a_diag"}) intra.tensors[name] = name;
  if (seq.varlen) intra.tensors["cu_seqlens"] = "cu_seqlens";
  intra.scalars["scale"] = scale;
  plan.launches.push_back(std::move(intra));

  if (has_h0) plan.tensors["initial_state"] = inputs.at("initial_state").cast(DType::f32);
  if (cfg.final_state) plan.tensors["final_state"] = HostTensor::zeros(DType::f32, {seq.N, seq.H, seq.K, seq.V});
  const int64_t num_v_blocks = (seq.V + cfg.block_v - 1) / cfg.block_v;
  if (cfg.split && !seq.varlen) {
    const int64_t num_chunks = (seq.T + cfg.chunk - 1) / cfg.chunk;
    plan.tensors["h"] = HostTensor::zeros(cfg.dtype, {seq.B, num_chunks, seq.H, seq.K, seq.V});
    plan.tensors["kd"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.K});
    plan.tensors["etot"] = HostTensor::zeros(DType::f32, {seq.B, std::max<int64_t>(num_chunks, 1), seq.H, seq.K});
    if (num_chunks > 0) {
      KernelLaunch gates;
      gates.kernel = cached_gla_kernel(cfg, GlaKernel::gates);
      gates.grid = {num_chunks, seq.N * seq.H, 1};
      for (const char* name : {"q", "k", "g", "kd", "etot"}) gates.tensors[name] = name;
      plan.launches.push_back(std::move(gates));
    }
    KernelLaunch state;
    state.kernel = cached_gla_kernel(cfg, GlaKernel::state);
    state.grid = {num_v_blocks, seq.N * seq.H, (cfg.block_k + cfg.state_block_k - 1) / cfg.state_block_k};
    for (const char* name : {"kd", "v", "etot", "h"}) state.tensors[name] = name;
    if (has_h0) state.tensors["initial_state"] = "initial_state";
    if (cfg.final_state) state.tensors["final_state"] = "final_state";
    plan.launches.push_back(std::move(state));
    KernelLaunch out;
    out.kernel = cached_gla_kernel(cfg, GlaKernel::out);
    out.grid = {std::max<int64_t>(num_chunks, 1), seq.N * seq.H, num_v_blocks};
    for (const char* name : {"q", "k", "v", "g", "a_diag", "h", "o"}) out.tensors[name] = name;
    out.scalars["scale"] = scale;
    plan.launches.push_back(std::move(out));
  } else {
    KernelLaunch launch;
    launch.kernel = cached_gla_kernel(cfg, GlaKernel::fused);
    launch.grid = {num_v_blocks, seq.N * seq.H, 1};
    for (const char* name : {"q", "k", "v", "g", "a_diag", "o"}) launch.tensors[name] = name;
    launch.scalars["scale"] = scale;
    if (has_h0) launch.tensors["initial_state"] = "initial_state";
    if (cfg.final_state) launch.tensors["final_state"] = "final_state";
    if (seq.varlen) launch.tensors["cu_seqlens"] = "cu_seqlens";
    plan.launches.push_back(std::move(launch));
  }
  if (wants(wanted, "o")) plan.outputs["o"] = "o";
  if (cfg.final_state) plan.outputs["final_state"] = "final_state";
  return plan;
}

}  // namespace

OpDef gla_op() {
  OpDef op;
  op.name = "gla";
  op.summary = "gated linear attention forward, per-channel log-decay gate, decay-aware sub-chunks (KERNELS.md 2)";
  op.inputs = {
      {"q", true, "[B,T,H,K]", "queries"},
      {"k", true, "[B,T,H,K]", "keys"},
      {"v", true, "[B,T,H,V]", "values (a non-finite one makes all of its 16-row sub-chunk's outputs non-finite)"},
      {"g", true, "[B,T,H,K]", "log-decay per token, head and key channel (<= 0, -inf drops the state; fp32)"},
      {"initial_state", false, "[N,H,K,V]", "state before the first token of each sequence (fp32)"},
      {"cu_seqlens", false, "[N+1]", "int32/int64 offsets of packed sequences (B must be 1)"},
      {"do", false, "[B,T,H,V]", "--backward: gradient of the loss w.r.t. o"},
      {"dfinal_state", false, "[N,H,K,V]", "--backward: gradient w.r.t. final_state (fp32)"},
  };
  op.outputs = {
      {"o", true, "[B,T,H,V]", "outputs"},
      {"final_state", false, "[N,H,K,V]", "state after the last token of each sequence (fp32)"},
      {"dq", false, "[B,T,H,K]", "--backward: gradient w.r.t. q"},
      {"dk", false, "[B,T,H,K]", "--backward: gradient w.r.t. k"},
      {"dv", false, "[B,T,H,V]", "--backward: gradient w.r.t. v"},
      {"dg", false, "[B,T,H,K]", "--backward: gradient w.r.t. g (fp32)"},
      {"dinitial_state", false, "[N,H,K,V]", "--backward: gradient w.r.t. initial_state (fp32)"},
  };
  op.flags = {"recurrent", "backward"};
  op.prepare = plan_gla;
  op.bwd_tuning_space = [](const ProblemShape& s, DType) {
    // The chunked backward's chunk, column blocks and warps: the default (16-bit: chunk 16, whole
    // 128-column blocks, 8 warps) and the runners-up on an H200 at B8 T4096 H16 D128 (see configure in
    // gla_chunked_bwd.cpp); intra with 8 warps was slower there (4.03 vs 2.96 ms).
    // take=0 (masked row sums in gla_bwd_intra) was 0.34 ms slower, so it is not offered.
    std::vector<Config> space{{},
                              {{"chunk", 16}, {"bk", 64}, {"bv", 64}, {"warps", 4}},
                              {{"chunk", 32}, {"bk", 64}, {"bv", 64}, {"warps", 8}}};
    // Both schedules where few walks leave SMs idle (head dims up to 128; the default picks by shape,
    // see split_by_default in gla_chunked_bwd.cpp). gla_bwd_inter at 4 warps was 2.7x slower.
    if (s.B * s.H <= kGlaBwdSplitHeads && std::max(s.K, s.V) <= 128) {
      space.push_back({{"split", 1}});
      space.push_back({{"split", 0}});
    }
    return space;
  };
  op.config_keys = gla_config_keys();
  for (const auto& key : gla_chunked_bwd_config_keys())
    for (const char* name : {"bk", "iwarps", "take", "fuse", "sbv", "tokenwise"})
      if (key.first == name) op.config_keys.push_back(key);
  op.random_inputs = [](const ProblemShape& s, uint64_t seed) {
    TensorMap in;
    in["q"] = random_uniform({s.B, s.T, s.H, s.K}, seed);
    in["k"] = random_uniform({s.B, s.T, s.H, s.K}, seed + 1);
    in["v"] = random_uniform({s.B, s.T, s.H, s.V}, seed + 2);
    in["g"] = random_log_decay({s.B, s.T, s.H, s.K}, seed + 3);
    return in;
  };
  op.shape_of = [](const TensorMap& in) {
    const HostTensor& q = in.at("q");
    return ProblemShape{q.shape[0], q.shape[1], q.shape[2], q.shape[3], in.at("v").shape[3], true};
  };
  op.tuning_space = [](const ProblemShape& s, DType) {
    // The defaults first; then what won in measurements on an H200 at other sizes (see gla_config).
    std::vector<Config> space{{},
                              {{"chunk", 16}, {"bv", 128}, {"warps", 8}, {"stages", 2}},
                              {{"chunk", 16}, {"bv", 64}, {"warps", 4}, {"stages", 2}},
                              {{"chunk", 32}, {"bv", 128}, {"warps", 8}, {"stages", 2}},
                              {{"chunk", 64}, {"bv", 128}, {"warps", 8}, {"stages", 1}}};
    // The split schedule (a state pass, then every chunk's outputs in parallel) pays for its state
    // round trip through memory with parallelism over chunks: only when the fused walk leaves SMs idle.
    // With 128 heads (B8 H16) it never won on an H200 (5.89 ms at best vs 2.25) and cost 4 of 9
    // candidates' compile and timing in every cold start.
    if (s.B * s.H < kSplitCandidatesBelowHeads) {
      // Key blocks in the state pass (sbk) for more programs: at B2 T16384 H16 D128 bf16 on an H200
      // the forward took 2.28 ms with sbk=32 (chunk 64), 2.72 with sbk=64, 9.92 without, fused 3.08.
      space.push_back({{"split", 1}, {"chunk", 64}, {"bv", 128}, {"warps", 8}});
      space.push_back({{"split", 1}, {"chunk", 32}, {"bv", 64}, {"warps", 4}});
      space.push_back({{"split", 1}, {"chunk", 64}, {"bv", 64}, {"sbk", 64}, {"warps", 4}, {"stages", 2}});
      space.push_back({{"split", 1}, {"chunk", 64}, {"bv", 64}, {"sbk", 32}, {"warps", 4}, {"stages", 2}});
      space.push_back({{"split", 1}, {"chunk", 32}, {"bv", 64}, {"sbk", 32}, {"warps", 4}, {"stages", 2}});
    }
    return space;
  };
  op.kernels = [](const OpOptions& opts) {
    // The chunked form (diagonal blocks, then the chunk loop) for K = V = 64 and K = V = 128 with
    // both states, and the recurrent form.
    std::vector<std::shared_ptr<ir::Kernel>> out;
    for (int64_t d : {64, 128}) {
      GlaConfig cfg = gla_config(opts, d, d);
      cfg.initial_state = cfg.final_state = true;
      out.push_back(cached_gla_kernel(cfg, GlaKernel::intra));
      out.push_back(cached_gla_kernel(cfg, GlaKernel::fused));
      // The split schedule at its first tuning-space configuration.
      GlaConfig split = cfg;
      split.chunk = 64;
      // (fp32 takes the FMA path for its dots, and K = 128 holds a [128, BV] state: narrower V blocks
      // keep them within registers.)
      split.block_v = opts.dtype == DType::f32 || d == 128 ? 32 : 64;
      split.num_warps = d == 128 ? 8 : 4;
      out.push_back(cached_gla_kernel(split, GlaKernel::gates));
      out.push_back(cached_gla_kernel(split, GlaKernel::state));
      out.push_back(cached_gla_kernel(split, GlaKernel::out));
    }
    for (auto& k : recurrent_kernels(opts, RecurrentGate::channel)) out.push_back(k);
    for (auto& k : gla_bwd_kernels(opts)) out.push_back(k);
    return out;
  };
  return op;
}

}  // namespace linac
