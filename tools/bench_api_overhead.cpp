// Host cost per op call of the C++ API (linac/ops.h) after warm-up, at a shape where the GPU's time is
// negligible, and the same calls captured in a CUDA graph and replayed:
//   linac_bench_overhead [--calls N] [--json FILE]
// For each op and form: the kernel launches of one call; the host time to queue one call through
// ops::run and through a prepared ops::Call (median over rounds of N calls queued back to back, the GPU
// drained between rounds); and, for a graph of 100 calls captured on a stream, its replay
// time per call and whether the replay wrote the same bytes as the calls made directly. Needs a GPU.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <dlfcn.h>
#include <fmt/format.h>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/common/elementwise.h"
#include "kernels/common/host_tensor.h"
#include "linac/ops.h"
#include "runtime/cuda_driver.h"
#include "runtime/gpu_kernel.h"

namespace ops = linac::ops;
using linac::DType;

namespace {

// The driver entry points of stream capture, resolved here: linac's runtime has no use for them.
struct GraphApi {
  using Fn = int (*)(...);
  int (*stream_create)(void** stream, unsigned flags) = nullptr;
  int (*begin_capture)(void* stream, int mode) = nullptr;
  int (*end_capture)(void* stream, void** graph) = nullptr;
  int (*instantiate)(void** exec, void* graph, unsigned long long flags) = nullptr;
  int (*launch)(void* exec, void* stream) = nullptr;
  int (*stream_sync)(void* stream) = nullptr;

  GraphApi() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) throw linac::UserError("libcuda.so.1 not found");
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn) throw linac::UserError(fmt::format("libcuda has no {}", name));
    };
    get(stream_create, "cuStreamCreate");
    get(begin_capture, "cuStreamBeginCapture_v2");
    get(end_capture, "cuStreamEndCapture");
    get(instantiate, "cuGraphInstantiateWithFlags");
    get(launch, "cuGraphLaunch");
    get(stream_sync, "cuStreamSynchronize");
  }
};

void check(int status, const char* what) {
  if (status != 0) throw linac::UserError(fmt::format("{} failed: CUDA error {}", what, status));
}

struct Case {
  std::string op, label;
  ops::Options options;
  bool gate = false, gate_per_key = false, beta = false;
};

/// Device tensors of one case: random bf16 q, k, v (and do), fp32 gates and betas, outputs as the op
/// reports them.
struct Buffers {
  std::vector<linac::cuda::DeviceBuffer> owned;
  ops::Tensors in, out;

  void add(ops::Tensors& to, const std::string& name, DType dtype, std::vector<int64_t> shape, unsigned seed) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(n * linac::dtype_bytes(dtype));
    owned.emplace_back(std::max<size_t>(bytes, 16));
    std::vector<uint8_t> host(bytes);
    for (int64_t i = 0; i < n; ++i) {
      seed = seed * 1103515245u + 12345u;
      float x = static_cast<float>((seed >> 16) % 2001) / 1000.0f - 1.0f;
      if (name == "g") x = -0.05f - 0.5f * std::abs(x);
      if (name == "beta") x = 0.5f + 0.4f * x;
      if (dtype == DType::bf16) {
        const uint16_t b = linac::float_to_bf16_bits(x);
        std::memcpy(&host[i * 2], &b, 2);
      } else {
        std::memcpy(&host[i * 4], &x, 4);
      }
    }
    owned.back().copy_from_host(host.data(), bytes);
    to[name] = ops::Tensor::cuda(reinterpret_cast<void*>(owned.back().ptr()), dtype, std::move(shape),
                                 linac::cuda::device_info().ordinal);
  }
};

Buffers make_buffers(const Case& c, int64_t B, int64_t T, int64_t H, int64_t D) {
  Buffers b;
  b.owned.reserve(32);
  b.add(b.in, "q", DType::bf16, {B, T, H, D}, 1);
  b.add(b.in, "k", DType::bf16, {B, T, H, D}, 2);
  b.add(b.in, "v", DType::bf16, {B, T, H, D}, 3);
  if (c.gate) b.add(b.in, "g", DType::f32, c.gate_per_key ? std::vector<int64_t>{B, T, H, D} : std::vector<int64_t>{B, T, H}, 4);
  if (c.beta) b.add(b.in, "beta", DType::f32, {B, T, H}, 5);
  std::vector<std::string> outs = {"o"};
  if (c.options.backward) {
    b.add(b.in, "do", DType::bf16, {B, T, H, D}, 6);
    outs = {"dq", "dk", "dv"};
    if (c.gate) outs.push_back("dg");
    if (c.beta) outs.push_back("dbeta");
  }
  for (const auto& name : outs) {
    ops::OutputSpec s = ops::output_spec(c.op, b.in, name, c.options);
    b.add(b.out, name, s.dtype, s.shape, 7);
  }
  return b;
}

std::vector<uint8_t> download(const Buffers& b) {
  std::vector<uint8_t> all;
  for (const auto& [name, t] : b.out) {
    const size_t bytes = static_cast<size_t>(t.numel() * linac::dtype_bytes(t.dtype));
    std::vector<uint8_t> h(bytes);
    linac::cuda::copy_to_host(h.data(), reinterpret_cast<linac::cuda::DevicePtr>(t.data), bytes);
    all.insert(all.end(), h.begin(), h.end());
  }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 200;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--calls" && i + 1 < argc) calls = std::stoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else {
      fmt::print("usage: linac_bench_overhead [--calls N] [--json FILE]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  try {
    fmt::print("{}\n", linac::cuda::device_info().summary());
    const int64_t B = 1, T = 64, H = 1, D = 64;
    std::vector<Case> cases;
    auto add = [&](std::string op, std::string label, std::string options, bool gate, bool per_key, bool beta) {
      cases.push_back({op, label, ops::Options::parse(options), gate, per_key, beta});
    };
    for (const char* form : {"", "backward=1", "recurrent=1"}) {
      const std::string f = form;
      const std::string suffix = f.empty() ? "fwd" : f == "backward=1" ? "bwd" : "recurrent";
      add("linear_attn", "linear_attn " + suffix, f, false, false, false);
      add("linear_attn", "simple_gla " + suffix, f, true, false, false);
      add("gla", "gla " + suffix, f, true, true, false);
      add("delta_rule", "delta_rule " + suffix, f, false, false, true);
      add("gated_delta_rule", "gated_delta_rule " + suffix, f, true, false, true);
    }
    add("poly", "poly fwd", "", false, false, false);
    GraphApi g;
    void* stream = nullptr;
    check(g.stream_create(&stream, 1 /* non-blocking */), "cuStreamCreate");
    using clock = std::chrono::steady_clock;
    std::string rows;
    fmt::print("B{} T{} H{} D{} bf16, {} calls queued per round\n", B, T, H, D, calls);
    fmt::print("{:<28} {:>9} {:>14} {:>14} {:>16} {:>9}\n", "op", "launches", "run() us/call", "Call us/call",
               "graph us/call", "graph ok");
    for (const Case& c : cases) {
      Buffers b = make_buffers(c, B, T, H, D);
      ops::run(c.op, b.in, b.out, c.options, stream);  // prepares: compiles or loads, tunes
      check(g.stream_sync(stream), "cuStreamSynchronize");
      const std::vector<uint8_t> direct = download(b);
      std::vector<double> per_call;
      for (int round = 0; round < 7; ++round) {
        const auto t0 = clock::now();
        for (int i = 0; i < calls; ++i) ops::run(c.op, b.in, b.out, c.options, stream);
        const auto t1 = clock::now();
        check(g.stream_sync(stream), "cuStreamSynchronize");
        per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / calls);
      }
      std::sort(per_call.begin(), per_call.end());
      const double host_us = per_call[per_call.size() / 2];
      // The same calls through a prepared ops::Call: addresses in its argument order.
      const ops::Call prepared = ops::Call::prepare(c.op, b.in, b.out, c.options);
      std::vector<void*> ins, outs;
      for (const auto& name : prepared.input_names()) ins.push_back(b.in.at(name).data);
      for (const auto& name : prepared.output_names()) outs.push_back(b.out.at(name).data);
      std::vector<double> per_prepared;
      for (int round = 0; round < 7; ++round) {
        const auto t0 = clock::now();
        for (int i = 0; i < calls; ++i) prepared.run(ins, outs, stream);
        const auto t1 = clock::now();
        check(g.stream_sync(stream), "cuStreamSynchronize");
        per_prepared.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / calls);
      }
      std::sort(per_prepared.begin(), per_prepared.end());
      const double prepared_us = per_prepared[per_prepared.size() / 2];
      // 100 calls captured in one graph (the default allocator's scratch is reused in stream order).
      check(g.begin_capture(stream, 2 /* relaxed */), "cuStreamBeginCapture");
      for (int i = 0; i < 100; ++i) ops::run(c.op, b.in, b.out, c.options, stream);
      void* graph = nullptr;
      void* exec = nullptr;
      check(g.end_capture(stream, &graph), "cuStreamEndCapture");
      check(g.instantiate(&exec, graph, 0), "cuGraphInstantiate");
      for (const auto& [name, t] : b.out)
        linac::cuda::fill_async(reinterpret_cast<linac::cuda::DevicePtr>(t.data), 0xFF,
                                static_cast<size_t>(t.numel() * linac::dtype_bytes(t.dtype)),
                                reinterpret_cast<linac::cuda::Stream>(stream));
      check(g.launch(exec, stream), "cuGraphLaunch");
      check(g.stream_sync(stream), "cuStreamSynchronize");
      const bool same = download(b) == direct;
      std::vector<double> replay;
      for (int r = 0; r < 5; ++r) {
        const auto t0 = clock::now();
        check(g.launch(exec, stream), "cuGraphLaunch");
        check(g.stream_sync(stream), "cuStreamSynchronize");
        replay.push_back(std::chrono::duration<double, std::micro>(clock::now() - t0).count() / 100);
      }
      std::sort(replay.begin(), replay.end());
      fmt::print("{:<28} {:>9} {:>14.2f} {:>14.2f} {:>16.2f} {:>9}\n", c.label, prepared.kernel_launches(), host_us,
                 prepared_us, replay[2], same ? "yes" : "NO");
      rows += fmt::format("{}{{\"op\": \"{}\", \"launches\": {}, \"host_us_per_call\": {:.3f}, "
                          "\"prepared_us_per_call\": {:.3f}, \"graph_us_per_call\": {:.3f}, \"graph_matches\": {}}}",
                          rows.empty() ? "" : ", ", c.label, prepared.kernel_launches(), host_us, prepared_us, replay[2],
                          same);
    }
    // The driver's floor: one bare launch of a small kernel (a dtype conversion of 64 floats, 6 parameter
    // values), its parameters encoded once, timed like the calls above.
    double floor_us = 0;
    {
      const auto kernel = linac::GpuKernel::get(*linac::convert_kernel(DType::f32, DType::f32));
      linac::cuda::DeviceBuffer x(256), y(256);
      const std::vector<int64_t> n = {64};
      const std::vector<linac::GpuArg> args = {linac::DeviceTensorRef{x.ptr(), DType::f32, n},
                                               linac::DeviceTensorRef{y.ptr(), DType::f32, n}};
      const linac::GpuKernel::ParamValues encoded = kernel->encode(args);
      std::vector<uint64_t> bound = encoded.values;
      bound[encoded.addresses[0]] = x.ptr();
      bound[encoded.addresses[1]] = y.ptr();
      const auto grid = linac::convert_grid(64);
      std::vector<double> per_launch;
      for (int round = 0; round < 7; ++round) {
        const auto t0 = clock::now();
        for (int i = 0; i < calls; ++i) kernel->launch_values(grid, bound, encoded.maps, reinterpret_cast<linac::cuda::Stream>(stream));
        const auto t1 = clock::now();
        check(g.stream_sync(stream), "cuStreamSynchronize");
        per_launch.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / calls);
      }
      std::sort(per_launch.begin(), per_launch.end());
      floor_us = per_launch[per_launch.size() / 2];
      fmt::print("{:<28} {:>9} {:>14.2f}   (cuLaunchKernel of a 6-value kernel, no linac work around it)\n",
                 "bare launch", 1, floor_us);
    }
    if (!json.empty())
      std::ofstream(json) << fmt::format("{{\"device\": \"{}\", \"shape\": [{}, {}, {}, {}], \"bare_launch_us\": {:.3f}, "
                                         "\"rows\": [{}]}}\n",
                                         linac::cuda::device_info().summary(), B, T, H, D, floor_us, rows);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "linac_bench_overhead: {}\n", e.what());
    return 1;
  }
}
