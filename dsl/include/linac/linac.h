/* The C ABI of linac: every library op on tensors the caller owns, from any language.
 *
 *   linac_tensor q = {q_ptr, LINAC_DEVICE_CUDA, 0, 4, LINAC_BF16, shape, NULL};
 *   linac_named_tensor in[] = {{"q", q}, {"k", k}, {"v", v}};
 *   linac_named_tensor out[] = {{"o", o}};
 *   if (linac_op_run("linear_attn", "", in, 3, out, 1, stream, NULL) != LINAC_OK)
 *     fprintf(stderr, "%s\n", linac_last_error());
 *
 * Tensors are plain descriptions of memory (the fields of DLPack's DLTensor that linac needs): a data
 * pointer, where it lives (host memory runs the op on the CPU interpreter, CUDA memory on the GPU), the
 * element type, the shape and optional strides (NULL: contiguous, row-major; linac needs contiguous
 * tensors and says so otherwise). Inputs and outputs are matched to the op's arguments by name (`linac
 * list` and linac_op_describe() list them). The caller provides every output it wants; the outputs it
 * does not name are not computed (or land in scratch memory). linac_op_output_shape() tells an output's
 * shape and dtype for given inputs.
 *
 * Work goes on `stream` (a CUstream; NULL is the legacy default stream). Scratch memory comes from
 * `allocator` (NULL: linac's own stream-ordered caching allocator). After the first call at a given op,
 * options and input shapes (which compiles, or loads from the disk cache, and may tune), a call makes no
 * host synchronisation, no copy between host and device, no allocation beyond the allocator's and no
 * disk access, so a CUDA graph can capture it. Exception: with cu_seqlens in device memory, linac reads
 * its values to the host (a copy and a wait) unless the caller also passes a host copy named
 * "cu_seqlens_cpu".
 *
 * Every function returns a status; on failure linac_last_error() (per thread) says what is wrong in a
 * sentence a user can act on. Nothing the caller passes crashes the process. Thread-safe.
 */
#ifndef LINAC_LINAC_H
#define LINAC_LINAC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The version of this ABI. A library whose linac_abi_version() differs must not be used. */
#define LINAC_ABI_VERSION 2

typedef enum {
  LINAC_OK = 0,
  LINAC_ERROR_INVALID = 1,  /* a mistake in the call: unknown op, bad shape, dtype, option, ... */
  LINAC_ERROR_NO_GPU = 2,   /* CUDA memory given but no usable GPU (no driver, no device) */
  LINAC_ERROR_INTERNAL = 3, /* a bug in linac; the message says what broke */
} linac_status;

/* Element types (values fixed: part of the ABI). */
typedef enum {
  LINAC_F32 = 0,
  LINAC_F16 = 1,
  LINAC_BF16 = 2,
  LINAC_F64 = 3,
  LINAC_I32 = 4,
  LINAC_I64 = 5,
} linac_dtype;

/* Where a tensor's memory lives (DLPack's device type codes). */
typedef enum {
  LINAC_DEVICE_CPU = 1,
  LINAC_DEVICE_CUDA = 2,
} linac_device;

/** A tensor the caller owns. `shape` and `strides` (in elements, or NULL) have `ndim` entries. */
typedef struct {
  void* data;
  int32_t device_type; /* linac_device */
  int32_t device_id;   /* CUDA device ordinal (0 for the CPU) */
  int32_t ndim;
  int32_t dtype;       /* linac_dtype */
  const int64_t* shape;
  const int64_t* strides;
} linac_tensor;

/** A tensor bound to one of the op's inputs or outputs by name. */
typedef struct {
  const char* name;
  linac_tensor tensor;
} linac_named_tensor;

/** Scratch memory for GPU calls: allocate `bytes` usable by work on `stream`; free it once work queued
 *  on `stream` so far is done with it (stream-ordered, as PyTorch's caching allocator does). */
typedef struct {
  void* (*allocate)(void* ctx, size_t bytes, void* stream);
  void (*deallocate)(void* ctx, void* ptr, size_t bytes, void* stream);
  void* ctx;
} linac_allocator;

/** LINAC_ABI_VERSION of the loaded library. */
int linac_abi_version(void);
/** The library's version, e.g. "0.1.0". */
const char* linac_version(void);
/** The message of the last failed call on this thread ("" when none failed). */
const char* linac_last_error(void);

/** 1 when a CUDA driver and device are usable, else 0 (the reason in linac_last_error()). */
int linac_gpu_available(void);

/**
 * Runs `op` ("linear_attn", "gla", "delta_rule", "gated_delta_rule", "poly") on the given tensors.
 * `options` is "key=value" pairs separated by commas ("" or NULL for none):
 *   backward=1        gradients: inputs gain do [, dfinal_state], outputs dq, dk, dv, ...
 *   recurrent=1       the token-by-token (decode) form
 *   normalize=1       linear_attn: divide by scale*q.z + eps;  no_normalize=1 (poly)
 *   l2norm_qk=1       delta rules: L2-normalize q and k in the kernel
 *   scale=S           default K^-1/2;   a=, b=, c= (poly coefficients)
 *   noise_dropout=P, seed=S   (linear_attn, poly)
 *   chunk_size=C      rows per chunk;  any other key=integer is a tuning parameter (see `linac list`)
 * All float inputs must share one dtype (the kernels' precision: q's dtype), except the fp32 ones the op
 * documents (states); gates and betas may come in q's dtype or fp32.
 */
linac_status linac_op_run(const char* op, const char* options, const linac_named_tensor* inputs, int n_inputs,
                          const linac_named_tensor* outputs, int n_outputs, void* stream,
                          const linac_allocator* allocator);

/** A call prepared once and run many times on new addresses (the leanest path: no per-call checks of
 *  shapes, names or options). Not for varlen calls (cu_seqlens), whose plan depends on the offsets. */
typedef struct linac_call linac_call;

/** Prepares `op` for tensors like these (dtypes, shapes, memory; data is not read): what the first
 *  linac_op_run at these shapes does (compiles, tunes). On success *call must be freed with
 *  linac_call_destroy. */
linac_status linac_call_prepare(const char* op, const char* options, const linac_named_tensor* inputs, int n_inputs,
                                const linac_named_tensor* outputs, int n_outputs, linac_call** call);

/** Runs a prepared call. `data`: the addresses of the inputs then the outputs, in the order given to
 *  linac_call_prepare, each in the memory (and on the device) the call was prepared for. GPU scratch is
 *  `workspace` when not NULL (linac_call_workspace_bytes() bytes, 16-byte aligned, usable by work on
 *  `stream`), else from `allocator` (NULL: linac's own). */
linac_status linac_call_run(const linac_call* call, void* const* data, void* stream, void* workspace,
                            const linac_allocator* allocator);

/** The GPU scratch bytes one run of `call` needs (0 for host memory). */
size_t linac_call_workspace_bytes(const linac_call* call);

/** Frees a prepared call (NULL is fine). */
void linac_call_destroy(linac_call* call);

/** The shape (up to 8 dims) and dtype of output `output` of `op` for these inputs (their data may be NULL,
 *  except a host cu_seqlens). */
linac_status linac_op_output_shape(const char* op, const char* options, const linac_named_tensor* inputs,
                                   int n_inputs, const char* output, int32_t* ndim, int64_t shape[8],
                                   int32_t* dtype);

/** Loads a shared library of users' ops (C++ files with LINAC_USER_OP, linac/user_op.h, built against
 *  this library): its ops then run through every function here like the library's. Fails when the
 *  library cannot be loaded or one of its ops cannot be registered (the message names it); ops the
 *  library registered before a failure stay registered. */
linac_status linac_load_ops(const char* path);

/** The names of the ops the last successful linac_load_ops on this thread registered, comma-separated
 *  ("" when it registered none, e.g. the library was loaded before). */
const char* linac_loaded_ops(void);

/** A JSON description of `op` (NULL: of every op): inputs, outputs, options, tuning parameters. The
 *  string stays valid until the next call of this function on the same thread. */
const char* linac_op_describe(const char* op);

#ifdef __cplusplus
}
#endif

#endif /* LINAC_LINAC_H */
