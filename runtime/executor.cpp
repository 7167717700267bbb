#include "runtime/executor.h"

#include <algorithm>
#include <cstring>
#include <fmt/format.h>

#include "compiler/interp/interp.h"
#include "runtime/gpu_kernel.h"

namespace linac {

std::vector<std::string> OpPlan::output_tensors() const {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : outputs) out.push_back(tensor);
  return out;
}

ResolvedPlan resolve_plan(const OpPlan& plan, const std::map<std::string, int>& slot_of) {
  ResolvedPlan r;
  for (const auto& l : plan.launches) {
    ResolvedPlan::Launch rl;
    rl.kernel = l.kernel;
    rl.grid = l.grid;
    for (const auto& p : l.kernel->params) {
      if (auto it = l.tensors.find(p.name); it != l.tensors.end()) {
        const HostTensor& t = plan.tensors.at(it->second);
        rl.params.emplace_back(ResolvedPlan::TensorParam{slot_of.at(it->second), t.dtype, t.shape});
      } else if (auto s = l.scalars.find(p.name); s != l.scalars.end()) {
        rl.params.emplace_back(s->second);
      } else {
        throw InternalError(fmt::format("launch of {} has no argument for {}", l.kernel->name, p.name));
      }
    }
    rl.overlaps = l.overlaps;
    if (l.overlaps < 0 || static_cast<size_t>(l.overlaps) > r.launches.size())
      throw InternalError(fmt::format("launch of {} overlaps {} launches; {} come before it", l.kernel->name,
                                      l.overlaps, r.launches.size()));
    r.launches.push_back(std::move(rl));
  }
  for (const auto& name : plan.cleared) r.cleared.emplace_back(slot_of.at(name), plan.tensors.at(name).nbytes());
  return r;
}

void ResolvedPlan::prepare_gpu() {
  // Compile (or fetch) every kernel before touching device memory, so a compile error leaves nothing.
  std::vector<std::shared_ptr<GpuKernel>> kernels;
  for (const auto& l : launches) kernels.push_back(GpuKernel::get(*l.kernel));
  for (size_t i = 0; i < launches.size(); ++i) {
    Launch& l = launches[i];
    l.gpu = kernels[i];
    std::vector<GpuArg> args;
    std::vector<int> tensor_slots;
    for (const auto& p : l.params) {
      if (const auto* t = std::get_if<TensorParam>(&p)) {
        args.emplace_back(DeviceTensorRef{0, t->dtype, t->shape});
        tensor_slots.push_back(t->slot);
      } else {
        args.emplace_back(std::get<double>(p));
      }
    }
    GpuKernel::ParamValues encoded = l.gpu->encode(args);
    l.values = std::move(encoded.values);
    l.maps = std::move(encoded.maps);
    l.address_slots.clear();
    for (size_t j = 0; j < tensor_slots.size(); ++j) l.address_slots.emplace_back(encoded.addresses[j], tensor_slots[j]);
  }
  // Overlapping launches share SMs: each asks for the carveout that leaves the others room.
  for (size_t i = 0; i < launches.size(); ++i) {
    if (launches[i].overlaps == 0) continue;
    for (int j = 0; j <= launches[i].overlaps; ++j)  // the launch and its producers
      cuda::prefer_max_shared_memory(launches[i - j].gpu->module().function());
  }
}

void run_on_cpu(const ResolvedPlan& plan, std::span<void* const> slots) {
  for (const auto& [slot, bytes] : plan.cleared) std::memset(slots[slot], 0, static_cast<size_t>(bytes));
  for (const auto& l : plan.launches) {
    std::vector<interp::Arg> args;
    args.reserve(l.params.size());
    for (const auto& p : l.params) {
      if (const auto* t = std::get_if<ResolvedPlan::TensorParam>(&p)) {
        args.emplace_back(interp::TensorArg{slots[t->slot], t->dtype, t->shape, contiguous_strides(t->shape)});
      } else {
        args.emplace_back(std::get<double>(p));
      }
    }
    interp::run(*l.kernel, interp::Grid{l.grid[0], l.grid[1], l.grid[2]}, args);
  }
}

void launch_on_gpu(const ResolvedPlan& plan, std::span<const cuda::DevicePtr> slots, cuda::Stream stream) {
  for (const auto& [slot, bytes] : plan.cleared) cuda::fill_async(slots[slot], 0, static_cast<size_t>(bytes), stream);
  // A launch that overlaps its n producers is queued before them, and they each early (cuda::launch):
  // the consumer's programs take their SMs first, then the producers start beside them, each once the
  // launch before it has started (kernels with flags say so as they start: ir.h, Signal).
  std::vector<size_t> consumer_of(plan.launches.size(), 0);  // at a first producer: its consumer
  for (size_t i = 0; i < plan.launches.size(); ++i)
    if (int n = plan.launches[i].overlaps; n > 0) {
      LINAC_INTERNAL_CHECK(consumer_of[i - n] == 0, "two launches overlap the same producers");
      consumer_of[i - n] = i;
    }
  std::array<uint64_t, GpuKernel::kMaxParamValues> values;
  auto launch = [&](const ResolvedPlan::Launch& l, bool early) {
    LINAC_INTERNAL_CHECK(l.gpu != nullptr, fmt::format("launch of {} before prepare_gpu()", l.kernel->name));
    std::copy(l.values.begin(), l.values.end(), values.begin());
    for (const auto& [at, slot] : l.address_slots) {
      if (slots[slot] == 0 || slots[slot] % 16 != 0)
        throw InternalError(fmt::format("{}: a tensor argument is null or not 16-byte aligned", l.kernel->name));
      values[at] = slots[slot];
    }
    l.gpu->launch_values(l.grid, std::span<const uint64_t>(values.data(), l.values.size()), l.maps, stream, early);
  };
  for (size_t i = 0; i < plan.launches.size(); ++i) {
    if (const size_t consumer = consumer_of[i]; consumer > 0) {
      launch(plan.launches[consumer], false);
      for (; i < consumer; ++i) launch(plan.launches[i], true);
      continue;
    }
    launch(plan.launches[i], false);
  }
}

namespace {

/// The plan's tensors as slots, in the order of plan.tensors.
std::map<std::string, int> slots_by_name(const OpPlan& plan) {
  std::map<std::string, int> slot_of;
  for (const auto& [name, t] : plan.tensors) slot_of.emplace(name, static_cast<int>(slot_of.size()));
  return slot_of;
}

/// Device copies of every plan tensor, in slot order.
std::vector<cuda::DeviceBuffer> upload(const OpPlan& plan) {
  std::vector<cuda::DeviceBuffer> dev;
  for (const auto& [name, t] : plan.tensors) {
    // At least 16 bytes: kernels may read (masked) the first element of an empty tensor.
    cuda::DeviceBuffer b(std::max<size_t>(static_cast<size_t>(t.nbytes()), 16));
    if (t.materialized())
      b.copy_from_host(t.data.data(), t.data.size());
    else
      b.fill_bytes(0);
    dev.push_back(std::move(b));
  }
  return dev;
}

std::vector<cuda::DevicePtr> pointers(const std::vector<cuda::DeviceBuffer>& dev) {
  std::vector<cuda::DevicePtr> p;
  for (const auto& b : dev) p.push_back(b.ptr());
  return p;
}

}  // namespace

TensorMap execute(OpPlan& plan, Device device) {
  for (const auto& name : plan.output_tensors()) plan.tensors.at(name).fill_bytes(0xFF);
  const auto slot_of = slots_by_name(plan);
  ResolvedPlan resolved = resolve_plan(plan, slot_of);
  if (device == Device::cpu) {
    std::vector<void*> slots;
    for (auto& [name, t] : plan.tensors) slots.push_back(t.materialize());
    run_on_cpu(resolved, slots);
  } else {
    resolved.prepare_gpu();
    auto dev = upload(plan);
    launch_on_gpu(resolved, pointers(dev), 0);
    cuda::synchronize();
    for (const auto& name : plan.output_tensors()) {
      HostTensor& t = plan.tensors.at(name);
      if (t.nbytes() > 0) dev[slot_of.at(name)].copy_to_host(t.materialize(), t.data.size());
    }
  }
  TensorMap out;
  for (const auto& [output, tensor] : plan.outputs) out[output] = plan.tensors.at(tensor);
  return out;
}

void prepare_kernels_on_gpu(const OpPlan& plan) { resolve_plan(plan, slots_by_name(plan)).prepare_gpu(); }

BenchResult bench_on_gpu(OpPlan& plan, int iters, bool per_launch, double budget_ms) {
  ResolvedPlan resolved = resolve_plan(plan, slots_by_name(plan));
  resolved.prepare_gpu();
  BenchResult r;
  for (const auto& [name, t] : plan.tensors) r.bytes += t.nbytes();
  const int64_t l2 = cuda::device_info().l2_bytes;
  r.rotations = static_cast<int>(std::clamp<int64_t>((2 * l2 + r.bytes - 1) / std::max<int64_t>(r.bytes, 1), 1, 8));
  std::vector<std::vector<cuda::DevicePtr>> sets;
  std::vector<std::vector<cuda::DeviceBuffer>> buffers;
  for (int i = 0; i < r.rotations; ++i) {
    buffers.push_back(upload(plan));
    sets.push_back(pointers(buffers.back()));
  }
  cuda::EventTimer timer;
  if (budget_ms > 0) {
    timer.start();
    launch_on_gpu(resolved, sets[0], 0);
    timer.stop();
    const double first_ms = std::max<double>(timer.elapsed_ms(), 1e-3);
    iters = std::clamp(static_cast<int>(budget_ms / first_ms), std::min(iters, 3), iters);
  } else {
    for (int i = 0; i < 3; ++i) launch_on_gpu(resolved, sets[i % sets.size()], 0);
  }
  cuda::synchronize();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    timer.start();
    launch_on_gpu(resolved, sets[i % sets.size()], 0);
    timer.stop();
    times.push_back(timer.elapsed_ms());
  }
  std::sort(times.begin(), times.end());
  r.iters = iters;
  r.median_ms = times[times.size() / 2];
  r.min_ms = times.front();
  if (per_launch && resolved.launches.size() > 1) {
    std::vector<std::vector<double>> per(resolved.launches.size());
    for (int i = 0; i < iters; ++i) {
      for (size_t j = 0; j < resolved.launches.size(); ++j) {
        // Alone, a launch that overlaps its producers finds their flags set: this pass never clears
        // them, and the producers ran alone just before it on the same tensors.
        ResolvedPlan one;
        one.launches.push_back(resolved.launches[j]);
        one.launches.back().overlaps = 0;
        timer.start();
        launch_on_gpu(one, sets[i % sets.size()], 0);
        timer.stop();
        per[j].push_back(timer.elapsed_ms());
      }
    }
    for (size_t j = 0; j < per.size(); ++j) {
      std::sort(per[j].begin(), per[j].end());
      r.launch_ms.emplace_back(plan.launches[j].kernel->name, per[j][per[j].size() / 2]);
    }
  }
  return r;
}

}  // namespace linac
