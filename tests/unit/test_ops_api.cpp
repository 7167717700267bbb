// linac/ops.h on host memory (the CPU interpreter): preparation once per key, inputs converted to the
// kernels' dtype, inputs never written, outputs checked against the plan, options parsed.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "linac/ops.h"

namespace ops = linac::ops;
using linac::DType;

namespace {

std::vector<float> randoms(size_t n, unsigned seed) {
  std::vector<float> x(n);
  for (auto& v : x) {
    seed = seed * 1103515245u + 12345u;
    v = static_cast<float>((seed >> 16) % 2001) / 1000.0f - 1.0f;
  }
  return x;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const linac::UserError& e) {
    return e.what();
  }
  return "(no error)";
}

constexpr int64_t B = 1, T = 40, H = 2, D = 16;

struct Inputs {
  std::vector<float> q = randoms(B * T * H * D, 1), k = randoms(B * T * H * D, 2), v = randoms(B * T * H * D, 3);
  std::vector<float> g = randoms(B * T * H * D, 4), o = std::vector<float>(B * T * H * D);
  Inputs() {
    for (auto& x : g) x = -0.1f - 0.2f * std::abs(x);  // log-decays
  }
  ops::Tensors gla() {
    return {{"q", ops::Tensor::host(q.data(), DType::f32, {B, T, H, D})},
            {"k", ops::Tensor::host(k.data(), DType::f32, {B, T, H, D})},
            {"v", ops::Tensor::host(v.data(), DType::f32, {B, T, H, D})},
            {"g", ops::Tensor::host(g.data(), DType::f32, {B, T, H, D})}};
  }
  ops::Tensors out() { return {{"o", ops::Tensor::host(o.data(), DType::f32, {B, T, H, D})}}; }
};

}  // namespace

TEST_CASE("ops::run prepares a call once per key and reuses it") {
  Inputs x;
  const int64_t before = ops::prepared_calls();
  ops::run("gla", x.gla(), x.out());
  const std::vector<float> first = x.o;
  ops::run("gla", x.gla(), x.out());
  CHECK(ops::prepared_calls() == before + 1);
  CHECK(x.o == first);
  ops::Options scaled;
  scaled.scale = 0.5;
  ops::run("gla", x.gla(), x.out(), scaled);  // another key
  CHECK(ops::prepared_calls() == before + 2);
  CHECK(x.o != first);
}

TEST_CASE("ops::run converts an input given in another dtype than the kernels read") {
  // gla reads its gate in fp32; a bf16 gate is converted into scratch first, which equals rounding it
  // to bf16 on the host.
  Inputs x;
  std::vector<uint16_t> g16(x.g.size());
  std::vector<float> rounded(x.g.size());
  for (size_t i = 0; i < x.g.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x.g[i], 4);
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;  // round to nearest even
    g16[i] = static_cast<uint16_t>(bits >> 16);
    std::memcpy(&rounded[i], &bits, 4);
  }
  ops::Tensors in = x.gla();
  in["g"] = ops::Tensor::host(g16.data(), DType::bf16, {B, T, H, D});
  ops::run("gla", in, x.out());
  const std::vector<float> from_bf16 = x.o;
  x.g = rounded;
  ops::run("gla", x.gla(), x.out());
  CHECK(from_bf16 == x.o);
}

TEST_CASE("ops::run leaves its inputs as given") {
  // noise-dropout's backward scales do in place inside the plan: the caller's do must not change.
  Inputs x;
  std::vector<float> dout = randoms(x.o.size(), 5), dq(x.q.size()), dk(x.k.size()), dv(x.v.size());
  const std::vector<float> dout_before = dout;
  ops::Tensors in = x.gla();
  in.erase("g");
  in["do"] = ops::Tensor::host(dout.data(), DType::f32, {B, T, H, D});
  ops::Options o;
  o.backward = true;
  o.noise_dropout = 0.1;
  o.seed = 3;
  ops::run("linear_attn", in,
           {{"dq", ops::Tensor::host(dq.data(), DType::f32, {B, T, H, D})},
            {"dk", ops::Tensor::host(dk.data(), DType::f32, {B, T, H, D})},
            {"dv", ops::Tensor::host(dv.data(), DType::f32, {B, T, H, D})}},
           o);
  CHECK(dout == dout_before);
  CHECK(std::isfinite(dq[0]));
}

TEST_CASE("ops::output_spec and the checks of outputs") {
  Inputs x;
  ops::OutputSpec s = ops::output_spec("gla", x.gla(), "final_state");
  CHECK(s.dtype == DType::f32);
  CHECK(s.shape == std::vector<int64_t>{B, H, D, D});
  std::vector<float> small(4);
  CHECK(error_of([&] { ops::run("gla", x.gla(), {{"o", ops::Tensor::host(small.data(), DType::f32, {2, 2})}}); }) ==
        "output 'o' is f32 [2, 2], but gla writes f32 [1, 40, 2, 16] there");
  CHECK(error_of([&] { ops::run("gla", x.gla(), {{"dq", ops::Tensor::host(small.data(), DType::f32, {2, 2})}}); }) ==
        "gla does not produce 'dq' with these options (gradients need backward=1)");
  ops::Tensors in = x.gla();
  in["beta"] = in["g"];
  CHECK(error_of([&] { ops::run("gla", in, x.out()); }).starts_with("gla has no input 'beta' (inputs: q, k, v, g,"));
  in = x.gla();
  in["q"].dtype = DType::f64;
  CHECK(error_of([&] { ops::run("gla", in, x.out()); }) ==
        "q has dtype f64; linac's kernels run in float32, bfloat16 or float16");
}

TEST_CASE("ops::Call runs a prepared call on new addresses as ops::run does") {
  Inputs x, y;
  for (auto& v : y.v) v = -v;  // other data, same shapes
  const ops::Call call = ops::Call::prepare("gla", x.gla(), x.out());
  CHECK(call.input_names() == std::vector<std::string>{"g", "k", "q", "v"});
  CHECK(call.output_names() == std::vector<std::string>{"o"});
  CHECK(call.memory() == ops::Memory::host);
  CHECK(call.workspace_bytes() == 0);
  const int64_t prepared = ops::prepared_calls();
  void* ins[] = {y.g.data(), y.k.data(), y.q.data(), y.v.data()};
  void* outs[] = {y.o.data()};
  call.run(ins, outs);
  ops::run("gla", y.gla(), x.out());  // the same key: no new preparation
  CHECK(ops::prepared_calls() == prepared);
  CHECK(y.o == x.o);
  CHECK(std::isfinite(y.o[0]));

  void* too_few[] = {y.g.data(), y.k.data(), y.q.data()};
  CHECK(error_of([&] { call.run(too_few, outs); }) ==
        "gla: the prepared call takes 4 inputs and 1 outputs, given 3 and 1");
  void* null_q[] = {y.g.data(), y.k.data(), nullptr, y.v.data()};
  CHECK(error_of([&] { call.run(null_q, outs); }) == "input 'q' has no data (null pointer)");
  ops::Tensors varlen = x.gla();
  int64_t cu[] = {0, T};
  varlen["cu_seqlens"] = ops::Tensor::host(cu, DType::i64, {2});
  CHECK(error_of([&] { ops::Call::prepare("gla", varlen, x.out()); }).starts_with(
      "gla: a prepared call cannot take cu_seqlens"));
  CHECK(error_of([&] { ops::Call().run(ins, outs); }) == "ops::Call used before Call::prepare()");
}

TEST_CASE("ops::Options::parse") {
  ops::Options o = ops::Options::parse("backward=1,scale=0.125,chunk_size=32,bv=64,,seed=9");
  CHECK(o.backward);
  CHECK(*o.scale == 0.125);
  CHECK(*o.chunk_size == 32);
  CHECK(o.config.at("bv") == 64);
  CHECK(o.seed == 9);
  CHECK(error_of([] { ops::Options::parse("scale=abc"); }) == "options: scale=abc is not a finite number");
  CHECK(error_of([] { ops::Options::parse("scale=nan"); }) == "options: scale=nan is not a finite number");
  CHECK(error_of([] { ops::Options::parse("bv=6.5"); }) == "options: bv=6.5 is not an integer");
  CHECK(error_of([] { ops::Options::parse("normalize"); }) == "options: 'normalize' is not key=value");
}
