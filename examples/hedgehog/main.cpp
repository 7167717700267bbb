// Hedgehog linear attention, out of tree: build the DSL kernel (hedgehog_kernel.cpp), check it against
// a naive token-by-token reference in double, and on a GPU autotune its chunk size.
//
//   ./hedgehog [--device auto|cpu|gpu] [--dtype f32|bf16] [--chunk N] [--B N --T N --H N --K N --V N]
//              [--F N] [--dump-ptx FILE] [--arch sm_80|sm_90a] [--print-ir]
//
// Exits 0 when every kernel that ran matches the reference (max |o - ref| / max |ref| below 1e-5 in
// f32, 2e-2 in bf16), 1 when one does not, 2 on a usage error or when linac reports one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <optional>
#include <string>
#include <vector>

#include "linac/runtime.h"
#include "hedgehog_kernel.h"

namespace rt = linac::runtime;
using linac::DType;

namespace {

struct Options {
  rt::Device device = rt::Device::automatic;
  std::optional<DType> dtype;
  std::optional<int> chunk;
  int64_t B = 0, T = 0, H = 0, K = 64, V = 64;  // 0: a default that depends on the device
  int64_t F = 32;                               // features per half of phi
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
    else if (a == "--F") o.F = parse_int(a, value(i));
    else if (a == "--dump-ptx") o.dump_ptx = value(i);
    else if (a == "--arch") o.arch = rt::parse_arch(value(i));
    else if (a == "--print-ir") o.print_ir = true;
    else throw linac::UserError(fmt::format("unknown option '{}' (see the comment at the top of main.cpp)", a));
  }
  if (o.dtype && *o.dtype != DType::f32 && *o.dtype != DType::bf16 && *o.dtype != DType::f16)
    throw linac::UserError("--dtype must be f32, bf16 or f16");
  if ((o.F & (o.F - 1)) != 0 || o.F < 16) throw linac::UserError("--F must be a power of two, at least 16");
  return o;
}

int64_t next_pow2(int64_t x) {
  int64_t p = 16;
  while (p < x) p *= 2;
  return p;
}

/// phi(x) = [softmax(x W), softmax(-x W)] in double; x [K], W [K, F] -> [2F].
std::vector<double> feature_map(const float* x, const float* W, int64_t K, int64_t F) {
  std::vector<double> phi(static_cast<size_t>(2 * F));
  for (int64_t f = 0; f < F; ++f) {
    double acc = 0;
    for (int64_t i = 0; i < K; ++i) acc += double(x[i]) * W[i * F + f];
    phi[f] = acc, phi[F + f] = -acc;
  }
  for (int half = 0; half < 2; ++half) {
    double* p = phi.data() + half * F;
    const double m = *std::max_element(p, p + F);
    double total = 0;
    for (int64_t f = 0; f < F; ++f) total += p[f] = std::exp(p[f] - m);
    for (int64_t f = 0; f < F; ++f) p[f] /= total;
  }
  return phi;
}

/// The recurrence exactly as written, token by token, in double. q, k [B,T,H,K], v [B,T,H,V], w [H,K,F].
std::vector<double> reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                              const std::vector<float>& w, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V,
                              int64_t F) {
  const int64_t D = 2 * F;
  std::vector<double> o(static_cast<size_t>(B * T * H * V)), S(static_cast<size_t>(D * V)), z(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const float* W = w.data() + h * K * F;
      std::fill(S.begin(), S.end(), 0.0);
      std::fill(z.begin(), z.end(), 0.0);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t qk = ((b * T + t) * H + h) * K, vo = ((b * T + t) * H + h) * V;
        const std::vector<double> pq = feature_map(&q[qk], W, K, F), pk = feature_map(&k[qk], W, K, F);
        for (int64_t i = 0; i < D; ++i) {
          z[i] += pk[i];
          for (int64_t j = 0; j < V; ++j) S[i * V + j] += pk[i] * v[vo + j];
        }
        double den = 0;
        for (int64_t i = 0; i < D; ++i) den += pq[i] * z[i];
        for (int64_t j = 0; j < V; ++j) {
          double num = 0;
          for (int64_t i = 0; i < D; ++i) num += pq[i] * S[i * V + j];
          o[vo + j] = num / den;
        }
      }
    }
  }
  return o;
}

struct Candidate {
  int chunk = 0;
  double rel_err = 0;
  std::optional<double> median_ms;
  std::string status;
};

int run(const Options& opt) {
  const rt::Device device = rt::resolve(opt.device);
  const bool gpu = device == rt::Device::gpu;
  if (gpu) fmt::print("GPU: {}\n", rt::gpu_summary());  // UserError here when --device gpu has no GPU
  const int64_t B = opt.B ? opt.B : (gpu ? 4 : 2), T = opt.T ? opt.T : (gpu ? 2048 : 200);
  const int64_t H = opt.H ? opt.H : (gpu ? 8 : 4), K = opt.K, V = opt.V;
  const DType dt = opt.dtype.value_or(gpu ? DType::bf16 : DType::f32);
  const double tolerance = dt == DType::f32 ? 1e-5 : 2e-2;
  const int64_t F = opt.F;
  fmt::print("hedgehog: B={} T={} H={} K={} V={} F={} {} on {}\n", B, T, H, K, V, F, linac::dtype_name(dt),
             gpu ? "the GPU" : "the CPU interpreter");

  // Inputs uniform in [-1, 1), one seed each, rounded to the kernel's dtype in place: the reference sees them.
  std::vector<float> qf = rt::random_uniform(B * T * H * K, 1), kf = rt::random_uniform(B * T * H * K, 2),
                     vf = rt::random_uniform(B * T * H * V, 3), wf = rt::random_uniform(H * K * F, 4);
  // W like a freshly initialized projection: entries of x W about unit size.
  for (auto& e : wf) e *= static_cast<float>(2.0 / std::sqrt(static_cast<double>(K)));
  rt::HostArray q(qf, dt, {B, T, H, K}), k(kf, dt, {B, T, H, K}), v(vf, dt, {B, T, H, V}), w(wf, dt, {H, K, F}),
      o(dt, {B, T, H, V});
  const std::vector<double> ref = reference(qf, kf, vf, wf, B, T, H, K, V, F);
  const rt::Args args = {{"q", q.view()}, {"k", k.view()}, {"v", v.view()}, {"w", w.view()}, {"o", o.view()}};

  // Chunk size is a compile-time constant: each candidate is its own kernel, compiled on first use.
  std::vector<int> chunks = opt.chunk ? std::vector<int>{*opt.chunk} : gpu ? std::vector<int>{16, 32, 64, 128}
                                                                            : std::vector<int>{64};
  auto config = [&](int chunk) {
    HedgehogConfig cfg;
    cfg.features = static_cast<int>(F);
    cfg.chunk = chunk, cfg.block_k = static_cast<int>(next_pow2(K)), cfg.block_v = static_cast<int>(std::min<int64_t>(next_pow2(V), 64));
    cfg.dtype = dt;
    return cfg;
  };
  std::vector<Candidate> table;
  bool all_ok = true;
  for (int chunk : chunks) {
    Candidate c{chunk, 0, std::nullopt, "ok"};
    HedgehogConfig cfg = config(chunk);
    const rt::Grid grid{(V + cfg.block_v - 1) / cfg.block_v, B * H, 1};
    o.poison();  // NaN: an element the kernel misses fails the check
    try {
      auto kernel = build_hedgehog(cfg);
      if (opt.print_ir) fmt::print("{}", rt::print_ir(*kernel));
      rt::run(*kernel, grid, args, device);
      c.rel_err = rt::max_relative_error(o.to_floats(), ref);
      if (!(c.rel_err < tolerance)) c.status = "WRONG", all_ok = false;
      if (gpu) c.median_ms = rt::time_on_gpu(*kernel, grid, args, /*runs=*/20).median_ms;
    } catch (const linac::UserError& e) {
      // On a GPU a candidate may not fit (e.g. shared memory): skip it, as an autotuner does.
      if (!gpu || chunks.size() == 1) throw;
      c.status = fmt::format("skipped: {}", e.what());
    }
    table.push_back(c);
  }

  fmt::print("{:>5}  {:>10}  {:>10}  {}\n", "chunk", "rel_err", "median_ms", "status");
  const Candidate* best = nullptr;
  for (const auto& c : table) {
    fmt::print("{:>5}  {:>10.3e}  {:>10}  {}\n", c.chunk, c.rel_err,
               c.median_ms ? fmt::format("{:.4f}", *c.median_ms) : "-", c.status);
    if (c.status == "ok" && (!best || (c.median_ms && *c.median_ms < *best->median_ms))) best = &c;
  }
  if (!best) {
    fmt::print("no chunk size passed the check (tolerance {:.0e})\n", tolerance);
    return 1;
  }
  if (gpu && table.size() > 1) fmt::print("fastest: chunk {} ({:.4f} ms)\n", best->chunk, *best->median_ms);

  if (!opt.dump_ptx.empty()) {
    const rt::Arch arch = opt.arch.value_or(gpu ? rt::gpu_arch() : rt::Arch::sm_90a);
    const rt::Compiled compiled = rt::compile(*build_hedgehog(config(best->chunk)), arch);
    std::FILE* f = std::fopen(opt.dump_ptx.c_str(), "wb");
    if (!f || std::fwrite(compiled.ptx.data(), 1, compiled.ptx.size(), f) != compiled.ptx.size())
      throw linac::UserError(fmt::format("cannot write {}", opt.dump_ptx));
    std::fclose(f);
    fmt::print("wrote the {} PTX of chunk {} to {} ({} lines)\n", rt::arch_name(arch), best->chunk, opt.dump_ptx,
               std::count(compiled.ptx.begin(), compiled.ptx.end(), '\n'));
  }
  fmt::print("{}\n", all_ok ? "PASS" : "FAIL");
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {  // linac::UserError: a message to act on; anything else: a bug
    fmt::print(stderr, "hedgehog: error: {}\n", e.what());
    return 2;
  }
}
