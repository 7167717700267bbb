// Internal to runtime/cuda_*.cpp: the driver entry points linac resolves from libcuda.so.1, and the
// one place CUresults become linac errors. This is the only header that includes cuda.h (for types,
// enums and prototypes only: nothing links libcuda), so it must not be included by public headers.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/cuda_driver.h"

namespace linac::cuda::detail {

// Every entry point linac calls, by the exact symbol libcuda exports. The versioned names (_v2) are
// spelled out because dlsym does not see cuda.h's `#define cuMemAlloc cuMemAlloc_v2` remapping; the
// unversioned symbols are the pre-CUDA-3.2 ABI with 32-bit sizes and pointers.
#define LINAC_CUDA_ENTRY_POINTS(X) \
  X(cuInit)                        \
  X(cuDriverGetVersion)            \
  X(cuGetErrorName)                \
  X(cuGetErrorString)              \
  X(cuDeviceGetCount)              \
  X(cuDeviceGet)                   \
  X(cuDeviceGetName)               \
  X(cuDeviceGetAttribute)          \
  X(cuDeviceTotalMem_v2)           \
  X(cuDevicePrimaryCtxRetain)      \
  X(cuCtxSetCurrent)               \
  X(cuCtxSynchronize)              \
  X(cuMemGetInfo_v2)               \
  X(cuMemAlloc_v2)                 \
  X(cuMemFree_v2)                  \
  X(cuMemcpyHtoD_v2)               \
  X(cuMemcpyDtoH_v2)               \
  X(cuMemsetD8_v2)                 \
  X(cuMemsetD8Async)               \
  X(cuPointerGetAttribute)         \
  X(cuLinkCreate_v2)               \
  X(cuLinkAddData_v2)              \
  X(cuLinkComplete)                \
  X(cuLinkDestroy)                 \
  X(cuModuleLoadData)              \
  X(cuModuleLoadDataEx)            \
  X(cuModuleUnload)                \
  X(cuModuleGetFunction)           \
  X(cuFuncGetAttribute)            \
  X(cuFuncSetAttribute)            \
  X(cuLaunchKernel)                \
  X(cuEventCreate)                 \
  X(cuEventRecord)                 \
  X(cuEventSynchronize)            \
  X(cuEventElapsedTime_v2)         \
  X(cuEventDestroy_v2)             \
  X(cuStreamSynchronize)           \
  X(cuLaunchKernelEx)              \
  X(cuTensorMapEncodeTiled)

/// Function pointers into libcuda, typed from cuda.h's prototypes so a wrong signature fails to
/// compile. Members keep the C names so call sites read like the driver documentation.
struct Api {
  void* library = nullptr;  // the dlopen handle; never closed (see Driver::create)
#define LINAC_CUDA_DECLARE_ENTRY(name) decltype(&::name) name = nullptr;
  LINAC_CUDA_ENTRY_POINTS(LINAC_CUDA_DECLARE_ENTRY)
#undef LINAC_CUDA_DECLARE_ENTRY
};

/// The entry points of the process's driver; throws UserError when there is none.
inline const Api& api() {
  return Driver::get().api();
}

/// Throws the linac error for a failed driver call: UserError when the cause is the machine (out
/// of memory, no or unusable device, driver too old), InternalError when it is linac's own misuse
/// of the API (invalid value, bad handle, a kernel that faulted). The message names the entry
/// point, what linac was doing, and the driver's cuGetErrorName/cuGetErrorString.
[[noreturn]] void throw_cu_error(const Api& a, CUresult result, std::string_view entry_point, std::string_view doing);

/// throw_cu_error unless `result` is CUDA_SUCCESS.
inline void check(const Api& a, CUresult result, std::string_view entry_point, std::string_view doing) {
  if (result != CUDA_SUCCESS) throw_cu_error(a, result, entry_point, doing);
}

/// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; the number when the driver does not know the code.
std::string describe(const Api& a, CUresult result);

/// Calls api.entry(args...) and checks the result, naming the entry point in the error:
///   LINAC_CU_CHECK(a, cuMemAlloc_v2, "allocating the output", &ptr, bytes);
#define LINAC_CU_CHECK(api, entry, doing, ...) \
  ::linac::cuda::detail::check((api), (api).entry(__VA_ARGS__), #entry, (doing))

inline CUfunction to_cu(Function f) {
  return reinterpret_cast<CUfunction>(static_cast<std::uintptr_t>(f));
}
inline Function from_cu(CUfunction f) {
  return static_cast<Function>(reinterpret_cast<std::uintptr_t>(f));
}

}  // namespace linac::cuda::detail
