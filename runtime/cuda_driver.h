// The CUDA driver layer: loading libcuda, the device linac runs on, device memory, launches and
// timing. Kernels themselves (PTX -> cubin -> function) live in runtime/cuda_module.h.
//
// libcuda.so.1 is opened with dlopen at first use rather than linked: linac builds, and runs its CPU
// parts, on machines without an NVIDIA driver, and only says "no GPU" when a GPU is asked for. This
// header therefore never includes cuda.h; driver handles cross it as opaque integers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace linac::cuda {

namespace detail {
struct Api;
}

/// A CUdeviceptr: a device address, 0 for none.
using DevicePtr = std::uint64_t;
/// A CUstream: work queued on it runs in order. 0 is the legacy default stream.
using Stream = std::uintptr_t;
/// An opaque CUfunction (0 for none). An integer so that this header needs no cuda.h.
enum class Function : std::uintptr_t { none = 0 };

/// True when libcuda.so.1 loads, cuInit succeeds, the chosen device exists and its context can be
/// made; otherwise false, with the reason (the message Driver::get() would throw) in *why. Never
/// throws. The first call initializes the driver, which takes a moment and some GPU memory.
bool driver_available(std::string* why = nullptr);

/// What linac needs to know about the device it runs on.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int warp_size = 32;
  int max_threads_per_block = 0;
  int max_grid_x = 0, max_grid_y = 0, max_grid_z = 0;
  /// Shared memory a block may use without opting in (48 KiB on every device linac targets).
  int max_shared_per_block = 0;
  /// Shared memory a block may use once set_max_dynamic_shared() opted its function in.
  int max_shared_per_block_optin = 0;
  int max_shared_per_sm = 0;
  int regs_per_block = 0;
  int regs_per_sm = 0;
  int l2_bytes = 0;
  std::uint64_t total_memory = 0;
  /// Peak memory clock (kHz) and memory bus width (bits); 0 when the driver does not report them.
  int memory_clock_khz = 0;
  int memory_bus_bits = 0;

  /// Peak DRAM (HBM) bandwidth in bytes/s: two transfers per clock over the bus (about 4.8e12 on an H200);
  /// 0 when the driver reports no clock or bus width.
  double peak_memory_bytes_per_s() const { return 2.0 * memory_clock_khz * 1e3 * memory_bus_bits / 8; }

  /// Compute capability as one number: 80 for sm_80, 90 for sm_90.
  int sm() const { return cc_major * 10 + cc_minor; }
  /// One line for logs and error messages, e.g. "NVIDIA H100 (sm_90, 132 SMs, 79.1 GiB)".
  std::string summary() const;
};

/// The loaded driver, bound to one device's primary context. One per process; the first get()
/// loads libcuda, resolves every entry point linac uses, calls cuInit and retains the primary
/// context of the device chosen by LINAC_CUDA_DEVICE (default 0). Thread-safe; each thread that
/// calls get() gets the context made current for it.
class Driver {
 public:
  /// The driver; throws UserError when there is none ("no CUDA driver: ...; run with --device
  /// cpu"). A failed first initialization is remembered: later calls throw the same message.
  static Driver& get();

  /// cuDriverGetVersion: 12080 for CUDA 12.8.
  int version() const { return version_; }
  const DeviceInfo& device() const { return info_; }
  /// The resolved entry points; for runtime/cuda_*.cpp only (see runtime/cuda_api.h).
  const detail::Api& api() const { return *api_; }

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

 private:
  Driver() = default;
  /// Loads and initializes everything; throws UserError/InternalError. get() calls it once.
  static Driver* create();
  /// Makes this driver's context current on the calling thread.
  void bind_this_thread() const;

  const detail::Api* api_ = nullptr;
  std::uintptr_t context_ = 0;  // the retained primary CUcontext
  int device_ = 0;              // the CUdevice
  int version_ = 0;
  DeviceInfo info_;
};

/// The device linac runs on (Driver::get().device()); throws UserError when there is none.
const DeviceInfo& device_info();

/// Free and total memory of the device right now (cuMemGetInfo).
struct MemInfo {
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
};
MemInfo mem_info();

/// Device memory owned by one object (cuMemAlloc / cuMemFree). Move-only. A buffer of 0 bytes
/// holds no allocation and has ptr() == 0. Running out of memory is a UserError that says how much
/// was asked for and how much is free.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::size_t bytes() const { return bytes_; }
  DevicePtr ptr() const { return ptr_; }

  /// Copies n bytes from host memory to the start of the buffer (n <= bytes()). Synchronous.
  void copy_from_host(const void* src, std::size_t n);
  /// Copies the first n bytes of the buffer to host memory (n <= bytes()). Waits for work queued
  /// on the default stream, so it reads what a preceding launch wrote.
  void copy_to_host(void* dst, std::size_t n) const;
  /// Sets every byte to `value` (used to poison outputs so unwritten elements are noticed).
  void fill_bytes(std::uint8_t value);

 private:
  void release() noexcept;

  DevicePtr ptr_ = 0;
  std::size_t bytes_ = 0;
};

/// Copies n bytes from device address `src` to host memory. Synchronous: waits for the copy (and,
/// on the legacy default stream, for work queued before it).
void copy_to_host(void* dst, DevicePtr src, std::size_t n);
/// Queues a fill of n bytes at `dst` with `value` on `stream`.
void fill_async(DevicePtr dst, std::uint8_t value, std::size_t n, Stream stream);
/// Whether `p` is an address of this process's CUDA memory (device or managed) in linac's context,
/// and the ordinal of the device holding it; false for host memory or another context's pointer.
bool is_device_pointer(const void* p, int* device_ordinal = nullptr);

/// Grid or block extents, as CUDA's dim3.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

/// Lets `f` use up to `bytes` of dynamic shared memory per block; required above 48 KiB
/// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). UserError when the device has less shared
/// memory per block than the function needs.
void set_max_dynamic_shared(Function f, int bytes);
/// Asks for the SMs running `f` to keep the most shared memory (least L1): a launch overlapping another
/// fits beside its programs only where the SM's carveout leaves room (the driver sizes it to the first
/// kernel's need otherwise).
void prefer_max_shared_memory(Function f);

/// Queues `f` on `stream` (cuLaunchKernel; 0: the legacy default stream). `params` holds one pointer per kernel
/// parameter, each pointing at the argument's value. Asynchronous: faults in the kernel surface at
/// the next synchronize() or copy_to_host(). A grid larger than the device allows is a UserError.
/// `early` (sm_90 on): the launch may start once every program of the launch before it on the stream
/// has started and said so (griddepcontrol.launch_dependents), not only once that launch has ended
/// (programmatic dependent launch); the launches after it wait for both as usual.
void launch(Function f, Dim3 grid, Dim3 block, unsigned shared_bytes, std::span<void*> params, Stream stream = 0,
            bool early = false);

/// A TMA tensor map (CUtensorMap: 128 opaque bytes, 128-byte aligned), which a kernel takes by value.
/// Not zeroed unless value-initialised (`TensorMap{}`): a launch's array of them is filled per map.
struct alignas(128) TensorMap {
  std::uint64_t opaque[16];
};

/// Encodes into `out` the map of the contiguous row-major tensor at `base` with `shape` (outermost
/// first) and elements of `element_bytes` (2 or 4) whose copies move `box` elements per dim into shared
/// memory swizzled by `swizzle_bytes` (32, 64 or 128), reading zeros outside the tensor
/// (cuTensorMapEncodeTiled). False, with `out` zeroed, where the driver cannot describe it: a base not
/// 16-byte aligned, a row not a multiple of 16 bytes, an empty or too large dim, a rank over 5.
bool encode_tensor_map(TensorMap* out, DevicePtr base, int element_bytes, std::span<const std::int64_t> shape,
                       std::span<const std::int64_t> box, int swizzle_bytes);

/// Waits for all work queued on the device (cuCtxSynchronize); throws if a kernel faulted.
void synchronize();
/// Waits for the work queued on `stream` (cuStreamSynchronize).
void synchronize(Stream stream);

/// Times work on the default stream with a pair of CUDA events. Move-only.
///   EventTimer t; t.start(); launch(...); t.stop(); float ms = t.elapsed_ms();
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(EventTimer&& other) noexcept;
  EventTimer& operator=(EventTimer&& other) noexcept;
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  /// Records the start event on the default stream.
  void start();
  /// Records the stop event on the default stream.
  void stop();
  /// Milliseconds between start() and stop(); waits for the stop event. InternalError if start()
  /// or stop() was not called.
  float elapsed_ms();

 private:
  void release() noexcept;

  std::uintptr_t start_ = 0;  // CUevent
  std::uintptr_t stop_ = 0;   // CUevent
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace linac::cuda
