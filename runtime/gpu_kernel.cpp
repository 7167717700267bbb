#include "runtime/gpu_kernel.h"

#include <cstring>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mutex>

#include "compiler/ir/printer.h"
#include "runtime/build_id.h"
#include "runtime/disk_cache.h"

namespace linac {

namespace {

std::atomic<int> g_compiles{0};

/// The compiler's version; the library's build-id (part of the key too) changes with any rebuild.
constexpr const char* kCompilerVersion = "linac-0.1.0";

std::string meta_json(const nvptx::CompiledKernel& c) {
  std::string params;
  for (const auto& p : c.params)
    params += fmt::format("{}{{\"name\":\"{}\",\"tensor\":{},\"dtype\":\"{}\",\"rank\":{}}}", params.empty() ? "" : ",",
                          p.name, p.is_tensor, dtype_name(p.dtype), p.rank);
  std::string maps;
  for (const auto& m : c.tensor_maps)
    maps += fmt::format("{}{{\"param\":{},\"box\":[{}],\"swizzle_bytes\":{}}}", maps.empty() ? "" : ",", m.param,
                        fmt::join(m.box, ","), m.swizzle_bytes);
  return fmt::format("{{\"entry\":\"{}\",\"num_threads\":{},\"smem_bytes\":{},\"params\":[{}],\"tensor_maps\":[{}]}}\n",
                     c.entry, c.num_threads, c.smem_bytes, params, maps);
}

/// What a cache hit needs besides the cubin, one fact per line (meta.json is for people and tools).
std::string launch_meta(const nvptx::CompiledKernel& c) {
  std::string out = fmt::format("entry {}\nnum_threads {}\nsmem_bytes {}\n", c.entry, c.num_threads, c.smem_bytes);
  for (const auto& p : c.params)
    out += fmt::format("param {} {} {} {}\n", p.name, p.is_tensor ? "tensor" : "scalar", dtype_name(p.dtype), p.rank);
  for (const auto& m : c.tensor_maps)
    out += fmt::format("tensor_map {} {} {} {}\n", m.param, m.swizzle_bytes, m.box.size(), fmt::join(m.box, " "));
  return out;
}

/// Reads launch_meta's text back; false if it is malformed (the entry is then rebuilt).
bool parse_launch_meta(const std::string& text, nvptx::CompiledKernel* c) {
  std::istringstream in(text);
  std::string word;
  bool entry = false, threads = false, smem = false;
  while (in >> word) {
    if (word == "entry") {
      entry = static_cast<bool>(in >> c->entry);
    } else if (word == "num_threads") {
      threads = static_cast<bool>(in >> c->num_threads);
    } else if (word == "smem_bytes") {
      smem = static_cast<bool>(in >> c->smem_bytes);
    } else if (word == "param") {
      nvptx::KernelParamInfo p;
      std::string kind, dt;
      if (!(in >> p.name >> kind >> dt >> p.rank)) return false;
      auto d = parse_dtype(dt);
      if (!d || (kind != "tensor" && kind != "scalar")) return false;
      p.is_tensor = kind == "tensor";
      p.dtype = *d;
      c->params.push_back(p);
    } else if (word == "tensor_map") {
      nvptx::TensorMapParamInfo m;
      size_t rank = 0;
      if (!(in >> m.param >> m.swizzle_bytes >> rank) || rank > 5) return false;
      m.box.resize(rank);
      for (auto& b : m.box)
        if (!(in >> b)) return false;
      if (m.param < 0 || m.param >= static_cast<int>(c->params.size()) || !c->params[m.param].is_tensor) return false;
      c->tensor_maps.push_back(m);
    } else {
      return false;
    }
  }
  return entry && threads && smem;
}

/// LINAC_DUMP=<dir>: every stage of every kernel compiled for the GPU goes to <dir>/<entry>-<key>/.
void dump_stages(const nvptx::CompiledKernel& c, const std::string& key, const cuda::LinkedModule& m) {
  const char* dir = std::getenv("LINAC_DUMP");
  if (!dir || !*dir) return;
  namespace fs = std::filesystem;
  fs::path d = fs::path(dir) / fmt::format("{}-{}", c.entry, key.substr(0, 12));
  std::error_code ec;
  fs::create_directories(d, ec);
  if (ec) throw UserError(fmt::format("LINAC_DUMP: cannot create {}: {}", d.string(), ec.message()));
  auto write = [&](const char* name, const std::string& text) {
    std::FILE* f = std::fopen((d / name).c_str(), "wb");
    if (!f) throw UserError(fmt::format("LINAC_DUMP: cannot write {}", (d / name).string()));
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  };
  write(nvptx::kRecordedTirFile, c.tir);
  write(nvptx::kLayoutsTirFile, c.tir_layouts);
  write(nvptx::kSmemPlanFile, c.smem_plan);
  write(nvptx::kLoweredLlFile, c.llvm_ir);
  write(nvptx::kOptimizedLlFile, c.llvm_ir_opt);
  write(nvptx::kPtxFile, c.ptx);
  if (!m.cubin().empty()) write("7-kernel.cubin", std::string(m.cubin().begin(), m.cubin().end()));
  write("8-link.log", m.info_log());
  write("meta.json", meta_json(c));
}

/// Resource check before linking: a configuration that does not fit is a UserError naming the limit
/// (the autotuner skips such candidates).
void check_shared_memory(const ir::Kernel& k, const nvptx::CompiledKernel& c, const cuda::DeviceInfo& dev) {
  if (c.smem_bytes > dev.max_shared_per_block_optin)
    throw UserError(fmt::format("kernel {} needs {} bytes of shared memory; {} allows {}", k.name, c.smem_bytes,
                                dev.name, dev.max_shared_per_block_optin));
}

}  // namespace

int GpuKernel::compile_count() { return g_compiles.load(); }

namespace {
/// When the library was loaded: the origin of LINAC_PRINT_COMPILE_TIMES's intervals.
const std::chrono::steady_clock::time_point g_loaded = std::chrono::steady_clock::now();
}  // namespace

std::shared_ptr<GpuKernel> GpuKernel::get(const ir::Kernel& k) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<GpuKernel>> table;  // by cache key
  const cuda::DeviceInfo& dev = cuda::device_info();
  const nvptx::GpuTarget target = nvptx::GpuTarget::for_sm(dev.sm());
  std::string tir = ir::print(k);
  // Read before the key: the key must hash exactly the override that is compiled.
  const std::optional<nvptx::StageOverride> replaced = nvptx::stage_override_from_env(k);
  CacheKey key;
  key.add("format", std::to_string(kCacheFormatVersion))
      .add("compiler", kCompilerVersion)
      .add("build_id", library_build_id())
      .add("llvm", nvptx::llvm_version())
      .add("tir", tir)
      .add("target", target.key())
      .add("device_sm", std::to_string(dev.sm()));
  // Only overridden kernels get these fields, so the keys of all others stay what they were, and an
  // overridden kernel never meets the cubin of the normal one, or of another edit.
  if (replaced) key.add("override_stage", replaced->stage_name()).add("override", replaced->text);
  std::string hex = key.hex();
  {
    std::lock_guard lock(mu);
    if (auto it = table.find(hex); it != table.end()) return it->second;
  }
  // Compiled outside the lock, so the autotuner's threads compile candidates in parallel; two threads
  // racing on one kernel both compile it, and the first to finish wins the table slot.
  auto gk = std::make_shared<GpuKernel>();
  DiskCache cache = DiskCache::open_default();
  const char* dump = std::getenv("LINAC_DUMP");
  const bool dumping = dump && *dump;  // dumping needs every stage: compile even on a hit
  std::optional<CacheEntry> hit = dumping ? std::nullopt : cache.get(hex);
  nvptx::CompiledKernel meta;
  // An entry holds the cubin, or for a kernel the driver's JIT compiles (jit_ptx) the PTX alone.
  if (hit && (hit->files.count("kernel.cubin") || hit->files.count("kernel.ptx")) && hit->files.count("launch.meta") &&
      parse_launch_meta(hit->files.at("launch.meta"), &meta)) {
    // A hit compiles nothing: the cubin is loaded, and what a launch needs comes from launch.meta.
    gk->compiled_ = std::move(meta);
    gk->compiled_.tir = tir;
    if (hit->files.count("kernel.ptx")) gk->compiled_.ptx = hit->files.at("kernel.ptx");
    if (hit->files.count("kernel.cubin")) {
      const std::string& cubin = hit->files.at("kernel.cubin");
      gk->module_ = std::make_unique<cuda::LinkedModule>(cuda::load_cubin(
          std::vector<uint8_t>(cubin.begin(), cubin.end()), gk->compiled_.entry,
          hit->files.count("link.log") ? hit->files.at("link.log") : std::string()));
    } else {
      gk->module_ = std::make_unique<cuda::LinkedModule>(cuda::jit_ptx(gk->compiled_.ptx, gk->compiled_.entry));
    }
  } else {
    // LINAC_PRINT_COMPILE_TIMES=1: where a cold start's compile time goes, per kernel (the tuner
    // compiles candidates on several threads: overlapping intervals show whether they run in parallel).
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    gk->compiled_ = nvptx::compile_kernel(k, target, replaced);
    check_shared_memory(k, gk->compiled_, dev);
    const auto t1 = clock::now();
    gk->module_ = std::make_unique<cuda::LinkedModule>(gk->compiled_.reallocates_registers
                                                           ? cuda::jit_ptx(gk->compiled_.ptx, gk->compiled_.entry)
                                                           : cuda::link_ptx(gk->compiled_.ptx, gk->compiled_.entry));
    const auto t2 = clock::now();
    gk->compiled_here_ = true;
    ++g_compiles;
    dump_stages(gk->compiled_, hex, *gk->module_);
    CacheEntry e;
    e.files["kernel.tir"] = tir;
    e.files["kernel.ll"] = gk->compiled_.llvm_ir_opt;
    e.files["kernel.ptx"] = gk->compiled_.ptx;
    const auto& cubin = gk->module_->cubin();
    if (!cubin.empty()) e.files["kernel.cubin"] = std::string(cubin.begin(), cubin.end());
    e.files["link.log"] = gk->module_->info_log();
    e.files["meta.json"] = meta_json(gk->compiled_);
    e.files["launch.meta"] = launch_meta(gk->compiled_);
    cache.put(hex, e);
    if (const char* p = std::getenv("LINAC_PRINT_COMPILE_TIMES"); p && *p && std::string(p) != "0") {
      auto ms = [](clock::time_point a, clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
      };
      fmt::print(stderr,
                 "linac compile: {} [{:.0f}..{:.0f} ms after load] tile IR to PTX {:.0f} ms, driver JIT {:.0f} ms, "
                 "cache {:.0f} ms\n",
                 k.name, ms(g_loaded, t0), ms(g_loaded, clock::now()), ms(t0, t1), ms(t1, t2), ms(t2, clock::now()));
    }
  }
  check_shared_memory(k, gk->compiled_, dev);
  if (gk->compiled_.smem_bytes > 48 * 1024)
    cuda::set_max_dynamic_shared(gk->module_->function(), static_cast<int>(gk->compiled_.smem_bytes));
  std::lock_guard lock(mu);
  return table.emplace(hex, gk).first->second;
}

int64_t GpuKernel::spill_bytes() const {
  return module_->spill_store_bytes().value_or(0) + module_->spill_load_bytes().value_or(0) +
         module_->attributes().local_bytes;
}

void GpuKernel::launch(const std::array<int64_t, 3>& grid, const std::map<std::string, GpuArg>& args,
                       cuda::Stream stream) const {
  if (args.size() != compiled_.params.size())
    throw InternalError(fmt::format("{}: {} arguments for {} parameters", compiled_.entry, args.size(),
                                    compiled_.params.size()));
  std::vector<GpuArg> ordered;
  ordered.reserve(compiled_.params.size());
  for (const auto& p : compiled_.params) {
    auto it = args.find(p.name);
    if (it == args.end()) throw InternalError(fmt::format("{}: no argument for parameter {}", compiled_.entry, p.name));
    ordered.push_back(it->second);
  }
  launch(grid, ordered, stream);
}

void GpuKernel::launch(const std::array<int64_t, 3>& grid, std::span<const GpuArg> args, cuda::Stream stream) const {
  for (size_t i = 0; i < args.size(); ++i)
    if (const auto* t = std::get_if<DeviceTensorRef>(&args[i]); t && (t->ptr == 0 || t->ptr % 16 != 0))
      throw InternalError(fmt::format("{}: tensor argument {} is null or not 16-byte aligned", compiled_.entry, i));
  const ParamValues p = encode(args);
  launch_values(grid, p.values, p.maps, stream);
}

GpuKernel::ParamValues GpuKernel::encode(std::span<const GpuArg> args) const {
  // One 8-byte value per scalar of the kernel's parameter list (pointer, i32 size, i64 stride, scalar).
  ParamValues out;
  auto push = [&](const void* value, size_t bytes) {
    uint64_t v = 0;
    std::memcpy(&v, value, bytes);
    out.values.push_back(v);
  };
  if (args.size() != compiled_.params.size())
    throw InternalError(fmt::format("{}: {} arguments for {} parameters", compiled_.entry, args.size(),
                                    compiled_.params.size()));
  std::vector<size_t> address_of_param(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& p = compiled_.params[i];
    if (p.is_tensor) {
      const DeviceTensorRef* t = std::get_if<DeviceTensorRef>(&args[i]);
      if (!t) throw InternalError(fmt::format("{}: parameter {} needs a tensor", compiled_.entry, p.name));
      if (t->dtype != p.dtype || static_cast<int>(t->shape.size()) != p.rank)
        throw InternalError(fmt::format("{}: parameter {} is {} of rank {}, got {} of rank {}", compiled_.entry, p.name,
                                        dtype_name(p.dtype), p.rank, dtype_name(t->dtype), t->shape.size()));
      address_of_param[i] = out.values.size();
      out.addresses.push_back(out.values.size());
      push(&t->ptr, 8);
      for (int d = 0; d < p.rank; ++d) {
        if (t->shape[d] > INT32_MAX) throw UserError(fmt::format("{}: dimension {} of {} is too large", compiled_.entry, d, p.name));
        const auto size = static_cast<int32_t>(t->shape[d]);
        push(&size, 4);
      }
      std::array<int64_t, 8> strides{};
      LINAC_INTERNAL_CHECK(p.rank <= 8, fmt::format("{}: parameter {} has rank {}", compiled_.entry, p.name, p.rank));
      int64_t stride = 1;
      for (int d = p.rank - 1; d >= 0; --d) {
        strides[d] = stride;
        stride *= t->shape[d];
      }
      for (int d = 0; d < p.rank; ++d) push(&strides[d], 8);
    } else {
      const double* v = std::get_if<double>(&args[i]);
      if (!v) throw InternalError(fmt::format("{}: parameter {} needs a scalar", compiled_.entry, p.name));
      switch (p.dtype) {
        case DType::f32: { const float x = static_cast<float>(*v); push(&x, 4); break; }
        case DType::f64: push(v, 8); break;
        case DType::i32: { const int32_t x = static_cast<int32_t>(*v); push(&x, 4); break; }
        case DType::i64: { const int64_t x = static_cast<int64_t>(*v); push(&x, 8); break; }
        default: throw InternalError(fmt::format("{}: scalar parameter {} of dtype {}", compiled_.entry, p.name, dtype_name(p.dtype)));
      }
    }
  }
  // The tensor maps: whether the driver can describe each (with a stand-in address: only its alignment,
  // which every launch checks, could differ), as a flag the kernel reads; the maps themselves per launch.
  LINAC_INTERNAL_CHECK(compiled_.tensor_maps.size() <= kMaxTensorMaps, fmt::format("{}: too many tensor maps", compiled_.entry));
  for (const nvptx::TensorMapParamInfo& m : compiled_.tensor_maps) {
    const auto& p = compiled_.params.at(m.param);
    const auto& t = std::get<DeviceTensorRef>(args[m.param]);
    MapArg a;
    a.address_at = address_of_param[m.param];
    a.element_bytes = dtype_bytes(p.dtype);
    a.rank = p.rank;
    a.swizzle_bytes = m.swizzle_bytes;
    LINAC_INTERNAL_CHECK(p.rank <= 5 && m.box.size() == static_cast<size_t>(p.rank), "tensor map of a bad rank");
    for (int d = 0; d < p.rank; ++d) {
      a.shape[d] = t.shape[d];
      a.box[d] = m.box[d];
    }
    cuda::TensorMap probe;
    a.usable = cuda::encode_tensor_map(&probe, 256, a.element_bytes, std::span(a.shape.data(), a.rank),
                                       std::span(a.box.data(), a.rank), a.swizzle_bytes);
    const int32_t flag = a.usable ? 1 : 0;
    push(&flag, 4);
    out.maps.push_back(a);
  }
  if (out.values.size() > kMaxParamValues)
    throw InternalError(fmt::format("{}: {} kernel parameter values, more than {}", compiled_.entry, out.values.size(),
                                    kMaxParamValues));
  return out;
}

void GpuKernel::launch_values(const std::array<int64_t, 3>& grid, std::span<const uint64_t> values,
                              std::span<const MapArg> maps, cuda::Stream stream, bool early) const {
  for (int64_t g : grid)
    if (g <= 0) return;  // an empty grid launches nothing
  // The driver reads each value through its own pointer; fixed arrays keep the hot path off the heap.
  std::array<void*, kMaxParamValues + kMaxTensorMaps> params;
  std::array<cuda::TensorMap, kMaxTensorMaps> encoded;
  LINAC_INTERNAL_CHECK(values.size() <= kMaxParamValues && maps.size() <= kMaxTensorMaps,
                       "too many kernel parameter values");
  for (size_t i = 0; i < values.size(); ++i) params[i] = const_cast<uint64_t*>(&values[i]);
  for (size_t j = 0; j < maps.size(); ++j) {
    const MapArg& m = maps[j];
    // A map the kernel was told it cannot use stays zero (it copies those tiles itself).
    if (m.usable && !cuda::encode_tensor_map(&encoded[j], values[m.address_at], m.element_bytes,
                                             std::span(m.shape.data(), m.rank), std::span(m.box.data(), m.rank),
                                             m.swizzle_bytes))
      throw InternalError(fmt::format("{}: tensor map {} could not be encoded at address {:#x}", compiled_.entry, j,
                                      values[m.address_at]));
    if (!m.usable) encoded[j] = cuda::TensorMap{};
    params[values.size() + j] = &encoded[j];
  }
  cuda::launch(module_->function(),
               cuda::Dim3{static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2])},
               cuda::Dim3{static_cast<unsigned>(compiled_.num_threads), 1, 1}, static_cast<unsigned>(compiled_.smem_bytes),
               std::span<void*>(params.data(), values.size() + maps.size()), stream, early);
}

}  // namespace linac
