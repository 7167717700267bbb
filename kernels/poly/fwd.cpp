#include "kernels/poly/fwd.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <mutex>

#include "kernels/common/noise_dropout.h"
#include "kernels/common/op_support.h"
#include "kernels/common/sequence_bounds.h"
#include "kernels/poly/bwd.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

namespace {

/// First row of state2 holding the entries (d, e >= d): sum_{j<d} (K - j).
Tile state2_row(const Tile& d, const Tile& K) { return d * (2 * K - d + 1) / 2; }

/// Width of the tiles of the normalizer state (a value of 1 per token): the narrowest dot operand.
constexpr int64_t kOnes = 16;

/// Weights of the symmetric part along e - d = 0, 1, ...: the diagonal counts once, the other
/// entries stand for both (d, e) and (e, d).
Tile symmetric_weights(int64_t BK) {
  return where(iota(BK) == 0, full({BK}, 1.0, DType::f32), full({BK}, 2.0, DType::f32));
}

}  // namespace

// Both chunked kernels run one program per (V block, sequence x head) that walks the chunks of its
// sequence in order. With x = scale Q K^T and F = f(x) .* M (M the causal mask), per chunk:
//   num = F V + a s0 + b scale Q S1 + O2,      O2 = c scale^2 sum_d (q_d Q_{:,d:} .* w) S2[d]
//   den = rowsum(F) + a n + b scale Q z1 + D2,  D2 = c scale^2 sum_d (q_d Q_{:,d:} .* w) Z2[d]
// where n counts the earlier tokens, s0 = sum v, S1 = sum k^T v and z1 = sum k (registers of
// poly_fwd), and S2[d] = sum (k_d K_{:,d:})^T v, Z2[d] = sum k_d K_{:,d:} are row d of the symmetric
// parts (e >= d, weights w) of the degree-2 states (state2, norm2). poly_fwd_deg2 computes O2 and D2
// into o2 and den2, one d at a time (one [BK, BV] slice of S2 live); poly_fwd does the rest. Fused,
// the kernel spills at every configuration tried; split, neither does. Both kernels must use the
// same chunks. Chunk 0 reads no scratch (the state is empty), so the scratch needs no zeroing and
// repeated launches are independent.

std::shared_ptr<ir::Kernel> build_poly_fwd_deg2(const PolyConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_fwd_deg2");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor s2 = kb.tensor("state2", f32, 3);
  Tensor o2 = kb.tensor("o2", f32, 4);
  Tensor n2 = cfg.normalize ? kb.tensor("norm2", f32, 3) : Tensor();
  Tensor d2 = cfg.normalize ? kb.tensor("den2", f32, 4) : Tensor();
  Tile scale = kb.scalar("scale", f32);
  Tile cc = kb.scalar("c", f32);

  Tile i_v = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2), Kdim = q.dim(3);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(q, cu, cfg.varlen, i_n);
  Tile b = seq.b, bos = seq.bos, eos = seq.eos;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;
  Tile c2 = cc * scale * scale;
  Tile sym_w = symmetric_weights(BK);
  AccessOptions in_seq{.limits = {{1, eos}}};
  // The normalizer state Z2 goes through the same loop as S2, as the state of a value that is 1 on
  // every token (`ones`): norm2 [grid[0]*N*H, K(K+1)/2, 1], a slab per program. Its tiles are kOnes
  // columns wide (the narrowest dot): loads read column 0 (the others are masked to 0), stores and
  // den2 [B,T,H,1] take column 0.
  Tile n2_slab = i_nh * num_programs(0) + i_v;
  // Every V block computes the denominator; the first one stores it (the others' stores mask all).
  Tile den_end = eos * (1 - minimum(i_v, 1));
  Tile row = expand_dims(iota(BT), 1);

  auto chunk = [&](Tile i) {
    Tile t0 = bos + i * BT;
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile in_chunk = broadcast_to(row < eos - t0, {BT, kOnes});
    Tile ones = where(in_chunk, full({BT, kOnes}, 1.0, dt), full({BT, kOnes}, 0.0, dt));
    Tile O = zeros({BT, BV}, f32);
    Tile D = zeros({BT, kOnes}, f32);
    auto step = [&](Tile d) {
      Tile row0 = state2_row(d, Kdim), rows = Kdim - d;
      // Columns d of Q and K, and Q, K shifted left by d (columns e = d, d+1, ... masked past K).
      // Rows past the sequence end need no mask here: V and `ones` are zero there, and those output
      // rows are never stored.
      Tile qd = load(q, {b, t0, i_h, d}, {kIndex, BT, kIndex, kIndex}).to(f32);
      Tile kd = load(k, {b, t0, i_h, d}, {kIndex, BT, kIndex, kIndex}).to(f32);
      Tile Qs = load(q, {b, t0, i_h, d}, {kIndex, BT, kIndex, BK});
      Tile Ks = load(k, {b, t0, i_h, d}, {kIndex, BT, kIndex, BK});
      // Before chunk 1 the state is empty: read nothing (the limit masks every row).
      AccessOptions before{.limits = {{1, row0 + rows * minimum(i, 1)}}};
      Tile S2 = load(s2, {i_nh, row0, v0}, {kIndex, BK, BV}, before);
      Tile Qw = (Qs.to(f32) * expand_dims(qd * c2, 1) * expand_dims(sym_w, 0)).to(dt);
      O = O + dot(Qw, S2.to(dt));
      Tile Kw = (Ks.to(f32) * expand_dims(kd, 1)).to(dt);
      S2 = S2 + dot(Kw.T(), V);
      store(s2, {i_nh, row0, v0}, {kIndex, BK, BV}, S2, {.limits = {{1, row0 + rows}}});
      if (cfg.normalize) {
        Tile Z2 = load(n2, {n2_slab, row0, 0}, {kIndex, BK, kOnes}, before);
        D = D + dot(Qw, Z2.to(dt));
        store(n2, {n2_slab, row0, 0}, {kIndex, BK, kOnes}, Z2 + dot(Kw.T(), ones), {.limits = {{1, row0 + rows}}});
      }
    };
    if (cfg.normalize)
      for_range(0, Kdim, step, O, D);
    else
      for_range(0, Kdim, step, O);
    store(o2, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O, in_seq);
    if (cfg.normalize) store(d2, {b, t0, i_h, 0}, {kIndex, BT, kIndex, kOnes}, D, {.limits = {{1, den_end}}});
  };
  for_range(0, num_chunks, chunk);
  return kb.finish();
}

std::shared_ptr<ir::Kernel> build_poly_fwd(const PolyConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_fwd");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor o2 = cfg.quadratic ? kb.tensor("o2", f32, 4) : Tensor();
  Tensor d2 = cfg.quadratic && cfg.normalize ? kb.tensor("den2", f32, 4) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);
  Tile ca = kb.scalar("a", f32);
  Tile cb = kb.scalar("b", f32);
  Tile cc = cfg.quadratic ? kb.scalar("c", f32) : Tile();

  Tile i_v = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(q, cu, cfg.varlen, i_n);
  Tile b = seq.b, bos = seq.bos, eos = seq.eos;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;

  Tile s0 = zeros({BV}, f32);
  Tile S1 = zeros({BK, BV}, f32);
  Tile z1 = zeros({BK}, f32);
  Tile causal = expand_dims(iota(BT), 1) >= expand_dims(iota(BT), 0);
  AccessOptions in_seq{.limits = {{1, eos}}};

  auto chunk = [&](Tile i) {
    Tile t0 = bos + i * BT;
    Tile Q = load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile X = dot(Q, K.T()) * scale;
    Tile fx = cfg.quadratic ? ca + X * (cb + cc * X) : ca + cb * X;
    Tile F = where(causal, fx, 0.0f);
    Tile O = dot(F.to(dt), V) + expand_dims(s0 * ca, 0) + dot(Q, S1.to(dt)) * (cb * scale);
    if (cfg.quadratic) O = O + load(o2, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    if (cfg.normalize) {
      Tile n_before = (i * BT).to(f32);
      Tile den = sum(F, 1) + sum(Q.to(f32) * expand_dims(z1 * (cb * scale), 0), 1) + (n_before * ca + kPolyEps);
      if (cfg.quadratic) den = den + load(d2, {b, t0, i_h, 0}, {kIndex, BT, kIndex, kIndex}, in_seq);
      O = O / expand_dims(den, 1);
      z1 = z1 + sum(K.to(f32), 0);
    }
    s0 = s0 + sum(V.to(f32), 0);
    S1 = S1 + dot(K.T(), V);
    store(o, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt), in_seq);
  };
  // Only the state the configuration uses is loop-carried.
  if (cfg.normalize)
    for_range(0, num_chunks, chunk, s0, S1, z1);
  else
    for_range(0, num_chunks, chunk, s0, S1);
  return kb.finish();
}

// One program per (V block, sequence x head) walks the tokens of its sequence: the state takes the
// token, then the output reads it (s <= t inclusive). The same states as the chunked form; the
// degree-2 parts go through state2 and norm2 one row d (a [BK, BV] slice of S2) at a time.
std::shared_ptr<ir::Kernel> build_poly_recurrent(const PolyConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  KernelBuilder kb("poly_recurrent");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  Tensor q = kb.tensor("q", dt, 4);
  Tensor k = kb.tensor("k", dt, 4);
  Tensor v = kb.tensor("v", dt, 4);
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor s2 = cfg.quadratic ? kb.tensor("state2", f32, 3) : Tensor();
  Tensor n2 = cfg.quadratic && cfg.normalize ? kb.tensor("norm2", f32, 3) : Tensor();
  Tensor o = kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);
  Tile ca = kb.scalar("a", f32);
  Tile cb = kb.scalar("b", f32);
  Tile cc = cfg.quadratic ? kb.scalar("c", f32) : Tile();

  Tile i_v = program_id(0);
  Tile i_nh = program_id(1);
  Tile H = q.dim(2), Kdim = q.dim(3);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  const SequenceBounds seq = sequence_bounds(q, cu, cfg.varlen, i_n);
  Tile b = seq.b, bos = seq.bos, eos = seq.eos;
  Tile v0 = i_v * BV;
  Tile n2_slab = i_nh * num_programs(0) + i_v;

  Tile s0 = zeros({BV}, f32);
  Tile S1 = zeros({BK, BV}, f32);
  Tile z1 = zeros({BK}, f32);
  Tile sym_w = symmetric_weights(BK);

  auto token = [&](Tile t) {
    Tile qt = load(q, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32) * scale;
    Tile kt = load(k, {b, t, i_h, 0}, {kIndex, kIndex, kIndex, BK}).to(f32);
    Tile vt = load(v, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}).to(f32);
    s0 = s0 + vt;
    S1 = S1 + expand_dims(kt, 1) * expand_dims(vt, 0);
    Tile ot = s0 * ca + sum(expand_dims(qt, 1) * S1, 0) * cb;
    Tile den;
    if (cfg.normalize) {
      z1 = z1 + kt;
      den = (t - bos + 1).to(f32) * ca + sum(qt * z1, 0) * cb + kPolyEps;
    }

    if (cfg.quadratic) {
      Tile o2 = zeros({BV}, f32);
      Tile den2 = constant(0, f32);
      auto step = [&](Tile d) {
        Tile row0 = state2_row(d, Kdim), rows = Kdim - d;
        Tile qd = load(q, {b, t, i_h, d}, {kIndex, kIndex, kIndex, kIndex}).to(f32) * scale;
        Tile kd = load(k, {b, t, i_h, d}, {kIndex, kIndex, kIndex, kIndex}).to(f32);
        Tile qs = load(q, {b, t, i_h, d}, {kIndex, kIndex, kIndex, BK}).to(f32) * scale;
        Tile ks = load(k, {b, t, i_h, d}, {kIndex, kIndex, kIndex, BK}).to(f32) * kd;
        Tile qw = qs * sym_w * qd;
        // Before the sequence's second token the state is empty: read nothing.
        AccessOptions before{.limits = {{1, row0 + rows * minimum(t - bos, 1)}}};
        AccessOptions rows_d{.limits = {{1, row0 + rows}}};
        Tile S2 = load(s2, {i_nh, row0, v0}, {kIndex, BK, BV}, before) + expand_dims(ks, 1) * expand_dims(vt, 0);
        store(s2, {i_nh, row0, v0}, {kIndex, BK, BV}, S2, rows_d);
        o2 = o2 + sum(expand_dims(qw, 1) * S2, 0);
        if (cfg.normalize) {
          // Row d of the symmetric part of Z2 = sum k^T k (norm2, one column), as S2 for v = 1.
          Tile z2 = load(n2, {n2_slab, row0, 0}, {kIndex, BK, kIndex}, before) + ks;
          store(n2, {n2_slab, row0, 0}, {kIndex, BK, kIndex}, z2, rows_d);
          den2 = den2 + sum(qw * z2, 0);
        }
      };
      if (cfg.normalize)
        for_range(0, Kdim, step, o2, den2);
      else
        for_range(0, Kdim, step, o2);
      ot = ot + o2 * cc;
      if (cfg.normalize) den = den + den2 * cc;
    }
    if (cfg.normalize) ot = ot / den;
    store(o, {b, t, i_h, v0}, {kIndex, kIndex, kIndex, BV}, ot.to(dt));
  };
  if (cfg.normalize)
    for_range(bos, eos, token, s0, S1, z1);
  else
    for_range(bos, eos, token, s0, S1);
  return kb.finish();
}

void check_poly_coefficients(double a, double b, double c, bool normalize) {
  if (!std::isfinite(a) || !std::isfinite(b) || !std::isfinite(c))
    throw UserError(fmt::format("poly: coefficients must be finite, got a={} b={} c={}", a, b, c));
  if (!normalize) return;
  // f > 0 everywhere: a parabola opening upwards without a real root, or a positive constant. A
  // linear f (c = 0, b != 0) changes sign, and c < 0 goes negative for large |x|.
  bool positive = c > 0 ? b * b < 4 * a * c : c == 0 && b == 0 && a > 0;
  if (!positive)
    throw UserError(fmt::format(
        "poly: f(x) = a + b x + c x^2 with a={} b={} c={} is not positive for every x, so the normalized "
        "output can divide by zero or flip sign (need c > 0 and b^2 < 4ac, or b = c = 0 < a); choose other "
        "coefficients or pass --no-normalize",
        a, b, c));
}

namespace {

const std::vector<std::pair<std::string, std::string>>& poly_config_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"chunk", "rows per chunk (16, 32, 64, 128)"},
      {"bv", "value columns per program (16..128)"},
      {"warps", "warps per program (2, 4, 8)"},
      {"stages", "pipeline stages of the loads (1 or 2)"},
  };
  return keys;
}

enum class PolyKernel { chunked, deg2, recurrent };

/// Kernels are recorded once per configuration and shared (the IR is immutable once built).
std::shared_ptr<ir::Kernel> cached_poly_kernel(const PolyConfig& cfg, PolyKernel which) {
  static KernelMemo memo;
  std::string key =
      fmt::format("{}/{}/{}/{}/{}/{}{}{}/{}/{}", static_cast<int>(which), dtype_name(cfg.dtype), cfg.chunk, cfg.block_k,
                  cfg.block_v, cfg.normalize, cfg.quadratic, cfg.varlen, cfg.num_warps, cfg.num_stages);
  return memo.get(key, [&] {
    return which == PolyKernel::chunked ? build_poly_fwd(cfg)
           : which == PolyKernel::deg2  ? build_poly_fwd_deg2(cfg)
                                        : build_poly_recurrent(cfg);
  });
}

/// The configuration of kernel `which` for the given head dims (opts.config and --chunk-size override
/// the defaults, for every kernel alike).
PolyConfig poly_config(const OpOptions& opts, int64_t K, int64_t V, PolyKernel which, bool quadratic = true) {
  check_config_keys("poly", opts, poly_config_keys());
  PolyConfig cfg;
  cfg.dtype = opts.dtype;
  cfg.block_k = padded_head_dim(K);
  cfg.quadratic = quadratic;
  cfg.normalize = !opts.no_normalize;
  // The defaults (what runs untuned, and the tuner's first candidate) are configurations that ptxas
  // assembles without spills for sm_80 and sm_90a in every dtype (tests/python/test_ptxas.py). The two
  // chunked kernels must split intra- and inter-chunk alike, so they share the chunk size; warps may differ.
  int chunk = cfg.block_k <= 64 ? 64 : 32;
  int warps = 4;
  if (which == PolyKernel::chunked && cfg.block_k <= 64) warps = 8;
  if (which == PolyKernel::deg2) warps = 8;  // 4 warps spill since global-memory state stores are fenced
  if (which == PolyKernel::recurrent && cfg.block_k > 64) warps = 8;
  cfg.chunk = static_cast<int>(
      config_value(opts, "chunk", checked_chunk_size(opts.chunk_size, chunk), {16, 32, 64, 128}));
  cfg.block_v = static_cast<int>(config_value(opts, "bv", std::min(64, padded_head_dim(V)), {16, 32, 64, 128}));
  cfg.num_warps = static_cast<int>(config_value(opts, "warps", warps, {2, 4, 8}));
  cfg.num_stages = static_cast<int>(config_value(opts, "stages", 2, {1, 2}));
  return cfg;
}

/// The defaults first, then configurations that ptxas assembles without spills for sm_90a in bf16 (but
/// chunk 64 at BK = 128, which spills 16-52 bytes: the timing decides). A config applies to both chunked
/// kernels alike: they must share the chunk size. The key width splits the space: with BK = 128 every
/// tile of Q and K is twice as wide, so chunks of 128 spill kilobytes there and are left out, while with
/// BK <= 64 a chunk of 128 fits with 32 value columns and one stage. The tuner skips what does not fit.
std::vector<Config> poly_tuning_space(const ProblemShape& s, DType) {
  std::vector<Config> space = {{}};  // the defaults: chunk 64 (BK <= 64) or 32, warps per kernel
  if (padded_head_dim(s.K) <= 64) {
    space.push_back({{"chunk", 16}});
    space.push_back({{"chunk", 32}});
    space.push_back({{"stages", 1}});
    space.push_back({{"chunk", 32}, {"stages", 1}});
    if (s.V > 32) space.push_back({{"bv", 32}});  // twice the programs, for few sequences x heads
    space.push_back({{"chunk", 128}, {"bv", 32}, {"stages", 1}});
  } else {
    // Only chunk 64 beside the default: on an H200 at B8 H16 D128 bf16 (timed at T = 1024) the default
    // took 49.7 ms, warps=8 49.7, stages=1 50.7, chunk=16 86.5 and chunk=64 32.6 (it spills 216 bytes,
    // so it is not the default). Each candidate costs ~0.8 s of timing at these run times; with all
    // five the cold start was 6.3-7.1 s, over the 5 s target.
    space.push_back({{"chunk", 64}});
  }
  return space;
}

OpPlan plan_poly_form(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
  SequenceLayout seq = check_qkv_inputs("poly", inputs);
  if (seq.K > 128)
    throw UserError(fmt::format("poly: K up to 128 is supported (the degree-2 state has K(K+1)/2 x V entries "
                                "per head), got K={}",
                                seq.K));
  const double a = opts.a.value_or(1.0), b = opts.b.value_or(1.0), c = opts.c.value_or(0.5);
  check_poly_coefficients(a, b, c, !opts.no_normalize);
  if (opts.backward) return plan_poly_bwd(inputs, opts, wanted, a, b, c);
  if (inputs.count("do")) throw UserError("poly: input 'do' is a gradient; it needs --backward");
  auto config_of = [&](PolyKernel which) {
    PolyConfig cfg = poly_config(opts, seq.K, seq.V, which, c != 0);
    cfg.varlen = seq.varlen;
    return cfg;
  };
  // The launches share the grid and the chunk size: only the warps may differ between them.
  const PolyConfig cfg = config_of(PolyKernel::chunked);

  OpPlan plan;
  for (const char* name : {"q", "k", "v"}) plan.tensors[name] = inputs.at(name).cast(cfg.dtype);
  plan.tensors["o"] = HostTensor::zeros(cfg.dtype, {seq.B, seq.T, seq.H, seq.V});
  if (seq.varlen) plan.tensors["cu_seqlens"] = seq.cu_seqlens;
  const std::array<int64_t, 3> grid = {(seq.V + cfg.block_v - 1) / cfg.block_v, seq.N * seq.H, 1};
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(seq.K)));
  auto launch_of = [&](PolyKernel which, std::initializer_list<const char*> tensors) {
    KernelLaunch l;
    l.kernel = cached_poly_kernel(config_of(which), which);
    l.grid = grid;
    for (const char* name : tensors) l.tensors[name] = name;
    if (seq.varlen) l.tensors["cu_seqlens"] = "cu_seqlens";
    l.scalars["scale"] = scale;
    return l;
  };
  if (cfg.quadratic)
    plan.tensors["state2"] = HostTensor::zeros(DType::f32, {seq.N * seq.H, seq.K * (seq.K + 1) / 2, seq.V});
  // Z2's symmetric part, per program: every V block computes the denominator itself.
  if (cfg.quadratic && cfg.normalize)
    plan.tensors["norm2"] = HostTensor::zeros(DType::f32, {grid[0] * seq.N * seq.H, seq.K * (seq.K + 1) / 2, 1});
  if (opts.recurrent) {
    KernelLaunch l = launch_of(PolyKernel::recurrent, {"q", "k", "v", "o"});
    if (cfg.quadratic) l.tensors["state2"] = "state2";
    if (cfg.quadratic && cfg.normalize) l.tensors["norm2"] = "norm2";
    plan.launches.push_back(std::move(l));
  } else {
    if (cfg.quadratic) {
      plan.tensors["o2"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, seq.V});
      KernelLaunch l = launch_of(PolyKernel::deg2, {"q", "k", "v", "state2", "o2"});
      l.scalars["c"] = c;
      if (cfg.normalize) {
        plan.tensors["den2"] = HostTensor::zeros(DType::f32, {seq.B, seq.T, seq.H, 1});
        l.tensors["norm2"] = "norm2";
        l.tensors["den2"] = "den2";
      }
      plan.launches.push_back(std::move(l));
    }
    KernelLaunch l = launch_of(PolyKernel::chunked, {"q", "k", "v", "o"});
    if (cfg.quadratic) l.tensors["o2"] = "o2";
    if (cfg.quadratic && cfg.normalize) l.tensors["den2"] = "den2";
    plan.launches.push_back(std::move(l));
  }
  // The last launch computes o and takes the coefficients.
  KernelLaunch& last = plan.launches.back();
  last.scalars["a"] = a;
  last.scalars["b"] = b;
  if (cfg.quadratic) last.scalars["c"] = c;
  if (wants(wanted, "o")) plan.outputs["o"] = "o";
  return plan;
}

}  // namespace

OpDef poly_op() {
  OpDef op;
  op.name = "poly";
  op.summary = "normalized polynomial-kernel attention, f(x) = a + b x + c x^2 (default 1, 1, 1/2), chunked with "
               "a factorized degree-2 state (KERNELS.md 4)";
  op.inputs = {
      {"q", true, "[B,T,H,K]", "queries (K <= 128)"},
      {"k", true, "[B,T,H,K]", "keys"},
      {"v", true, "[B,T,H,V]", "values (a non-finite one makes all of its chunk's outputs non-finite)"},
      {"cu_seqlens", false, "[N+1]", "int32/int64 offsets of packed sequences (B must be 1)"},
      {"do", false, "[B,T,H,V]", "--backward: gradient of the loss w.r.t. o"},
  };
  op.outputs = {
      {"o", true, "[B,T,H,V]", "outputs"},
      {"dq", false, "[B,T,H,K]", "--backward (pairwise, O(T^2): slow): gradient w.r.t. q"},
      {"dk", false, "[B,T,H,K]", "--backward: gradient w.r.t. k"},
      {"dv", false, "[B,T,H,V]", "--backward: gradient w.r.t. v"},
  };
  op.flags = {"recurrent", "no_normalize", "coefficients", "noise_dropout", "backward"};
  op.prepare = [](const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
    OpPlan plan = plan_poly_form(inputs, opts, wanted);
    apply_noise_dropout(plan, opts, inputs);
    return plan;
  };
  op.random_inputs = [](const ProblemShape& s, uint64_t seed) {
    TensorMap in;
    in["q"] = random_uniform({s.B, s.T, s.H, s.K}, seed);
    in["k"] = random_uniform({s.B, s.T, s.H, s.K}, seed + 1);
    in["v"] = random_uniform({s.B, s.T, s.H, s.V}, seed + 2);
    return in;
  };
  op.shape_of = [](const TensorMap& in) {
    const HostTensor& q = in.at("q");
    return ProblemShape{q.shape[0], q.shape[1], q.shape[2], q.shape[3], in.at("v").shape[3], false};
  };
  op.tuning_space = poly_tuning_space;
  op.config_keys = poly_config_keys();
  op.kernels = [](const OpOptions& opts) {
    // Both chunked kernels and the recurrent one for K = V = 64 and K = V = 128, all with the
    // degree-2 state and normalization.
    std::vector<std::shared_ptr<ir::Kernel>> out;
    for (int64_t d : {64, 128})
      for (PolyKernel which : {PolyKernel::deg2, PolyKernel::chunked, PolyKernel::recurrent})
        out.push_back(cached_poly_kernel(poly_config(opts, d, d, which), which));
    // The pairwise backward: its 16-bit variants spill 4-16 bytes on sm_80 / sm_90a (ptxas keeps them at
    // 32-64 registers, at 2 or 4 warps alike): left out of the zero-spill list, like linear_attn's fp32
    // backward, until they do not.
    if (opts.dtype == DType::f32)
      for (auto& k : poly_bwd_kernels(opts)) out.push_back(k);
    return out;
  };
  return op;
}

}  // namespace linac
