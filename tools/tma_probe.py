#!/usr/bin/env python3
"""Runs tests/ptx/tma_probe.ptx on a GPU: the first check of the TMA ring's pieces (docs/hopper.md,
"Next: TMA") before the compiler emits them. Needs an sm_90 GPU and libcuda; no torch, no linac build.

  python3 tools/tma_probe.py            # exit 0 and "PASS" when both tiles match

A bf16 tensor [B=1, T=256, H=2, D=128] is described to the driver as a 4-D tensor map (dims innermost
first {D, H, T, B}, boxes of 64 columns x 64 rows, the 128-byte swizzle, zeros out of bounds:
cuTensorMapEncodeTiled), passed to the kernel by value, and the kernel copies rows row0..row0+63 of
head 0 through shared memory (two box copies completing on an mbarrier) to `out`, undoing the swizzle.
Checked at row0 = 64 (inside) and row0 = 224 (rows from 256 on must read as zeros).

Written in session 19 without a GPU (the enum values and the call from the CUDA driver API's
documentation: CUtensorMapDataType BFLOAT16 = 9, CU_TENSOR_MAP_SWIZZLE_128B = 3, ...); its first run, on
an H200 in session 20, found the probe passing the map's param-space address where a generic one is
taken (CUDA_ERROR_MISALIGNED_ADDRESS); with cvta.param both rows match. The compiler's TMA ring
(compiler/nvptx/lower_tma.cpp) emits the same sequence.
"""
import ctypes
import sys
from pathlib import Path

import numpy as np

PTX = Path(__file__).resolve().parents[1] / "tests" / "ptx" / "tma_probe.ptx"
B, T, H, D = 1, 256, 2, 128
ROWS, BOX_COLS = 64, 64

CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
CU_TENSOR_MAP_INTERLEAVE_NONE = 0
CU_TENSOR_MAP_SWIZZLE_128B = 3
CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0  # out-of-bounds elements read as zeros


def check(cu, call, *args):
    rc = getattr(cu, call)(*args)
    if rc != 0:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{call} failed: {rc} ({name.value.decode() if name.value else '?'})")


def to_bf16_bits(x):
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def main():
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print(f"tma_probe: no CUDA driver here ({e}); run it on the GPU machine", file=sys.stderr)
        return 2
    check(cu, "cuInit", 0)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(cu, "cuDeviceGet", ctypes.byref(dev), 0)
    check(cu, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    check(cu, "cuCtxSetCurrent", ctx)
    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    check(cu, "cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(PTX.read_bytes() + b"\0"))
    check(cu, "cuModuleGetFunction", ctypes.byref(func), module, b"tma_probe")

    rng = np.random.default_rng(0)
    src = to_bf16_bits(rng.standard_normal((B, T, H, D)))
    d_src, d_out = ctypes.c_uint64(), ctypes.c_uint64()
    check(cu, "cuMemAlloc_v2", ctypes.byref(d_src), ctypes.c_size_t(src.nbytes))
    check(cu, "cuMemAlloc_v2", ctypes.byref(d_out), ctypes.c_size_t(ROWS * D * 2))
    check(cu, "cuMemcpyHtoD_v2", d_src, src.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(src.nbytes))

    # CUtensorMap: 128 bytes, 64-byte aligned (alignas(64) in cuda.h).
    raw = ctypes.create_string_buffer(128 + 64)
    tmap = (ctypes.c_uint64 * 16).from_address((ctypes.addressof(raw) + 63) // 64 * 64)
    dims = (ctypes.c_uint64 * 4)(D, H, T, B)
    strides = (ctypes.c_uint64 * 3)(D * 2, H * D * 2, T * H * D * 2)  # bytes, dims 1..3
    box = (ctypes.c_uint32 * 4)(BOX_COLS, 1, ROWS, 1)
    elem = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    check(cu, "cuTensorMapEncodeTiled", ctypes.byref(tmap), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
          ctypes.c_void_p(d_src.value), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)

    ok = True
    for row0 in (64, 224):
        r0 = ctypes.c_uint32(row0)
        params = (ctypes.c_void_p * 3)(ctypes.cast(ctypes.byref(tmap), ctypes.c_void_p),
                                       ctypes.cast(ctypes.byref(r0), ctypes.c_void_p),
                                       ctypes.cast(ctypes.byref(d_out), ctypes.c_void_p))
        check(cu, "cuLaunchKernel", func, 1, 1, 1, 128, 1, 1, 16384 + 64, None, params, None)
        check(cu, "cuCtxSynchronize")
        out = np.zeros((ROWS, D), dtype=np.uint16)
        check(cu, "cuMemcpyDtoH_v2", out.ctypes.data_as(ctypes.c_void_p), d_out, ctypes.c_size_t(out.nbytes))
        want = np.zeros((ROWS, D), dtype=np.uint16)
        inside = min(ROWS, T - row0)
        want[:inside] = src[0, row0:row0 + inside, 0, :]
        match = np.array_equal(out, want)
        print(f"row0={row0}: {'match' if match else 'MISMATCH'} ({np.count_nonzero(out != want)} of {out.size} "
              f"elements differ)")
        ok &= match
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
