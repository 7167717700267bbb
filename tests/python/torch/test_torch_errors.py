"""One test per bad call: each raises a Python exception (never a crash) that says what is wrong."""

import os
import subprocess
import sys

import pytest

from conftest import DEVICE, REPO
from torch_util import cu, inputs, to_torch, torch

import linac
import linac._ops as ops


@pytest.fixture
def t():
    return to_torch(inputs(60, T=16, gate="key", beta=True, init=True, unit_keys=True))


def raises(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)


def test_device_mix(t):
    other = "cpu" if DEVICE == "cuda" else "meta"
    raises(linac.InvalidCallError, "one device", linac.chunk_gla, t["q"], t["k"].to(other), t["v"], t["g"])


def test_gate_on_other_device(t):
    raises(linac.InvalidCallError, "g is on meta", linac.chunk_gla, t["q"], t["k"], t["v"], t["g"].to("meta"))


def test_dtype_mix(t):
    raises(linac.InvalidCallError, "one dtype", linac.chunk_gla, t["q"], t["k"].bfloat16(), t["v"], t["g"])


def test_float64(t):
    raises(linac.InvalidCallError, "float32, float16 or bfloat16", linac.chunk_gla, t["q"].double(),
           t["k"].double(), t["v"].double(), t["g"])


def test_gate_dtype(t):
    raises(linac.InvalidCallError, "g must be float32 or q's dtype", linac.chunk_gla, t["q"].bfloat16(),
           t["k"].bfloat16(), t["v"].bfloat16(), t["g"].half())


def test_rank(t):
    raises(linac.InvalidCallError, r"q must be \[B, T, H, K\]", linac.chunk_gla, t["q"][0], t["k"][0], t["v"][0],
           t["g"][0])


def test_key_shape(t):
    raises(linac.InvalidCallError, "k must have q's shape", linac.chunk_gla, t["q"], t["k"][:, :8], t["v"], t["g"])


def test_gate_shape(t):
    raises(linac.InvalidCallError, "g must have shape", linac.chunk_gla, t["q"], t["k"], t["v"], t["g"][..., 0])


def test_beta_shape(t):
    raises(linac.InvalidCallError, "beta must have shape", linac.chunk_delta_rule, t["q"], t["k"], t["v"],
           t["beta"][:, :4])


def test_beta_per_value_channel(t):
    raises(linac.UnsupportedError, "beta per value channel", linac.chunk_delta_rule, t["q"], t["k"], t["v"],
           t["v"].clone())


def test_grouped_value_heads(t):
    v = torch.cat([t["v"], t["v"]], dim=2)
    raises(linac.UnsupportedError, "GVA", linac.chunk_gated_delta_rule, t["q"], t["k"], v, t["g"][..., 0],
           t["beta"])


def test_initial_state_shape(t):
    raises(linac.InvalidCallError, r"initial_state must be \[N, H, K, V\]", linac.chunk_gla, t["q"], t["k"],
           t["v"], t["g"], initial_state=t["initial_state"][:1])


def test_varlen_batch(t):
    raises(linac.InvalidCallError, "batch size must be 1", linac.chunk_gla, t["q"], t["k"], t["v"], t["g"],
           cu_seqlens=cu([0, 8, 16])[0])


def test_cu_seqlens_dtype(t):
    q, k, v, g = (t[n][:1] for n in "qkvg")
    raises(linac.InvalidCallError, "int32/int64", linac.chunk_gla, q, k, v, g,
           cu_seqlens=torch.tensor([0.0, 16.0], device=q.device))


def test_cu_seqlens_values(t):
    """Offsets that do not end at T: the C ABI's message comes through as InvalidCallError."""
    q, k, v, g = (t[n][:1] for n in "qkvg")
    with pytest.raises(linac.InvalidCallError) as e:
        linac.chunk_gla(q, k, v, g, cu_seqlens=cu([0, 5, 9])[0])
    assert "cu_seqlens" in str(e.value)


def test_cu_seqlens_cpu_on_device(t):
    if DEVICE != "cuda":
        pytest.skip("needs CUDA tensors (a device cu_seqlens_cpu)")
    q, k, v, g = (t[n][:1] for n in "qkvg")
    c = cu([0, 16])[0]
    raises(linac.InvalidCallError, "host tensor", linac.chunk_gla, q, k, v, g, cu_seqlens=c, cu_seqlens_cpu=c)


def test_normalize_with_states(t):
    raises(linac.UnsupportedError, "keeps no state", linac.chunk_linear_attn, t["q"], t["k"], t["v"],
           output_final_state=True)
    raises(linac.UnsupportedError, "keeps no state", linac.chunk_linear_attn, t["q"], t["k"], t["v"],
           initial_state=t["initial_state"])


@pytest.mark.parametrize("kwargs", [dict(reverse=True), dict(gv="gv")])
def test_fla_arguments_linac_lacks(t, kwargs):
    kwargs = {k: (t["v"] if v == "gv" else v) for k, v in kwargs.items()}
    raises(linac.UnsupportedError, "does not implement", linac.fused_recurrent_gla, t["q"], t["k"], t["v"],
           t["g"], **kwargs)


@pytest.mark.parametrize("flag", ["use_beta_sigmoid_in_kernel", "allow_neg_eigval", "use_gate_in_kernel"])
def test_gated_delta_rule_flags(t, flag):
    raises(linac.UnsupportedError, flag, linac.chunk_gated_delta_rule, t["q"], t["k"], t["v"], t["g"][..., 0],
           t["beta"], **{flag: True})


def test_g_and_g_gamma(t):
    raises(linac.InvalidCallError, "g or g_gamma", linac.chunk_simple_gla, t["q"], t["k"], t["v"], t["g"][..., 0],
           g_gamma=torch.zeros(2, device=t["q"].device))


def test_unknown_keyword(t):
    raises(TypeError, "unexpected keyword argument 'bogus'", linac.chunk_gla, t["q"], t["k"], t["v"], t["g"],
           bogus=1)


def test_head_first(t):
    raises(linac.UnsupportedError, "head_first", linac.chunk_simple_gla, t["q"], t["k"], t["v"], head_first=True)


def test_bad_chunk_size_from_c_abi(t):
    raises(linac.InvalidCallError, "chunk", linac.chunk_gla, t["q"], t["k"], t["v"], t["g"], chunk_size=24)


def test_c_abi_shape_error_through_custom_op(t):
    """torch.ops.linac.* skips the Python checks: linac's own message arrives as InvalidCallError."""
    with pytest.raises(linac.InvalidCallError) as e:
        ops.gla(t["q"], t["k"], t["v"], t["g"][..., :3].contiguous(), None, None, None, 0.25, False, False, "")
    assert "g" in str(e.value)


def test_poly_head_dim_limit():
    x = to_torch(inputs(61, T=4, K=160, V=8))
    raises(linac.InvalidCallError, "128", linac.poly, x["q"], x["k"], x["v"])


def test_errors_are_value_errors(t):
    assert issubclass(linac.InvalidCallError, ValueError) and issubclass(linac.InvalidCallError, linac.LinacError)
    assert issubclass(linac.UnsupportedError, NotImplementedError)
    assert issubclass(linac.NoGpuError, RuntimeError) and issubclass(linac.InternalError, RuntimeError)


def test_library_not_found():
    """A wrong LINAC_LIBRARY: `import linac` works, the first op says which path it tried."""
    code = ("import torch, linac\n"
            "try:\n    linac.chunk_simple_gla(*[torch.zeros(1, 2, 1, 4)] * 3)\n"
            "except linac.LibraryNotFoundError as e:\n    print('ok', e)\n")
    env = dict(os.environ, LINAC_LIBRARY="/nonexistent/liblinac.so", PYTHONPATH=str(REPO / "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("ok") and "/nonexistent/liblinac.so" in out.stdout, out.stdout + out.stderr
