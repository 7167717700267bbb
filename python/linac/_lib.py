"""liblinac through its C ABI (dsl/include/linac/linac.h), loaded with ctypes.

Why ctypes and not a torch C++ extension: an extension is built against one torch (and one Python), so
it breaks on the next torch; the C ABI has no torch or Python in it, so this one pure-Python file works
with every Python >= 3.9 and torch >= 2.4 (issue 19, point 7).

The library is found at $LINAC_LIBRARY, else linac/lib/liblinac.so inside this package, else
<repo>/build/liblinac.so (the package used from the source tree). Tensors are passed as the header's
`linac_named_tensor` arrays, packed with one struct.pack_into per call into a buffer cached per call
shape (names and ranks), so that a call costs a few microseconds of Python. A prepared call (_Prepared)
takes only addresses, packed the same way into an array it reuses.
"""

import ctypes
import json
import os
import struct
import threading
from pathlib import Path

import torch

from ._errors import InternalError, InvalidCallError, LibraryNotFoundError, NoGpuError

ABI_VERSION = 2

# linac_status
_OK, _INVALID, _NO_GPU, _INTERNAL = 0, 1, 2, 3
# linac_device
_CPU, _CUDA = 1, 2
# linac_dtype (values fixed by the ABI)
DTYPE_CODES = {
    torch.float32: 0,
    torch.float16: 1,
    torch.bfloat16: 2,
    torch.float64: 3,
    torch.int32: 4,
    torch.int64: 5,
}
CODE_DTYPES = {c: d for d, c in DTYPE_CODES.items()}


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
    ]


class _NamedTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tensor", _Tensor)]


class _Allocator(ctypes.Structure):
    _fields_ = [
        ("allocate", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)),
        ("deallocate", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)),
        ("ctx", ctypes.c_void_p),
    ]


# One linac_named_tensor as bytes: name, data, device_type, device_id, ndim, dtype, shape, strides. The
# C struct has no padding (8 + 8 + 4*4 + 8 + 8 = 48 bytes); checked against ctypes' layout below.
_NAMED_FORMAT = "QQiiiiQQ"
_NAMED_SIZE = struct.calcsize("<" + _NAMED_FORMAT)
assert _NAMED_SIZE == ctypes.sizeof(_NamedTensor) == 48, "linac_named_tensor layout"
assert ctypes.sizeof(ctypes.c_void_p) == 8, "a prepared call's addresses are packed as 64-bit words"


def _candidates():
    env = os.environ.get("LINAC_LIBRARY")
    if env:
        return [("$LINAC_LIBRARY", Path(env).expanduser())]
    here = Path(__file__).resolve().parent
    return [("the package", here / "lib" / "liblinac.so"),
            ("the source tree", here.parents[1] / "build" / "liblinac.so")]


def _load():
    tried = []
    for where, path in _candidates():
        if not path.is_file():
            tried.append(f"{path} ({where}: no such file)")
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise LibraryNotFoundError(f"linac: cannot load {path} ({where}): {exc}") from None
        if not hasattr(lib, "linac_op_run"):
            raise LibraryNotFoundError(f"linac: {path} ({where}) has no C ABI (linac_op_run); rebuild linac")
        _declare(lib)
        version = lib.linac_abi_version()
        if version != ABI_VERSION:
            raise LibraryNotFoundError(f"linac: {path} has C ABI version {version}; this package needs "
                                       f"{ABI_VERSION} (install the package and the library from one checkout)")
        return lib, path
    raise LibraryNotFoundError("linac: liblinac.so not found; tried " + "; ".join(tried) +
                               ". Build linac (cmake --build build) or set LINAC_LIBRARY to the library's path")


def _declare(lib):
    c = ctypes
    lib.linac_abi_version.argtypes = []
    lib.linac_abi_version.restype = c.c_int
    lib.linac_version.argtypes = []
    lib.linac_version.restype = c.c_char_p
    lib.linac_last_error.argtypes = []
    lib.linac_last_error.restype = c.c_char_p
    lib.linac_gpu_available.argtypes = []
    lib.linac_gpu_available.restype = c.c_int
    # Arrays go as addresses (c_void_p) of the packed buffers below.
    lib.linac_op_run.argtypes = [c.c_char_p, c.c_char_p, c.c_void_p, c.c_int, c.c_void_p, c.c_int, c.c_void_p,
                                 c.c_void_p]
    lib.linac_op_run.restype = c.c_int
    lib.linac_call_prepare.argtypes = [c.c_char_p, c.c_char_p, c.c_void_p, c.c_int, c.c_void_p, c.c_int,
                                       c.POINTER(c.c_void_p)]
    lib.linac_call_prepare.restype = c.c_int
    lib.linac_call_run.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p]
    lib.linac_call_run.restype = c.c_int
    lib.linac_call_workspace_bytes.argtypes = [c.c_void_p]
    lib.linac_call_workspace_bytes.restype = c.c_size_t
    lib.linac_call_destroy.argtypes = [c.c_void_p]
    lib.linac_call_destroy.restype = None
    lib.linac_op_output_shape.argtypes = [c.c_char_p, c.c_char_p, c.POINTER(_NamedTensor), c.c_int, c.c_char_p,
                                          c.POINTER(c.c_int32), c.POINTER(c.c_int64), c.POINTER(c.c_int32)]
    lib.linac_op_output_shape.restype = c.c_int
    lib.linac_load_ops.argtypes = [c.c_char_p]
    lib.linac_load_ops.restype = c.c_int
    lib.linac_loaded_ops.argtypes = []
    lib.linac_loaded_ops.restype = c.c_char_p
    lib.linac_op_describe.argtypes = [c.c_char_p]
    lib.linac_op_describe.restype = c.c_char_p


_state = threading.local()
_lock = threading.Lock()
_lib = None
_lib_path = None


def lib():
    """The loaded library (loaded on first use, so `import linac` works without it)."""
    global _lib, _lib_path
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib, _lib_path = _load()
    return _lib


def library_path():
    lib()
    return _lib_path


def _raise(status, context):
    msg = lib().linac_last_error().decode("utf-8", "replace")
    pending = getattr(_state, "alloc_error", None)
    if pending is not None:
        # The allocator callback failed (e.g. torch.cuda.OutOfMemoryError): that is the real cause.
        _state.alloc_error = None
        raise pending
    if status == _INVALID:
        raise InvalidCallError(msg or f"{context}: invalid call")
    if status == _NO_GPU:
        raise NoGpuError(msg or f"{context}: no usable GPU")
    raise InternalError(f"{msg or context} (an internal error of linac: please report it)")


# --- scratch memory from torch's caching allocator ---------------------------------------------------

def _allocate(ctx, nbytes, stream):
    try:
        return _raw_alloc(nbytes, stream or 0)
    except BaseException as exc:  # noqa: BLE001 - no exception may cross into C; re-raised after the call
        _state.alloc_error = exc
        return None


def _deallocate(ctx, ptr, nbytes, stream):
    try:
        _raw_delete(ptr)
    except BaseException:  # noqa: BLE001
        pass


def _raw_alloc(nbytes, stream):
    return torch._C._cuda_cudaCachingAllocator_raw_alloc(nbytes, stream)


def _raw_delete(ptr):
    torch._C._cuda_cudaCachingAllocator_raw_delete(ptr)


if not hasattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc"):  # CPU-only torch builds
    _raw_alloc = _raw_delete = None  # noqa: F811

# The callbacks must outlive every call: module globals.
_ALLOCATOR = _Allocator(_Allocator._fields_[0][1](_allocate), _Allocator._fields_[1][1](_deallocate), None)
_ALLOCATOR_ADDR = ctypes.addressof(_ALLOCATOR)

# torch.cuda.current_device() without its Python wrapper (a microsecond per call).
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device

if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    _current_stream = torch._C._cuda_getCurrentRawStream
else:  # pragma: no cover - older or CPU-only builds
    def _current_stream(device):
        return torch.cuda.current_stream(device).cuda_stream


# --- packed call buffers -------------------------------------------------------------------------------

class _Binding:
    """The linac_named_tensor arrays of one call shape (names and ranks of inputs and outputs), in one
    buffer: inputs, outputs, then every tensor's shape. Only the varying fields are re-packed per call."""

    def __init__(self, names, ndims):
        self.n = len(names)
        self.names = [ctypes.create_string_buffer(n.encode()) for n in names]
        total_dims = sum(ndims)
        self.buffer = ctypes.create_string_buffer(_NAMED_SIZE * self.n + 8 * max(total_dims, 1))
        self.addr = ctypes.addressof(self.buffer)
        self.struct = struct.Struct("<" + _NAMED_FORMAT * self.n + "q" * total_dims)
        self.name_addrs = [ctypes.addressof(b) for b in self.names]
        shape_addrs, off = [], self.addr + _NAMED_SIZE * self.n
        for nd in ndims:
            shape_addrs.append(off)
            off += 8 * nd
        self.shape_addrs = shape_addrs


def _binding(names, tensors):
    cache = getattr(_state, "bindings", None)
    if cache is None:
        cache = _state.bindings = {}
    ndims = tuple(t.dim() for t in tensors)
    key = (names, ndims)
    b = cache.get(key)
    if b is None:
        b = cache[key] = _Binding(names, ndims)
    return b


def _pack(b, tensors):
    head, dims = [], []
    for name_addr, shape_addr, t in zip(b.name_addrs, b.shape_addrs, tensors):
        dev = t.get_device()
        code = DTYPE_CODES.get(t.dtype)
        if code is None:
            raise InvalidCallError(f"linac: tensors of dtype {t.dtype} are not supported (float32, float16, "
                                   f"bfloat16 data; int32/int64 cu_seqlens)")
        if not t.is_contiguous():
            raise InternalError("linac: a non-contiguous tensor reached the C ABI (the Python layer should have "
                                "made it contiguous)")
        head += (name_addr, t.data_ptr(), _CUDA if dev >= 0 else _CPU, dev if dev >= 0 else 0, t.dim(), code,
                 shape_addr, 0)
        dims += t.shape
    b.struct.pack_into(b.buffer, 0, *head, *dims)


class _Prepared:
    """A linac_call: the call prepared once for a key (op, options, names, devices, dtypes, shapes) and run
    on each call's addresses, with its GPU scratch as a torch tensor (from torch's caching allocator, on
    the current stream)."""

    def __init__(self, lib_, handle, n, op):
        self.lib, self.handle, self.n, self.op = lib_, handle, n, op
        self.array = ctypes.c_void_p * n
        self.pack = struct.Struct(f"<{n}Q").pack_into
        # Address arrays not in use: a run takes one, fills it and gives it back, so that a call builds no
        # ctypes object and two threads never fill the same array (ctypes drops the GIL during the call).
        self.free = [self.array()]
        # Bound once per prepared call; tools/bench_torch_host.py replaces it on the library before the
        # first call to time the Python layer alone.
        self.fn = lib_.linac_call_run
        self.workspace = lib_.linac_call_workspace_bytes(handle)

    def run(self, ptrs, dev, like):
        """Queues the call on `ptrs`, the data addresses of its inputs then its outputs in the prepared
        order. `dev`: the CUDA ordinal (its current stream; the caller made it the current device), or
        -1 for host tensors; `like`: a tensor on that device, for the scratch."""
        try:
            addresses = self.free.pop()
        except IndexError:
            addresses = self.array()
        self.pack(addresses, 0, *ptrs)
        if dev < 0:
            status = self.fn(self.handle, addresses, None, None, None)
        elif self.workspace:
            # Scratch as a torch tensor from torch's caching allocator on the current stream (capture-aware
            # under CUDA graphs), released when the call is queued: stream order keeps it from being reused
            # before the call is done. (raw_alloc/raw_delete measured slower: 2026-11-25,
            # docs/doors-measured.md.)
            scratch = like.new_empty(self.workspace, dtype=torch.uint8)
            status = self.fn(self.handle, addresses, _current_stream(dev), scratch.data_ptr(), None)
        else:
            status = self.fn(self.handle, addresses, _current_stream(dev), None, None)
        self.free.append(addresses)
        if status != _OK:
            _raise(status, self.op.decode())

    def __del__(self):
        try:
            self.lib.linac_call_destroy(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


# Prepared calls by key; None marks a key that cannot be prepared (varlen: the plan depends on the
# offsets' values), which runs through linac_op_run. Bounded like linac's own table.
_calls = {}
_MAX_CALLS = 4096
# Clears of caches built on prepared calls (linac._api's call signatures), run by forget_prepared_calls.
_on_forget = []


def forget_prepared_calls():
    """Drops every prepared call (after a user's library replaced ops of the same names)."""
    _calls.clear()
    for clear in _on_forget:
        clear()


def _prepare(lib_, key, op, options, names, tensors, n_in):
    if len(_calls) >= _MAX_CALLS:
        _calls.clear()
    if "cu_seqlens" in names:
        _calls[key] = None
        return None
    b = _binding(names, tensors)
    _pack(b, tensors)
    handle = ctypes.c_void_p()
    status = lib_.linac_call_prepare(op, options, b.addr, n_in, b.addr + _NAMED_SIZE * n_in, len(tensors) - n_in,
                                     ctypes.byref(handle))
    if status != _OK:
        _raise(status, op.decode())
    p = _calls[key] = _Prepared(lib_, handle.value, len(tensors), op)
    return p


def _key(op, options, in_names, out_names, inputs):
    # The outputs are not in the key: linac's Python layer makes them from the inputs, options and names.
    return (op, options, in_names, out_names, *[(t.shape, t.dtype, t.get_device()) for t in inputs])


def prepared(op, options, in_names, inputs, out_names, outputs):
    """The prepared call of run(op, options, in_names, inputs, out_names, outputs) (prepared now if it is
    new), or None where the call cannot be prepared (varlen): for callers that keep it and call its run()."""
    dev = inputs[0].get_device()
    if dev >= 0 and dev != _current_device():
        with torch.cuda.device(dev):
            return _prepared(op, options, in_names, inputs, out_names, outputs)
    return _prepared(op, options, in_names, inputs, out_names, outputs)


def _prepared(op, options, in_names, inputs, out_names, outputs):
    key = _key(op, options, in_names, out_names, inputs)
    try:
        return _calls[key]
    except KeyError:
        return _prepare(_lib or lib(), key, op, options, in_names + out_names, inputs + outputs, len(inputs))


def run(op, options, in_names, inputs, out_names, outputs):
    """Runs op `op` (bytes) with `options` (bytes, "key=value,...") on contiguous torch tensors matched
    to the op's inputs and outputs by name (tuples of str). CUDA tensors run on torch's current stream
    of their device with scratch from torch's caching allocator; host tensors on the CPU interpreter."""
    dev = inputs[0].get_device()
    if dev >= 0 and dev != _current_device():
        # Scratch comes from the current device's allocator, work goes on that device's current stream.
        with torch.cuda.device(dev):
            _run(op, options, in_names, inputs, out_names, outputs, dev)
    else:
        _run(op, options, in_names, inputs, out_names, outputs, dev)


def _run(op, options, in_names, inputs, out_names, outputs, dev):
    p = _prepared(op, options, in_names, inputs, out_names, outputs)
    if p is None:
        _run_unprepared(_lib or lib(), op, options, in_names, inputs, out_names, outputs, dev)
        return
    p.run([t.data_ptr() for t in inputs + outputs], dev, inputs[0])


def _run_unprepared(lib_, op, options, in_names, inputs, out_names, outputs, dev):
    """linac_op_run: the call keyed and found inside linac on every call."""
    names = in_names + out_names
    tensors = inputs + outputs
    b = _binding(names, tensors)
    _pack(b, tensors)
    if dev >= 0:
        stream, allocator = _current_stream(dev), _ALLOCATOR_ADDR
    else:
        stream, allocator = None, None
    status = lib_.linac_op_run(op, options, b.addr, len(inputs), b.addr + _NAMED_SIZE * len(inputs),
                               len(outputs), stream, allocator)
    if status != _OK:
        _raise(status, op.decode())


# --- queries --------------------------------------------------------------------------------------------

def _named_array(inputs, shapes_only=False):
    """A ctypes linac_named_tensor[] for {name: tensor} (data may be absent: meta tensors pass NULL), and
    the objects that must stay alive while it is used."""
    arr = (_NamedTensor * max(len(inputs), 1))()
    keep = []
    for i, (name, t) in enumerate(inputs.items()):
        shape = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
        keep.append(shape)
        cname = name.encode()
        keep.append(cname)
        dev = -1 if t.device.type in ("cpu", "meta") else t.get_device()
        data = None if shapes_only or t.device.type == "meta" else t.data_ptr()
        arr[i] = _NamedTensor(cname, _Tensor(data, _CUDA if dev >= 0 else _CPU, max(dev, 0), t.dim(),
                                             DTYPE_CODES[t.dtype], shape, None))
    return arr, keep


def output_shape(op, output, inputs, options="", shapes_only=False):
    """(shape tuple, torch dtype) of output `output` of `op` for `inputs` ({name: tensor}; meta tensors
    are fine, except a host cu_seqlens whose values linac reads), as linac_op_output_shape says."""
    arr, _keep = _named_array(inputs, shapes_only)
    ndim = ctypes.c_int32()
    shape = (ctypes.c_int64 * 8)()
    dtype = ctypes.c_int32()
    status = lib().linac_op_output_shape(op.encode(), options.encode(), arr, len(inputs), output.encode(),
                                         ctypes.byref(ndim), shape, ctypes.byref(dtype))
    if status != _OK:
        _raise(status, op)
    return tuple(shape[i] for i in range(ndim.value)), CODE_DTYPES[dtype.value]


def describe(op=None):
    """linac_op_describe as a Python object (every op when `op` is None)."""
    text = lib().linac_op_describe(op.encode() if op else None)
    if text is None:
        _raise(_INVALID, f"describe {op}")
    return json.loads(text.decode())


def version():
    return lib().linac_version().decode()


def gpu_available():
    return bool(lib().linac_gpu_available())
