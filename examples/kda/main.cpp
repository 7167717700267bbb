// Kimi Delta Attention, out of tree: build the DSL kernels (kda_kernel.cpp), check the chunked and the
// token-by-token one (output and final state, from a random initial state) against the recurrence in
// double, and on a GPU autotune the chunked kernel's chunk size.
//
//   ./kda [--device auto|cpu|gpu] [--dtype f32|bf16] [--chunk N] [--B N --T N --H N --K N --V N]
//         [--dump-ptx FILE] [--arch sm_80|sm_90a] [--print-ir]
//
// Exits 0 when every kernel that ran matches the reference (max |x - ref| / max |ref| below 1e-5 in
// f32, 3e-2 in bf16), 1 when one does not, 2 on a usage error or when linac reports one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <optional>
#include <string>
#include <vector>

#include "kda_kernel.h"
#include "linac/runtime.h"

namespace rt = linac::runtime;
using linac::DType;

namespace {

struct Options {
  rt::Device device = rt::Device::automatic;
  std::optional<DType> dtype;
  std::optional<int> chunk;
  int64_t B = 0, T = 0, H = 0, K = 64, V = 64;  // 0: a default that depends on the device
  std::string dump_ptx;
  std::optional<rt::Arch> arch;
  bool print_ir = false;
};

int64_t parse_int(const std::string& flag, const std::string& s) {
  size_t pos = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size() || v < 1) throw linac::UserError(fmt::format("{} expects a positive integer, got '{}'", flag, s));
  return v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw linac::UserError(fmt::format("{} needs a value", argv[i]));
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device") o.device = rt::parse_device(value(i));
    else if (a == "--dtype") o.dtype = linac::parse_dtype(value(i)).value_or(DType::i1);
    else if (a == "--chunk") o.chunk = static_cast<int>(parse_int(a, value(i)));
    else if (a == "--B") o.B = parse_int(a, value(i));
    else if (a == "--T") o.T = parse_int(a, value(i));
    else if (a == "--H") o.H = parse_int(a, value(i));
    else if (a == "--K") o.K = parse_int(a, value(i));
    else if (a == "--V") o.V = parse_int(a, value(i));
    else if (a == "--dump-ptx") o.dump_ptx = value(i);
    else if (a == "--arch") o.arch = rt::parse_arch(value(i));
    else if (a == "--print-ir") o.print_ir = true;
    else throw linac::UserError(fmt::format("unknown option '{}' (see the comment at the top of main.cpp)", a));
  }
  if (o.dtype && *o.dtype != DType::f32 && *o.dtype != DType::bf16 && *o.dtype != DType::f16)
    throw linac::UserError("--dtype must be f32, bf16 or f16");
  return o;
}

int64_t next_pow2(int64_t x) {
  int64_t p = 16;
  while (p < x) p *= 2;
  return p;
}

/// The recurrence exactly as written, token by token, in double, q and k L2-normalized: o [B,T,H,V] and
/// the final state [B,H,K,V] from s0.
struct Reference {
  std::vector<double> o, state;
};
Reference reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<float>& g, const std::vector<float>& beta, const std::vector<float>& s0,
                    int64_t B, int64_t T, int64_t H, int64_t K, int64_t V) {
  Reference r{std::vector<double>(static_cast<size_t>(B * T * H * V)), std::vector<double>(s0.begin(), s0.end())};
  const double scale = 1.0 / std::sqrt(double(K));
  std::vector<double> qn(K), kn(K), kS(V);
  auto normalized = [&](const std::vector<float>& x, int64_t at, std::vector<double>& out) {
    double ss = 0;
    for (int64_t i = 0; i < K; ++i) ss += double(x[at + i]) * x[at + i];
    for (int64_t i = 0; i < K; ++i) out[i] = x[at + i] / std::sqrt(ss + kKdaNormEps);
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      double* S = &r.state[static_cast<size_t>((b * H + h) * K * V)];
      for (int64_t t = 0; t < T; ++t) {
        const int64_t qk = ((b * T + t) * H + h) * K, vo = ((b * T + t) * H + h) * V;
        const double bt = beta[(b * T + t) * H + h];
        normalized(q, qk, qn);
        normalized(k, qk, kn);
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) S[i * V + j] *= std::exp(double(g[qk + i]));
        std::fill(kS.begin(), kS.end(), 0.0);
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) kS[j] += kn[i] * S[i * V + j];
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) S[i * V + j] += bt * kn[i] * (v[vo + j] - kS[j]);
        for (int64_t j = 0; j < V; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < K; ++i) acc += qn[i] * S[i * V + j];
          r.o[vo + j] = scale * acc;
        }
      }
    }
  return r;
}

struct Candidate {
  std::string kernel;
  int chunk = 0;
  double err_o = 0, err_state = 0;
  std::optional<double> median_ms;
  std::string status;
};

int run(const Options& opt) {
  const rt::Device device = rt::resolve(opt.device);
  const bool gpu = device == rt::Device::gpu;
  if (gpu) fmt::print("GPU: {}\n", rt::gpu_summary());  // UserError here when --device gpu has no GPU
  const int64_t B = opt.B ? opt.B : (gpu ? 4 : 2), T = opt.T ? opt.T : (gpu ? 2048 : 100);
  const int64_t H = opt.H ? opt.H : (gpu ? 8 : 2), K = opt.K, V = opt.V;
  const DType dt = opt.dtype.value_or(gpu ? DType::bf16 : DType::f32);
  const double tolerance = dt == DType::f32 ? 1e-5 : 3e-2;
  fmt::print("kda: B={} T={} H={} K={} V={} {} on {}\n", B, T, H, K, V, linac::dtype_name(dt),
             gpu ? "the GPU" : "the CPU interpreter");

  // Inputs uniform in [-1, 1), one seed each, rounded to the kernel's dtype in place: the reference sees them.
  // Log-decays in [-0.5, 0), channel 0 of every head steep (about -6 per token: gated_scores'
  // elementwise form); beta in (0, 1). g, beta and the states are f32 tensors.
  std::vector<float> qf = rt::random_uniform(B * T * H * K, 1), kf = rt::random_uniform(B * T * H * K, 2),
                     vf = rt::random_uniform(B * T * H * V, 3), gf = rt::random_uniform(B * T * H * K, 4, -0.5f, 0.0f),
                     bf = rt::random_uniform(B * T * H, 5, 0.0f, 1.0f), s0 = rt::random_uniform(B * H * K * V, 6);
  for (size_t i = 0; i < gf.size(); i += K) gf[i] *= 24.0f;
  rt::HostArray q(qf, dt, {B, T, H, K}), k(kf, dt, {B, T, H, K}), v(vf, dt, {B, T, H, V}), o(dt, {B, T, H, V}),
      final_state(DType::f32, {B, H, K, V});
  const Reference ref = reference(qf, kf, vf, gf, bf, s0, B, T, H, K, V);
  const rt::Args args = {{"q", q.view()}, {"k", k.view()}, {"v", v.view()},
                         {"g", rt::TensorView::of(gf.data(), {B, T, H, K})},
                         {"beta", rt::TensorView::of(bf.data(), {B, T, H})},
                         {"initial_state", rt::TensorView::of(s0.data(), {B, H, K, V})},
                         {"o", o.view()}, {"final_state", final_state.view()},
                         {"scale", 1.0 / std::sqrt(double(K))}};

  // Chunk size is a compile-time constant: each candidate is its own kernel, compiled on first use.
  std::vector<int> chunks = opt.chunk ? std::vector<int>{*opt.chunk} : gpu ? std::vector<int>{16, 32, 64}
                                                                            : std::vector<int>{32};
  auto config = [&](int chunk) {
    KdaConfig cfg;
    cfg.chunk = chunk, cfg.block_k = static_cast<int>(next_pow2(K));
    // The state block [BK, BV] in fp32 at most 64 x 64 (kda_op.cpp says why).
    cfg.block_v = static_cast<int>(std::min<int64_t>(next_pow2(V), std::max<int64_t>(16, 4096 / cfg.block_k)));
    cfg.dtype = dt;
    cfg.initial_state = true;
    return cfg;
  };
  std::vector<Candidate> table;
  bool all_ok = true;
  auto check = [&](const std::string& name, int chunk, const std::shared_ptr<linac::ir::Kernel>& kernel) {
    Candidate c{name, chunk, 0, 0, std::nullopt, "ok"};
    const KdaConfig cfg = config(chunk);
    const rt::Grid grid{(V + cfg.block_v - 1) / cfg.block_v, B * H, 1};
    o.poison();  // NaN: an element the kernel misses fails the check
    final_state.poison();
    if (opt.print_ir) fmt::print("{}", rt::print_ir(*kernel));
    rt::run(*kernel, grid, args, device);
    c.err_o = rt::max_relative_error(o.to_floats(), ref.o);
    c.err_state = rt::max_relative_error(final_state.to_floats(), ref.state);
    if (!(c.err_o < tolerance && c.err_state < tolerance)) c.status = "WRONG", all_ok = false;
    if (gpu) c.median_ms = rt::time_on_gpu(*kernel, grid, args, /*runs=*/20).median_ms;
    table.push_back(c);
  };
  check("recurrent", 0, build_kda_recurrent(config(16)));
  for (int chunk : chunks) {
    try {
      check("chunked", chunk, build_kda_chunked(config(chunk)));
    } catch (const linac::UserError& e) {
      // On a GPU a candidate may not fit (e.g. shared memory): skip it, as an autotuner does.
      if (!gpu || chunks.size() == 1) throw;
      table.push_back({"chunked", chunk, 0, 0, std::nullopt, fmt::format("skipped: {}", e.what())});
    }
  }

  fmt::print("{:>9}  {:>5}  {:>10}  {:>11}  {:>10}  {}\n", "kernel", "chunk", "rel_err o", "rel_err S_T", "median_ms",
             "status");
  const Candidate* best = nullptr;
  for (const auto& c : table) {
    fmt::print("{:>9}  {:>5}  {:>10.3e}  {:>11.3e}  {:>10}  {}\n", c.kernel, c.chunk ? fmt::format("{}", c.chunk) : "-",
               c.err_o, c.err_state, c.median_ms ? fmt::format("{:.4f}", *c.median_ms) : "-", c.status);
    if (c.kernel == "chunked" && c.status == "ok" && (!best || (c.median_ms && *c.median_ms < *best->median_ms)))
      best = &c;
  }
  if (!best) {
    fmt::print("no chunk size passed the check (tolerance {:.0e})\n", tolerance);
    return 1;
  }
  if (gpu && chunks.size() > 1) fmt::print("fastest: chunk {} ({:.4f} ms)\n", best->chunk, *best->median_ms);

  if (!opt.dump_ptx.empty()) {
    const rt::Arch arch = opt.arch.value_or(gpu ? rt::gpu_arch() : rt::Arch::sm_90a);
    const rt::Compiled compiled = rt::compile(*build_kda_chunked(config(best->chunk)), arch);
    std::FILE* f = std::fopen(opt.dump_ptx.c_str(), "wb");
    if (!f || std::fwrite(compiled.ptx.data(), 1, compiled.ptx.size(), f) != compiled.ptx.size())
      throw linac::UserError(fmt::format("cannot write {}", opt.dump_ptx));
    std::fclose(f);
    fmt::print("wrote the {} PTX of the chunked kernel, chunk {}, to {} ({} lines)\n", rt::arch_name(arch),
               best->chunk, opt.dump_ptx, std::count(compiled.ptx.begin(), compiled.ptx.end(), '\n'));
  }
  fmt::print("{}\n", all_ok ? "PASS" : "FAIL");
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {  // linac::UserError: a message to act on; anything else: a bug
    fmt::print(stderr, "kda: error: {}\n", e.what());
    return 2;
  }
}
