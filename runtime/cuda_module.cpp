// PTX -> cubin -> loaded function through the driver, and the ptxas log parser.
#include "runtime/cuda_module.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <utility>

#include "linac/error.h"
#include "runtime/cuda_api.h"

namespace linac::cuda {

using detail::Api;

// ---------------------------------------------------------------------------------------------
// The ptxas log

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The integer written just before `phrase` ("24 bytes stack frame" -> 24), if the line has both.
std::optional<std::int64_t> number_before(std::string_view line, std::string_view phrase) {
  size_t pos = line.find(phrase);
  if (pos == std::string_view::npos) return std::nullopt;
  size_t end = pos;
  while (end > 0 && line[end - 1] == ' ') --end;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(line[begin - 1]))) --begin;
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(line.data() + begin, line.data() + end, value);
  if (begin == end || ec != std::errc() || ptr != line.data() + end) return std::nullopt;
  return value;
}

// A function name as ptxas prints it: bare, quoted, or followed by a colon.
std::string clean_name(std::string_view s) {
  s = trim(s);
  if (!s.empty() && s.back() == ':') s.remove_suffix(1);
  s = trim(s);
  if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front()) s = s.substr(1, s.size() - 2);
  return std::string(s);
}

}  // namespace

std::vector<PtxasFunctionStats> parse_ptxas_info_log(std::string_view log) {
  std::vector<PtxasFunctionStats> out;
  // Stats lines follow the header naming their function, so the parser tracks the current one;
  // a function met twice (a log of several links) is updated in place.
  size_t current = static_cast<size_t>(-1);
  auto select = [&](const std::string& name) {
    auto it = std::find_if(out.begin(), out.end(), [&](const PtxasFunctionStats& f) { return f.name == name; });
    if (it == out.end()) {
      out.push_back({});
      out.back().name = name;
      it = out.end() - 1;
    }
    current = static_cast<size_t>(it - out.begin());
  };
  auto cur = [&]() -> PtxasFunctionStats& {
    if (current == static_cast<size_t>(-1)) select("");
    return out[current];
  };

  size_t start = 0;
  while (start <= log.size()) {
    size_t nl = log.find('\n', start);
    std::string_view line = log.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    start = nl == std::string_view::npos ? log.size() + 1 : nl + 1;

    constexpr std::string_view kProperties = "Function properties for ";
    constexpr std::string_view kEntry = "Compiling entry function ";
    if (size_t p = line.find(kProperties); p != std::string_view::npos) {
      select(clean_name(line.substr(p + kProperties.size())));
      continue;
    }
    if (size_t p = line.find(kEntry); p != std::string_view::npos) {
      // Compiling entry function 'name' for 'sm_90'
      std::string_view rest = line.substr(p + kEntry.size());
      size_t q = rest.find('\'');
      size_t q2 = q == std::string_view::npos ? q : rest.find('\'', q + 1);
      if (q2 != std::string_view::npos) select(std::string(rest.substr(q + 1, q2 - q - 1)));
      continue;
    }
    if (auto v = number_before(line, "bytes stack frame")) cur().stack_frame_bytes = *v;
    if (auto v = number_before(line, "bytes spill stores")) cur().spill_store_bytes = *v;
    if (auto v = number_before(line, "bytes spill loads")) cur().spill_load_bytes = *v;
    if (auto v = number_before(line, "bytes lmem")) cur().local_bytes = *v;
    if (auto v = number_before(line, "registers")) cur().registers = static_cast<int>(*v);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Attributes

KernelAttributes function_attributes(Function f) {
  LINAC_INTERNAL_CHECK(f != Function::none, "attributes of a null function");
  const Api& a = detail::api();
  CUfunction fn = detail::to_cu(f);
  auto get = [&](CUfunction_attribute attr) {
    int value = 0;
    LINAC_CU_CHECK(a, cuFuncGetAttribute, "reading a kernel's attributes", &value, attr, fn);
    return value;
  };
  KernelAttributes k;
  k.num_regs = get(CU_FUNC_ATTRIBUTE_NUM_REGS);
  k.local_bytes = get(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
  k.static_shared_bytes = get(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  k.const_bytes = get(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES);
  k.max_threads_per_block = get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  k.ptx_version = get(CU_FUNC_ATTRIBUTE_PTX_VERSION);
  k.binary_version = get(CU_FUNC_ATTRIBUTE_BINARY_VERSION);
  return k;
}

// ---------------------------------------------------------------------------------------------
// Linking

namespace {

// Room for the logs of one kernel with room to spare; the linker truncates longer logs rather
// than failing.
constexpr unsigned kLogBytes = 1u << 18;

// The log the linker wrote into `buf`, without the terminator and trailing blank lines.
std::string log_text(const std::vector<char>& buf) {
  return std::string(trim(std::string_view(buf.data(), strnlen(buf.data(), buf.size()))));
}

// Destroys a link state on every path out of compile_ptx; the cubin it owns is copied out first.
struct LinkStateGuard {
  const Api& api;
  CUlinkState state = nullptr;
  ~LinkStateGuard() {
    if (state != nullptr) (void)api.cuLinkDestroy(state);
  }
};

void* option_value(std::uintptr_t v) {
  return reinterpret_cast<void*>(v);
}

// The options linac compiles PTX with (the linker's and the JIT's alike): verbose info and error logs
// into buffers of its own, ptxas's -O, and line info, which maps the SASS back to the PTX's .loc lines
// (the DSL source) so that Nsight Compute's source page charges stalls to DSL lines without changing
// the code ptxas generates. Scalar options travel in the pointer slots themselves, as the driver API
// specifies. The buffers must outlive whatever writes into them (a link state until it is destroyed).
struct JitOptions {
  std::vector<char> info = std::vector<char>(kLogBytes, '\0');
  std::vector<char> errors = std::vector<char>(kLogBytes, '\0');
  std::vector<CUjit_option> options = {CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                                       CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                                       CU_JIT_LOG_VERBOSE,      CU_JIT_OPTIMIZATION_LEVEL,
                                       CU_JIT_GENERATE_LINE_INFO};
  std::vector<void*> values;
  explicit JitOptions(int opt_level) {
    LINAC_INTERNAL_CHECK(opt_level >= 0 && opt_level <= 4, fmt::format("ptxas optimization level {}", opt_level));
    values = {info.data(),     option_value(kLogBytes),
              errors.data(),   option_value(kLogBytes),
              option_value(1), option_value(static_cast<std::uintptr_t>(opt_level)),
              option_value(1)};
  }
  unsigned count() const { return static_cast<unsigned>(options.size()); }
};

}  // namespace

CubinResult compile_ptx(const std::string& ptx, int opt_level, std::string_view what) {
  const Api& a = detail::api();
  // Declared before the guard: destroyed after the link state that writes into its buffers.
  JitOptions jit(opt_level);
  LinkStateGuard guard{a};
  LINAC_CU_CHECK(a, cuLinkCreate_v2, "creating a PTX linker", jit.count(), jit.options.data(), jit.values.data(),
                 &guard.state);

  // Failures from here on are about the PTX, and the error log says what ptxas disliked.
  std::string input_name(what);
  const char* failed_entry = "cuLinkAddData_v2";
  CUresult r = a.cuLinkAddData_v2(guard.state, CU_JIT_INPUT_PTX, const_cast<char*>(ptx.c_str()), ptx.size() + 1,
                                  input_name.c_str(), 0, nullptr, nullptr);
  void* cubin = nullptr;
  size_t cubin_size = 0;
  if (r == CUDA_SUCCESS) {
    failed_entry = "cuLinkComplete";
    r = a.cuLinkComplete(guard.state, &cubin, &cubin_size);
  }
  if (r != CUDA_SUCCESS) {
    std::string error_log = log_text(jit.errors);
    throw UserError(fmt::format("ptxas rejected the PTX of {} ({} failed: {}):\n{}", what, failed_entry,
                                detail::describe(a, r),
                                error_log.empty() ? "(the linker wrote no error log)" : error_log));
  }
  LINAC_INTERNAL_CHECK(cubin != nullptr && cubin_size > 0, "cuLinkComplete returned an empty cubin");

  CubinResult out;
  const auto* bytes = static_cast<const std::uint8_t*>(cubin);
  out.cubin.assign(bytes, bytes + cubin_size);  // owned by the link state, freed with it
  out.info_log = log_text(jit.info);
  out.error_log = log_text(jit.errors);
  return out;
}

// ---------------------------------------------------------------------------------------------
// LinkedModule

LinkedModule::~LinkedModule() {
  release();
}

LinkedModule::LinkedModule(LinkedModule&& other) noexcept
    : module_(std::exchange(other.module_, 0)),
      function_(std::exchange(other.function_, Function::none)),
      kernel_name_(std::move(other.kernel_name_)),
      cubin_(std::move(other.cubin_)),
      info_log_(std::move(other.info_log_)),
      error_log_(std::move(other.error_log_)),
      attributes_(other.attributes_),
      spill_store_bytes_(other.spill_store_bytes_),
      spill_load_bytes_(other.spill_load_bytes_) {}

LinkedModule& LinkedModule::operator=(LinkedModule&& other) noexcept {
  if (this != &other) {
    release();
    module_ = std::exchange(other.module_, 0);
    function_ = std::exchange(other.function_, Function::none);
    kernel_name_ = std::move(other.kernel_name_);
    cubin_ = std::move(other.cubin_);
    info_log_ = std::move(other.info_log_);
    error_log_ = std::move(other.error_log_);
    attributes_ = other.attributes_;
    spill_store_bytes_ = other.spill_store_bytes_;
    spill_load_bytes_ = other.spill_load_bytes_;
  }
  return *this;
}

void LinkedModule::release() noexcept {
  if (module_ == 0) return;
  // Unloading fails only on a dead context (a faulted kernel, or the driver shut down at exit),
  // where the module is gone anyway; a destructor has nobody to tell.
  try {
    (void)Driver::get().api().cuModuleUnload(reinterpret_cast<CUmodule>(module_));
  } catch (...) {
  }
  module_ = 0;
  function_ = Function::none;
}

LinkedModule load_cubin(std::vector<std::uint8_t> cubin, const std::string& kernel_name, std::string info_log) {
  LINAC_INTERNAL_CHECK(!cubin.empty(), fmt::format("empty cubin for kernel '{}'", kernel_name));
  const Api& a = detail::api();
  CUmodule module = nullptr;
  CUresult r = a.cuModuleLoadData(&module, cubin.data());
  if (r == CUDA_ERROR_INVALID_IMAGE || r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_SOURCE)
    throw UserError(
        fmt::format("the cubin of kernel '{}' does not load on {} ({}); a cached cubin from another "
                    "GPU or a damaged cache file? clear the kernel cache",
                    kernel_name, device_info().summary(), detail::describe(a, r)));
  if (r != CUDA_SUCCESS)
    detail::throw_cu_error(a, r, "cuModuleLoadData", fmt::format("loading kernel '{}'", kernel_name));
  LinkedModule m = LinkedModule::adopt(module, kernel_name, std::move(info_log));
  m.cubin_ = std::move(cubin);
  return m;
}

LinkedModule LinkedModule::adopt(void* loaded, const std::string& kernel_name, std::string info_log) {
  const Api& a = detail::api();
  CUmodule module = static_cast<CUmodule>(loaded);
  LinkedModule m;
  m.module_ = reinterpret_cast<std::uintptr_t>(module);  // unloaded by m from here on
  m.kernel_name_ = kernel_name;
  CUfunction fn = nullptr;
  CUresult r = a.cuModuleGetFunction(&fn, module, kernel_name.c_str());
  if (r == CUDA_ERROR_NOT_FOUND)
    throw InternalError(fmt::format("kernel '{}' is not an entry of its own module", kernel_name));
  if (r != CUDA_SUCCESS)
    detail::throw_cu_error(a, r, "cuModuleGetFunction", fmt::format("finding kernel '{}'", kernel_name));
  m.function_ = detail::from_cu(fn);
  m.attributes_ = function_attributes(m.function_);
  for (const PtxasFunctionStats& f : parse_ptxas_info_log(info_log)) {
    if (f.name != kernel_name) continue;
    m.spill_store_bytes_ = f.spill_store_bytes;
    m.spill_load_bytes_ = f.spill_load_bytes;
  }
  m.info_log_ = std::move(info_log);
  return m;
}

LinkedModule link_ptx(const std::string& ptx, const std::string& kernel_name, int opt_level) {
  CubinResult c = compile_ptx(ptx, opt_level, fmt::format("kernel '{}'", kernel_name));
  LinkedModule m = load_cubin(std::move(c.cubin), kernel_name, std::move(c.info_log));
  m.error_log_ = std::move(c.error_log);
  return m;
}

LinkedModule jit_ptx(const std::string& ptx, const std::string& kernel_name, int opt_level) {
  const Api& a = detail::api();
  JitOptions jit(opt_level);
  CUmodule module = nullptr;
  CUresult r = a.cuModuleLoadDataEx(&module, ptx.c_str(), jit.count(), jit.options.data(), jit.values.data());
  if (r != CUDA_SUCCESS) {
    std::string error_log = log_text(jit.errors);
    throw UserError(fmt::format("ptxas rejected the PTX of kernel '{}' (cuModuleLoadDataEx failed: {}):\n{}",
                                kernel_name, detail::describe(a, r),
                                error_log.empty() ? "(the JIT wrote no error log)" : error_log));
  }
  LinkedModule m = LinkedModule::adopt(module, kernel_name, log_text(jit.info));
  m.error_log_ = log_text(jit.errors);
  return m;
}

}  // namespace linac::cuda
