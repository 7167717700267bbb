#include "kernels/common/noise_dropout.h"

#include <cmath>
#include <fmt/format.h>
#include <numbers>

#include "kernels/common/elementwise.h"
#include "linac/error.h"

namespace linac {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

HostTensor noise_dropout_multipliers(const std::vector<int64_t>& shape, double p, uint64_t seed) {
  HostTensor m = HostTensor::zeros(DType::f32, shape);
  float* out = reinterpret_cast<float*>(m.materialize());
  const uint64_t key = splitmix64(seed);
  const double sd = std::sqrt(p), two_pi = 2 * std::numbers::pi;
  for (int64_t i = 0, n = m.numel(); i < n; ++i) {
    const uint64_t r1 = splitmix64(key + 2 * static_cast<uint64_t>(i)), r2 = splitmix64(key + 2 * static_cast<uint64_t>(i) + 1);
    const double u1 = static_cast<double>((r1 >> 11) + 1) * 0x1p-53, u2 = static_cast<double>(r2 >> 11) * 0x1p-53;
    const double psi = sd * std::sqrt(-2 * std::log(u1)) * std::cos(two_pi * u2);
    out[i] = static_cast<float>((1 - p) * (1 + psi));
  }
  return m;
}

void apply_noise_dropout(OpPlan& plan, const OpOptions& opts, const TensorMap& inputs) {
  if (!opts.noise_dropout) return;
  const HostTensor& q = inputs.at("q");
  const std::vector<int64_t> o_shape = {q.shape.at(0), q.shape.at(1), q.shape.at(2), inputs.at("v").shape.at(3)};
  const double p = *opts.noise_dropout;
  if (!(p >= 0 && p < 1)) throw UserError(fmt::format("--noise-dropout {}: must be in [0, 1)", p));
  plan.tensors["noise_multipliers"] = noise_dropout_multipliers(o_shape, p, opts.seed);
  if (opts.backward) {
    if (!plan.tensors.count("do")) throw InternalError("noise-dropout: the backward plan has no 'do'");
    plan.launches.insert(plan.launches.begin(),
                         elementwise_update_launch(plan, ElementwiseUpdate::mul, "do", "noise_multipliers"));
    return;
  }
  auto o = plan.outputs.find("o");
  if (o == plan.outputs.end()) return;  // only states wanted: the noise is on o alone
  plan.launches.push_back(elementwise_update_launch(plan, ElementwiseUpdate::mul, o->second, "noise_multipliers"));
}

}  // namespace linac
