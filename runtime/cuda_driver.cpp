// The CUDA driver layer: dlopen of libcuda, initialization, error translation, device info, memory,
// launches and events. See runtime/cuda_driver.h for why the driver is loaded at run time.
#include "runtime/cuda_driver.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "linac/error.h"
#include "runtime/cuda_api.h"

namespace linac::cuda {

using detail::Api;

namespace {

constexpr const char* kLibraryName = "libcuda.so.1";
constexpr const char* kNoGpuHint = "run with --device cpu";

// "1.50 GiB", "512 B": sizes in messages people read.
std::string format_bytes(std::uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = -1;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, units[u]);
}

// The device the user picked. This is the one place LINAC_CUDA_DEVICE is read; it is an ordinal
// among the devices CUDA_VISIBLE_DEVICES leaves visible, as in every CUDA program.
int selected_device_ordinal(int device_count) {
  const char* env = std::getenv("LINAC_CUDA_DEVICE");
  if (env == nullptr || *env == '\0') return 0;
  std::string_view text(env);
  int ordinal = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ordinal);
  if (ec != std::errc() || end != text.data() + text.size() || ordinal < 0 || ordinal >= device_count)
    throw UserError(
        fmt::format("LINAC_CUDA_DEVICE='{}' is not a device ordinal: {} CUDA device(s) are visible, "
                    "numbered 0 to {}",
                    text, device_count, device_count - 1));
  return ordinal;
}

// Codes whose cause lies in the machine or its setup rather than in linac: the user can act on
// them (free memory, pick another device, update the driver). Everything else means linac called
// the driver wrongly or generated a kernel that faulted, which is a linac bug.
bool is_user_error(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_DEVICE_NOT_LICENSED:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
      return true;
    default:
      return false;
  }
}

// What a user can do about an error, appended to its message.
std::string_view hint_for(CUresult r) {
  switch (r) {
    case CUDA_ERROR_STUB_LIBRARY:
      return "; the libcuda.so.1 found is the CUDA toolkit's stub, not a driver: install the NVIDIA "
             "driver or take the stubs directory out of LD_LIBRARY_PATH";
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
      return "; update the NVIDIA driver";
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
      return "; the kernel's block needs more registers than the device has: choose a configuration with "
             "fewer threads per block";
    case CUDA_ERROR_LAUNCH_TIMEOUT:
      return "; the kernel ran into the display watchdog: use a GPU that drives no display";
    // A fault inside a kernel poisons the context: every later call fails the same way.
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ASSERT:
      return "; a kernel faulted and the GPU context is now unusable, so restart the process "
             "(CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer point at the kernel)";
    default:
      return "";
  }
}

std::string describe_with(const Api& a, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (a.cuGetErrorName == nullptr || a.cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr)
    return fmt::format("CUDA error {}", static_cast<int>(r));
  if (a.cuGetErrorString == nullptr || a.cuGetErrorString(r, &text) != CUDA_SUCCESS || text == nullptr) return name;
  return fmt::format("{} ({})", name, text);
}

[[noreturn]] void throw_with(const Api& a, CUresult r, std::string_view entry_point, std::string_view doing) {
  std::string msg = fmt::format("{} failed while {}: {}{}", entry_point, doing, describe_with(a, r), hint_for(r));
  if (is_user_error(r)) throw UserError(msg);
  throw InternalError(msg);
}

// Initialization failures are all the user's to act on: whatever the code, linac cannot use this
// machine's GPU, and the CPU device still works.
[[noreturn]] void throw_init_error(const Api& a, CUresult r, std::string_view entry_point, std::string_view doing) {
  std::string extra;
  if (r == CUDA_ERROR_NO_DEVICE) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    extra = visible ? fmt::format(" (CUDA_VISIBLE_DEVICES='{}')", visible) : std::string();
  }
  throw UserError(fmt::format("no usable CUDA device: {} failed while {}: {}{}{}; {}", entry_point, doing,
                              describe_with(a, r), extra, hint_for(r), kNoGpuHint));
}

int device_attribute(const Api& a, CUdevice dev, CUdevice_attribute attr, std::string_view what) {
  int value = 0;
  CUresult r = a.cuDeviceGetAttribute(&value, attr, dev);
  if (r != CUDA_SUCCESS) throw_init_error(a, r, "cuDeviceGetAttribute", fmt::format("reading {}", what));
  return value;
}

DeviceInfo query_device(const Api& a, CUdevice dev, int ordinal) {
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  CUresult r = a.cuDeviceGetName(name, sizeof(name) - 1, dev);
  if (r != CUDA_SUCCESS) throw_init_error(a, r, "cuDeviceGetName", "reading the device name");
  info.name = name;
  auto attr = [&](CUdevice_attribute at, std::string_view what) { return device_attribute(a, dev, at, what); };
  info.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "the compute capability");
  info.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "the compute capability");
  info.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "the SM count");
  info.warp_size = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE, "the warp size");
  info.max_threads_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "the block size limit");
  info.max_grid_x = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, "the grid size limit");
  info.max_grid_y = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, "the grid size limit");
  info.max_grid_z = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, "the grid size limit");
  info.max_shared_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, "the shared memory size");
  info.max_shared_per_block_optin =
      attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "the opt-in shared memory size");
  info.max_shared_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, "the shared memory size");
  info.regs_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, "the register file size");
  info.regs_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, "the register file size");
  info.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "the L2 cache size");
  // Only for reports (linac bench's HBM floor): a driver that does not answer leaves them 0 rather than
  // failing the whole initialization.
  auto optional_attr = [&](CUdevice_attribute at) {
    int value = 0;
    return a.cuDeviceGetAttribute(&value, at, dev) == CUDA_SUCCESS ? value : 0;
  };
  info.memory_clock_khz = optional_attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
  info.memory_bus_bits = optional_attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  size_t total = 0;
  r = a.cuDeviceTotalMem_v2(&total, dev);
  if (r != CUDA_SUCCESS) throw_init_error(a, r, "cuDeviceTotalMem_v2", "reading the memory size");
  info.total_memory = total;
  return info;
}

// The outcome of the one initialization attempt. Allocated once and never freed, like the driver
// itself, so that nothing is torn down under a DeviceBuffer or module destroyed late at exit.
struct InitState {
  std::once_flag once;
  Driver* driver = nullptr;
  std::exception_ptr error;
};

InitState& init_state() {
  static InitState* state = new InitState;
  return *state;
}

}  // namespace

std::string DeviceInfo::summary() const {
  return fmt::format("{} (sm_{}, {} SMs, {})", name, sm(), sm_count, format_bytes(total_memory));
}

namespace detail {

std::string describe(const Api& a, CUresult result) {
  return describe_with(a, result);
}

void throw_cu_error(const Api& a, CUresult result, std::string_view entry_point, std::string_view doing) {
  throw_with(a, result, entry_point, doing);
}

}  // namespace detail

Driver* Driver::create() {
  // The Api, the dlopen handle and the primary context are never released: the driver is a
  // process-wide singleton, and objects holding device memory or modules may be destroyed during
  // static destruction, after any owner of ours would already be gone. The OS and the driver
  // reclaim everything at exit.
  auto api = std::make_unique<Api>();
  Api& a = *api;
  dlerror();
  a.library = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
  if (a.library == nullptr) {
    const char* why = dlerror();
    throw UserError(fmt::format("no CUDA driver: {} could not be loaded ({}); {}", kLibraryName,
                                why ? why : "no reason given", kNoGpuHint));
  }

  // dlsym rather than cuGetProcAddress: the symbols are named with their exact ABI version above,
  // and dlsym needs no driver call to bootstrap. A missing symbol means a driver older than linac
  // supports; cuEventElapsedTime_v2 (CUDA 12.8) alone has an older equivalent to fall back to.
  std::vector<std::string> missing;
  auto resolve = [&](auto& fn, std::string_view symbol) {
    void* p = dlsym(a.library, std::string(symbol).c_str());
    if (p == nullptr && symbol == "cuEventElapsedTime_v2") p = dlsym(a.library, "cuEventElapsedTime");
    if (p == nullptr) missing.emplace_back(symbol);
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
#define LINAC_CUDA_RESOLVE_ENTRY(name) resolve(a.name, #name);
  LINAC_CUDA_ENTRY_POINTS(LINAC_CUDA_RESOLVE_ENTRY)
#undef LINAC_CUDA_RESOLVE_ENTRY
  if (!missing.empty())
    throw UserError(fmt::format("the CUDA driver is too old: {} has no {}; update the NVIDIA driver or {}",
                                kLibraryName, fmt::join(missing, ", "), kNoGpuHint));

  CUresult r = a.cuInit(0);
  if (r != CUDA_SUCCESS) throw_init_error(a, r, "cuInit", "initializing the driver");
  int version = 0;
  r = a.cuDriverGetVersion(&version);
  if (r != CUDA_SUCCESS) throw_init_error(a, r, "cuDriverGetVersion", "reading the driver version");
  int count = 0;
  r = a.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) throw_init_error(a, r, "cuDeviceGetCount", "counting devices");
  if (count == 0) throw_init_error(a, CUDA_ERROR_NO_DEVICE, "cuDeviceGetCount", "counting devices");
  int ordinal = selected_device_ordinal(count);
  CUdevice dev = 0;
  r = a.cuDeviceGet(&dev, ordinal);
  if (r != CUDA_SUCCESS) throw_init_error(a, r, "cuDeviceGet", fmt::format("opening device {}", ordinal));
  DeviceInfo info = query_device(a, dev, ordinal);

  // The primary context is the one the CUDA runtime uses too, so device pointers from PyTorch or
  // cuBLAS in the same process are valid in linac kernels and vice versa.
  CUcontext ctx = nullptr;
  r = a.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r != CUDA_SUCCESS)
    throw_init_error(a, r, "cuDevicePrimaryCtxRetain", fmt::format("creating a context on {}", info.summary()));

  auto* d = new Driver;
  d->api_ = api.release();
  d->context_ = reinterpret_cast<std::uintptr_t>(ctx);
  d->device_ = dev;
  d->version_ = version;
  d->info_ = std::move(info);
  return d;
}

void Driver::bind_this_thread() const {
  CUresult r = api_->cuCtxSetCurrent(reinterpret_cast<CUcontext>(context_));
  if (r != CUDA_SUCCESS) throw_with(*api_, r, "cuCtxSetCurrent", "making linac's context current");
}

Driver& Driver::get() {
  InitState& s = init_state();
  // A throwing call_once callable would leave the flag unset and retry the dlopen on every call;
  // the failure is remembered instead, so every caller sees the same message cheaply.
  std::call_once(s.once, [&s] {
    try {
      s.driver = create();
    } catch (...) {
      s.error = std::current_exception();
    }
  });
  if (s.driver == nullptr) std::rethrow_exception(s.error);
  // A CUDA context is current per thread. Binding once per thread keeps the launch path free of
  // driver queries; code that switches contexts on a thread it shares with linac must switch back.
  thread_local const Driver* bound = nullptr;
  if (bound != s.driver) {
    s.driver->bind_this_thread();
    bound = s.driver;
  }
  return *s.driver;
}

bool driver_available(std::string* why) {
  try {
    Driver::get();
    return true;
  } catch (const std::exception& e) {
    if (why) *why = e.what();
  } catch (...) {
    if (why) *why = "unknown error while loading the CUDA driver";
  }
  return false;
}

const DeviceInfo& device_info() {
  return Driver::get().device();
}

MemInfo mem_info() {
  const Api& a = detail::api();
  size_t free_bytes = 0, total_bytes = 0;
  LINAC_CU_CHECK(a, cuMemGetInfo_v2, "reading free device memory", &free_bytes, &total_bytes);
  return {free_bytes, total_bytes};
}

// ---------------------------------------------------------------------------------------------
// DeviceBuffer

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  if (bytes == 0) return;
  const Api& a = detail::api();
  CUdeviceptr p = 0;
  CUresult r = a.cuMemAlloc_v2(&p, bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    std::string free_text = "unknown";
    size_t free_bytes = 0, total_bytes = 0;
    if (a.cuMemGetInfo_v2(&free_bytes, &total_bytes) == CUDA_SUCCESS)
      free_text = fmt::format("{} of {}", format_bytes(free_bytes), format_bytes(total_bytes));
    throw UserError(
        fmt::format("out of GPU memory: allocating {} on {}, {} free; use smaller inputs or "
                    "stop other work on the GPU",
                    format_bytes(bytes), device_info().name, free_text));
  }
  if (r != CUDA_SUCCESS)
    detail::throw_cu_error(a, r, "cuMemAlloc_v2", fmt::format("allocating {}", format_bytes(bytes)));
  ptr_ = p;
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  release();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (ptr_ == 0) return;
  // A destructor cannot report failure; cuMemFree fails only on a dead context (a faulted kernel,
  // or the driver already shut down at exit), where the memory is gone anyway.
  try {
    (void)Driver::get().api().cuMemFree_v2(ptr_);
  } catch (...) {
  }
  ptr_ = 0;
  bytes_ = 0;
}

void DeviceBuffer::copy_from_host(const void* src, std::size_t n) {
  LINAC_INTERNAL_CHECK(n <= bytes_, fmt::format("copy of {} bytes into a buffer of {}", n, bytes_));
  if (n == 0) return;
  LINAC_INTERNAL_CHECK(src != nullptr, "copy from a null host pointer");
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuMemcpyHtoD_v2, "copying to the device", ptr_, src, n);
}

void DeviceBuffer::copy_to_host(void* dst, std::size_t n) const {
  LINAC_INTERNAL_CHECK(n <= bytes_, fmt::format("copy of {} bytes out of a buffer of {}", n, bytes_));
  if (n == 0) return;
  LINAC_INTERNAL_CHECK(dst != nullptr, "copy to a null host pointer");
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuMemcpyDtoH_v2, "copying from the device", dst, ptr_, n);
}

void DeviceBuffer::fill_bytes(std::uint8_t value) {
  if (bytes_ == 0) return;
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuMemsetD8_v2, "filling device memory", ptr_, value, bytes_);
}

// ---------------------------------------------------------------------------------------------
// Launches

void set_max_dynamic_shared(Function f, int bytes) {
  LINAC_INTERNAL_CHECK(f != Function::none, "set_max_dynamic_shared on a null function");
  LINAC_INTERNAL_CHECK(bytes >= 0, "negative dynamic shared memory size");
  Driver& d = Driver::get();
  const Api& a = d.api();
  int static_bytes = 0;
  LINAC_CU_CHECK(a, cuFuncGetAttribute, "reading a kernel's static shared memory", &static_bytes,
                 CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, detail::to_cu(f));
  const DeviceInfo& dev = d.device();
  if (static_cast<int64_t>(static_bytes) + bytes > dev.max_shared_per_block_optin)
    throw UserError(
        fmt::format("the kernel needs {} of shared memory per block ({} dynamic + {} static), but {} "
                    "allows at most {}; choose a configuration with smaller tiles",
                    format_bytes(static_cast<std::uint64_t>(static_bytes) + bytes), format_bytes(bytes),
                    format_bytes(static_bytes), dev.summary(), format_bytes(dev.max_shared_per_block_optin)));
  LINAC_CU_CHECK(a, cuFuncSetAttribute, "opting a kernel into large shared memory", detail::to_cu(f),
                 CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}

void prefer_max_shared_memory(Function f) {
  LINAC_INTERNAL_CHECK(f != Function::none, "prefer_max_shared_memory on a null function");
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuFuncSetAttribute, "preferring shared memory over L1", detail::to_cu(f),
                 CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, CU_SHAREDMEM_CARVEOUT_MAX_SHARED);
}

void copy_to_host(void* dst, DevicePtr src, std::size_t n) {
  if (n == 0) return;
  LINAC_INTERNAL_CHECK(dst != nullptr && src != 0, "copy between null pointers");
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuMemcpyDtoH_v2, "copying from the device", dst, src, n);
}

void fill_async(DevicePtr dst, std::uint8_t value, std::size_t n, Stream stream) {
  if (n == 0) return;
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuMemsetD8Async, "filling device memory", dst, value, n, reinterpret_cast<CUstream>(stream));
}

bool is_device_pointer(const void* p, int* device_ordinal) {
  const Api& a = detail::api();
  unsigned int memory_type = 0;
  if (a.cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p)) !=
      CUDA_SUCCESS)
    return false;
  if (memory_type != CU_MEMORYTYPE_DEVICE && memory_type != CU_MEMORYTYPE_UNIFIED) return false;
  int ordinal = 0;
  if (a.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, reinterpret_cast<CUdeviceptr>(p)) !=
      CUDA_SUCCESS)
    return false;
  if (device_ordinal) *device_ordinal = ordinal;
  return true;
}

void launch(Function f, Dim3 grid, Dim3 block, unsigned shared_bytes, std::span<void*> params, Stream stream,
            bool early) {
  LINAC_INTERNAL_CHECK(f != Function::none, "launch of a null function");
  Driver& d = Driver::get();
  const DeviceInfo& dev = d.device();
  // An empty grid means an empty problem, which callers skip; block shapes come from linac's own
  // configurations. Grid sizes grow with the user's inputs, so those limits are the user's.
  LINAC_INTERNAL_CHECK(grid.x > 0 && grid.y > 0 && grid.z > 0,
                       fmt::format("launch with an empty grid ({}, {}, {})", grid.x, grid.y, grid.z));
  const std::uint64_t threads = std::uint64_t{block.x} * block.y * block.z;
  LINAC_INTERNAL_CHECK(threads > 0 && threads <= static_cast<std::uint64_t>(dev.max_threads_per_block),
                       fmt::format("block ({}, {}, {}) has {} threads; the device allows 1 to {}", block.x, block.y,
                                   block.z, threads, dev.max_threads_per_block));
  if (grid.x > static_cast<unsigned>(dev.max_grid_x) || grid.y > static_cast<unsigned>(dev.max_grid_y) ||
      grid.z > static_cast<unsigned>(dev.max_grid_z))
    throw UserError(
        fmt::format("the problem is too large for one launch: grid ({}, {}, {}) exceeds {}'s limit of "
                    "({}, {}, {}) blocks",
                    grid.x, grid.y, grid.z, dev.name, dev.max_grid_x, dev.max_grid_y, dev.max_grid_z));
  const Api& a = d.api();
  if (early) {
    if (dev.cc_major < 9)
      throw InternalError(fmt::format("a launch overlapping the one before it needs sm_90 or later; {} is sm_{}{}",
                                      dev.name, dev.cc_major, dev.cc_minor));
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = grid.x, config.gridDimY = grid.y, config.gridDimZ = grid.z;
    config.blockDimX = block.x, config.blockDimY = block.y, config.blockDimZ = block.z;
    config.sharedMemBytes = shared_bytes;
    config.hStream = reinterpret_cast<CUstream>(stream);
    config.attrs = &attr;
    config.numAttrs = 1;
    LINAC_CU_CHECK(a, cuLaunchKernelEx, "launching a kernel early", &config, detail::to_cu(f),
                   params.empty() ? nullptr : params.data(), nullptr);
    return;
  }
  LINAC_CU_CHECK(a, cuLaunchKernel, "launching a kernel", detail::to_cu(f), grid.x, grid.y, grid.z, block.x, block.y,
                 block.z, shared_bytes, reinterpret_cast<CUstream>(stream), params.empty() ? nullptr : params.data(),
                 nullptr);
}

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) == alignof(CUtensorMap));

bool encode_tensor_map(TensorMap* out, DevicePtr base, int element_bytes, std::span<const std::int64_t> shape,
                       std::span<const std::int64_t> box, int swizzle_bytes) {
  *out = TensorMap{};
  const size_t rank = shape.size();
  if (rank == 0 || rank > 5 || box.size() != rank || (element_bytes != 2 && element_bytes != 4)) return false;
  // Innermost first, as the driver takes them; strides in bytes for dims 1.. (dim 0 is contiguous).
  cuuint64_t dims[5], strides[4];
  cuuint32_t boxes[5], element_strides[5];
  std::uint64_t stride = static_cast<std::uint64_t>(element_bytes);
  for (size_t j = 0; j < rank; ++j) {
    const std::int64_t n = shape[rank - 1 - j], b = box[rank - 1 - j];
    if (n <= 0 || b <= 0 || b > 256) return false;
    dims[j] = static_cast<cuuint64_t>(n);
    boxes[j] = static_cast<cuuint32_t>(b);
    element_strides[j] = 1;
    if (j > 0) strides[j - 1] = stride;
    stride *= static_cast<std::uint64_t>(n);
  }
  const CUtensorMapSwizzle swizzle = swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                     : swizzle_bytes == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                           : CU_TENSOR_MAP_SWIZZLE_NONE;
  // The copies only move bits: any element type of the width will do.
  const CUtensorMapDataType type = element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT32;
  const Api& a = detail::api();
  const CUresult r = a.cuTensorMapEncodeTiled(
      reinterpret_cast<CUtensorMap*>(out), type, static_cast<cuuint32_t>(rank), reinterpret_cast<void*>(base), dims,
      strides, boxes, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) *out = TensorMap{};
  return r == CUDA_SUCCESS;
}

void synchronize() {
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuCtxSynchronize, "waiting for the device");
}

void synchronize(Stream stream) {
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuStreamSynchronize, "waiting for a stream", reinterpret_cast<CUstream>(stream));
}

// ---------------------------------------------------------------------------------------------
// EventTimer

namespace {
CUevent as_event(std::uintptr_t e) {
  return reinterpret_cast<CUevent>(e);
}
}  // namespace

EventTimer::EventTimer() {
  const Api& a = detail::api();
  CUevent start = nullptr, stop = nullptr;
  LINAC_CU_CHECK(a, cuEventCreate, "creating a timing event", &start, CU_EVENT_DEFAULT);
  start_ = reinterpret_cast<std::uintptr_t>(start);
  CUresult r = a.cuEventCreate(&stop, CU_EVENT_DEFAULT);
  if (r != CUDA_SUCCESS) {
    release();
    detail::throw_cu_error(a, r, "cuEventCreate", "creating a timing event");
  }
  stop_ = reinterpret_cast<std::uintptr_t>(stop);
}

EventTimer::~EventTimer() {
  release();
}

EventTimer::EventTimer(EventTimer&& other) noexcept
    : start_(std::exchange(other.start_, 0)),
      stop_(std::exchange(other.stop_, 0)),
      started_(std::exchange(other.started_, false)),
      stopped_(std::exchange(other.stopped_, false)) {}

EventTimer& EventTimer::operator=(EventTimer&& other) noexcept {
  if (this != &other) {
    release();
    start_ = std::exchange(other.start_, 0);
    stop_ = std::exchange(other.stop_, 0);
    started_ = std::exchange(other.started_, false);
    stopped_ = std::exchange(other.stopped_, false);
  }
  return *this;
}

void EventTimer::release() noexcept {
  try {
    const Api& a = Driver::get().api();
    if (start_) (void)a.cuEventDestroy_v2(as_event(start_));
    if (stop_) (void)a.cuEventDestroy_v2(as_event(stop_));
  } catch (...) {
  }
  start_ = stop_ = 0;
  started_ = stopped_ = false;
}

void EventTimer::start() {
  LINAC_INTERNAL_CHECK(start_ != 0, "start() on a moved-from EventTimer");
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuEventRecord, "recording a timing event", as_event(start_), nullptr);
  started_ = true;
  stopped_ = false;
}

void EventTimer::stop() {
  LINAC_INTERNAL_CHECK(started_, "EventTimer::stop() without start()");
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuEventRecord, "recording a timing event", as_event(stop_), nullptr);
  stopped_ = true;
}

float EventTimer::elapsed_ms() {
  LINAC_INTERNAL_CHECK(started_ && stopped_, "EventTimer::elapsed_ms() before start() and stop()");
  const Api& a = detail::api();
  LINAC_CU_CHECK(a, cuEventSynchronize, "waiting for a timing event", as_event(stop_));
  float ms = 0;
  LINAC_CU_CHECK(a, cuEventElapsedTime_v2, "reading a timer", &ms, as_event(start_), as_event(stop_));
  return ms;
}

}  // namespace linac::cuda
