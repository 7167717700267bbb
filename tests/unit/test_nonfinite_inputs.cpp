// The chunked forms on inputs at the edge of their contracts (issue 23, point 4): a log-decay gate of
// -inf, or a very negative finite one, at single tokens. The recurrence then drops the state there
// (exp(g) = 0), which its float64 form below does exactly; the chunked kernels must give the same finite
// outputs and gradients, whichever row of a chunk or 16-row sub-chunk the gate falls on.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "linac/ops.h"

namespace ops = linac::ops;
using linac::DType;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<float> uniforms(size_t n, unsigned seed, float lo, float hi) {
  std::vector<float> x(n);
  for (auto& v : x) {
    seed = seed * 1103515245u + 12345u;
    v = lo + (hi - lo) * static_cast<float>((seed >> 8) % 65536) / 65536.0f;
  }
  return x;
}

/// One problem, B = 1: q, k [T,H,K], v [T,H,V], do [T,H,V], g [T,H] (scalar gate) or [T,H,K].
struct Problem {
  int64_t T = 100, H = 2, K = 16, V = 16;
  bool per_channel = false;
  std::vector<float> q, k, v, g, dout;

  Problem(bool per_channel_gate, bool positive_qk = false) : per_channel(per_channel_gate) {
    const float lo = positive_qk ? 0.0f : -1.0f;
    q = uniforms(T * H * K, 1, lo, 1.0f), k = uniforms(T * H * K, 2, lo, 1.0f);
    v = uniforms(T * H * V, 3, -1.0f, 1.0f), dout = uniforms(T * H * V, 5, -1.0f, 1.0f);
    g = uniforms(T * H * (per_channel ? K : 1), 4, -0.3f, -0.01f);
  }
  int64_t gate_width() const { return per_channel ? K : 1; }
  /// Sets the gate of token t (every head and channel) to x.
  void set_gate(int64_t t, float x) {
    for (int64_t i = 0; i < H * gate_width(); ++i) g[t * H * gate_width() + i] = x;
  }
  std::vector<int64_t> gate_shape() const {
    return per_channel ? std::vector<int64_t>{1, T, H, K} : std::vector<int64_t>{1, T, H};
  }
};

/// The float64 recurrence S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t (normalized:
/// divided by scale q_t z_t + eps, z_t = diag(exp(g_t)) z_{t-1} + k_t) and its gradients for the
/// upstream gradient `dout`, dg_t = exp(g_t) <dL/dS_t, S_{t-1}> directly (summed over the channels for
/// a scalar gate). The normalized form runs as the plain one on [v, 1] with [do/den, -(do.o)/den].
struct Reference {
  std::vector<double> o, dq, dk, dv, dg;
};

Reference reference(const Problem& p, bool normalize = false) {
  const int64_t T = p.T, H = p.H, K = p.K, V = p.V, W = normalize ? p.V + 1 : p.V, G = p.gate_width();
  const double scale = 1.0 / std::sqrt(static_cast<double>(K)), eps = 1e-6;
  Reference r;
  r.o.assign(T * H * V, 0), r.dq.assign(T * H * K, 0), r.dk.assign(T * H * K, 0), r.dv.assign(T * H * V, 0);
  r.dg.assign(T * H * G, 0);
  for (int64_t h = 0; h < H; ++h) {
    auto q = [&](int64_t t, int64_t d) { return static_cast<double>(p.q[(t * H + h) * K + d]); };
    auto k = [&](int64_t t, int64_t d) { return static_cast<double>(p.k[(t * H + h) * K + d]); };
    auto v = [&](int64_t t, int64_t j) { return j == V ? 1.0 : static_cast<double>(p.v[(t * H + h) * V + j]); };
    auto a = [&](int64_t t, int64_t d) {
      return std::exp(static_cast<double>(p.g[(t * H + h) * G + (G > 1 ? d : 0)]));
    };
    // states[t] is S_t (states[0] the zero state before the first token), [K][W] each.
    std::vector<std::vector<double>> states(T + 1, std::vector<double>(K * W, 0.0));
    std::vector<double> upstream(T * W);  // dL/d(scale q_t S_t), per column
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d = 0; d < K; ++d)
        for (int64_t j = 0; j < W; ++j) states[t + 1][d * W + j] = a(t, d) * states[t][d * W + j] + k(t, d) * v(t, j);
      std::vector<double> out(W, 0.0);
      for (int64_t j = 0; j < W; ++j)
        for (int64_t d = 0; d < K; ++d) out[j] += scale * q(t, d) * states[t + 1][d * W + j];
      for (int64_t j = 0; j < V; ++j) {
        const double dout = p.dout[(t * H + h) * V + j];
        r.o[(t * H + h) * V + j] = normalize ? out[j] / (out[V] + eps) : out[j];
        upstream[t * W + j] = normalize ? dout / (out[V] + eps) : dout;
      }
      if (normalize) {
        double dot = 0;
        for (int64_t j = 0; j < V; ++j) dot += p.dout[(t * H + h) * V + j] * r.o[(t * H + h) * V + j];
        upstream[t * W + V] = -dot / (out[V] + eps);
      }
    }
    std::vector<double> dS(K * W, 0.0);  // dL/dS_t
    for (int64_t t = T - 1; t >= 0; --t) {
      for (int64_t d = 0; d < K; ++d) {
        double dq = 0;
        for (int64_t j = 0; j < W; ++j) {
          dq += scale * states[t + 1][d * W + j] * upstream[t * W + j];
          dS[d * W + j] += scale * q(t, d) * upstream[t * W + j];
        }
        r.dq[(t * H + h) * K + d] = dq;
      }
      for (int64_t d = 0; d < K; ++d) {
        double dk = 0, dg = 0;
        for (int64_t j = 0; j < W; ++j) dk += dS[d * W + j] * v(t, j), dg += dS[d * W + j] * states[t][d * W + j];
        r.dk[(t * H + h) * K + d] = dk;
        r.dg[(t * H + h) * G + (G > 1 ? d : 0)] += a(t, d) * dg;
      }
      for (int64_t j = 0; j < V; ++j) {
        double dv = 0;
        for (int64_t d = 0; d < K; ++d) dv += k(t, d) * dS[d * W + j];
        r.dv[(t * H + h) * V + j] = dv;
      }
      for (int64_t d = 0; d < K; ++d)
        for (int64_t j = 0; j < W; ++j) dS[d * W + j] *= a(t, d);
    }
  }
  return r;
}

/// ||x - ref|| / ||ref||, or infinity where x has a non-finite value.
double rel_err(const std::vector<float>& x, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return kInf;
    num += (x[i] - ref[i]) * (x[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

struct Outputs {
  std::vector<float> o, dq, dk, dv, dg;
};

/// Runs `op` on the interpreter: the forward's o, or with backward the gradients.
Outputs run(const std::string& op, Problem& p, const ops::Options& options) {
  const int64_t T = p.T, H = p.H, K = p.K, V = p.V;
  ops::Tensors in = {{"q", ops::Tensor::host(p.q.data(), DType::f32, {1, T, H, K})},
                     {"k", ops::Tensor::host(p.k.data(), DType::f32, {1, T, H, K})},
                     {"v", ops::Tensor::host(p.v.data(), DType::f32, {1, T, H, V})},
                     {"g", ops::Tensor::host(p.g.data(), DType::f32, p.gate_shape())}};
  Outputs r;
  ops::Tensors out;
  if (options.backward) {
    in["do"] = ops::Tensor::host(p.dout.data(), DType::f32, {1, T, H, V});
    r.dq.resize(T * H * K), r.dk.resize(T * H * K), r.dv.resize(T * H * V), r.dg.resize(T * H * p.gate_width());
    out = {{"dq", ops::Tensor::host(r.dq.data(), DType::f32, {1, T, H, K})},
           {"dk", ops::Tensor::host(r.dk.data(), DType::f32, {1, T, H, K})},
           {"dv", ops::Tensor::host(r.dv.data(), DType::f32, {1, T, H, V})},
           {"dg", ops::Tensor::host(r.dg.data(), DType::f32, p.gate_shape())}};
  } else {
    r.o.resize(T * H * V);
    out = {{"o", ops::Tensor::host(r.o.data(), DType::f32, {1, T, H, V})}};
  }
  ops::run(op, in, out, options);
  return r;
}

/// Rows where the very negative gates go: one token (10, the case), then a middle row (10), a
/// chunk's and a sub-chunk's first row (32), a sub-chunk's last row (47), two adjacent rows (60, 61) and
/// a run across a chunk boundary (62..66).
const std::vector<std::vector<int64_t>> kStopRows = {{10}, {10, 32, 47, 60, 61, 62, 63, 64, 65, 66}};

// Forward and gradients of the chunked forms within these relative errors of the float64 recurrence.
// Rows after a stopped one in the same chunk take decays as differences of cumulative gates that
// include the floor of -128 (kernels/common/log_decay.h), rounded to ulp(128) ~ 1.5e-5.
constexpr double kTol = 1e-4;

void check_gates_that_stop_the_state(const std::string& op, bool per_channel, const ops::Options& options,
                                     bool normalize = false) {
  for (const auto& rows : kStopRows)
    for (double stop : {-kInf, -3e38, -1e4}) {
      CAPTURE(rows.size());
      CAPTURE(stop);
      Problem p(per_channel, normalize);
      for (int64_t t : rows) p.set_gate(t, static_cast<float>(stop));
      const Reference ref = reference(p, normalize);
      Outputs got = run(op, p, options);
      if (options.backward) {
        CHECK(rel_err(got.dq, ref.dq) < kTol);
        CHECK(rel_err(got.dk, ref.dk) < kTol);
        CHECK(rel_err(got.dv, ref.dv) < kTol);
        CHECK(rel_err(got.dg, ref.dg) < kTol);
      } else {
        CHECK(rel_err(got.o, ref.o) < kTol);
      }
    }
}

ops::Options with(const std::string& text) {
  return ops::Options::parse(text);
}

}  // namespace

TEST_CASE("the float64 reference of this file agrees with the ops on ordinary gates") {
  // So that its use below checks the kernels and not the reference.
  for (bool per_channel : {false, true}) {
    Problem p(per_channel);
    const Reference ref = reference(p);
    const std::string op = per_channel ? "gla" : "linear_attn";
    CHECK(rel_err(run(op, p, {}).o, ref.o) < 1e-5);
    Outputs grads = run(op, p, with("backward=1"));
    CHECK(rel_err(grads.dq, ref.dq) < 1e-5);
    CHECK(rel_err(grads.dg, ref.dg) < 1e-5);
  }
  Problem p(false, true);
  CHECK(rel_err(run("linear_attn", p, with("normalize=1")).o, reference(p, true).o) < 1e-5);
  CHECK(rel_err(run("linear_attn", p, with("normalize=1,backward=1")).dk, reference(p, true).dk) < 1e-5);
}

TEST_CASE("chunked linear_attn with a gate of -inf: outputs and gradients of the recurrence") {
  for (std::string options : {"chunk_size=16", "chunk_size=64", "recurrent=1", "backward=1", "backward=1,chunk=64"}) {
    CAPTURE(options);
    check_gates_that_stop_the_state("linear_attn", false, with(options));
  }
}

TEST_CASE("chunked linear_attn --normalize with a gate of -inf: outputs and gradients of the recurrence") {
  check_gates_that_stop_the_state("linear_attn", false, with("normalize=1,chunk_size=64"), true);
  check_gates_that_stop_the_state("linear_attn", false, with("normalize=1,backward=1"), true);
}

TEST_CASE("chunked gla with a gate of -inf: outputs and gradients of the recurrence") {
  for (std::string options : {"chunk_size=16", "chunk_size=64", "split=1,chunk=64", "recurrent=1", "backward=1",
                              "backward=1,chunk=64", "backward=1,split=1,chunk=64", "backward=1,tokenwise=1"}) {
    CAPTURE(options);
    check_gates_that_stop_the_state("gla", true, with(options));
  }
}
