"""Every Python op's forward against the float64 numpy references (tests/python/reference*.py): gates,
initial and final states, varlen (cu_seqlens with and without the host copy), the recurrent forms,
bf16, non-contiguous inputs, fla's state_v_first and g_gamma."""

import numpy as np
import pytest

from torch_util import F, assert_close, cu, inputs, numpy, tensor, to_torch, torch

import linac
import reference
import reference_delta
import reference_gla
import reference_poly


def ref_linear_attn(x, cu_seqlens=None, scale=None):
    return reference.linear_attn(x["q"], x["k"], x["v"], g=x.get("g"), initial_state=x.get("initial_state"),
                                 cu_seqlens=cu_seqlens, scale=scale)


def ref_gla(x, cu_seqlens=None):
    return reference_gla.gla(x["q"], x["k"], x["v"], x["g"], initial_state=x.get("initial_state"),
                             cu_seqlens=cu_seqlens)


def ref_delta(x, cu_seqlens=None, l2norm_qk=False):
    return reference_delta.delta_rule(x["q"], x["k"], x["v"], x["beta"], g=x.get("g"),
                                      initial_state=x.get("initial_state"), cu_seqlens=cu_seqlens,
                                      l2norm_qk=l2norm_qk)


def check(o, ht, ref, final=True, tol=1e-5):
    assert_close(o, ref[0], tol, "o")
    if final:
        assert ht is not None and ht.dtype == torch.float32, "final_state must be fp32"
        assert_close(ht, ref[1], tol, "final_state")
    else:
        assert ht is None


@pytest.mark.parametrize("fn", [linac.chunk_simple_gla, linac.fused_recurrent_simple_gla])
@pytest.mark.parametrize("gated", [False, True])
def test_simple_gla(fn, gated):
    x = inputs(1, gate="head" if gated else None, init=True)
    t = to_torch(x)
    o, ht = fn(t["q"], t["k"], t["v"], t.get("g"), initial_state=t["initial_state"], output_final_state=True)
    check(o, ht, ref_linear_attn(x))


@pytest.mark.parametrize("fn", [linac.chunk_linear_attn, linac.fused_recurrent_linear_attn])
def test_linear_attn(fn):
    x = inputs(2, init=True)
    t = to_torch(x)
    o, ht = fn(t["q"], t["k"], t["v"], scale=0.3, initial_state=t["initial_state"], output_final_state=True,
               normalize=False)
    check(o, ht, ref_linear_attn(x, scale=0.3))


@pytest.mark.parametrize("fn", [linac.chunk_linear_attn, linac.fused_recurrent_linear_attn])
def test_linear_attn_normalized(fn):
    x = inputs(3)
    x["q"], x["k"] = np.abs(x["q"]), np.abs(x["k"])  # a positive feature map keeps the denominator away from 0
    t = to_torch(x)
    o, ht = fn(t["q"], t["k"], t["v"], normalize=True)
    assert ht is None
    assert_close(o, reference_poly.linear_attn_normalized(x["q"], x["k"], x["v"]))


def test_chunk_linear_attn_defaults_to_normalize():
    x = inputs(4)
    x["q"], x["k"] = np.abs(x["q"]), np.abs(x["k"])
    t = to_torch(x)
    o, _ = linac.chunk_linear_attn(t["q"], t["k"], t["v"])  # fla's default: normalize=True
    assert_close(o, reference_poly.linear_attn_normalized(x["q"], x["k"], x["v"]))


@pytest.mark.parametrize("recurrent", [False, True])
def test_gla(recurrent):
    x = inputs(5, gate="key", init=True, K=16, V=12)
    t = to_torch(x)
    if recurrent:
        o, ht = linac.fused_recurrent_gla(t["q"], t["k"], t["v"], gk=t["g"], initial_state=t["initial_state"],
                                          output_final_state=True)
    else:
        o, ht = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                                output_final_state=True)
    check(o, ht, ref_gla(x))


@pytest.mark.parametrize("recurrent", [False, True])
@pytest.mark.parametrize("l2norm", [False, True])
def test_delta_rule(recurrent, l2norm):
    x = inputs(6, beta=True, init=True, unit_keys=not l2norm)
    t = to_torch(x)
    fn = linac.fused_recurrent_delta_rule if recurrent else linac.chunk_delta_rule
    o, ht = fn(t["q"], t["k"], t["v"], t["beta"], initial_state=t["initial_state"], output_final_state=True,
               use_qk_l2norm_in_kernel=l2norm)
    check(o, ht, ref_delta(x, l2norm_qk=l2norm))


def test_fused_recurrent_delta_rule_beta_defaults_to_ones():
    x = inputs(7, unit_keys=True)
    t = to_torch(x)
    o, ht = linac.fused_recurrent_delta_rule(t["q"], t["k"], t["v"])
    x["beta"] = np.ones(x["q"].shape[:3], np.float32)
    check(o, ht, ref_delta(x), final=False)


@pytest.mark.parametrize("recurrent", [False, True])
@pytest.mark.parametrize("l2norm", [False, True])
def test_gated_delta_rule(recurrent, l2norm):
    x = inputs(8, gate="head", beta=True, init=True, unit_keys=not l2norm, V=12)
    t = to_torch(x)
    if recurrent:
        o, ht = linac.fused_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], beta=t["beta"],
                                                       initial_state=t["initial_state"], output_final_state=True,
                                                       use_qk_l2norm_in_kernel=l2norm)
    else:
        o, ht = linac.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"],
                                             initial_state=t["initial_state"], output_final_state=True,
                                             use_qk_l2norm_in_kernel=l2norm)
    check(o, ht, ref_delta(x, l2norm_qk=l2norm))


def test_fused_recurrent_gated_delta_rule_without_g_is_delta_rule():
    x = inputs(9, beta=True, unit_keys=True)
    t = to_torch(x)
    o, _ = linac.fused_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], beta=t["beta"])
    assert_close(o, ref_delta(x)[0])


@pytest.mark.parametrize("normalize", [True, False])
def test_poly(normalize):
    x = inputs(10, T=24)
    if normalize:
        x["q"], x["k"] = np.abs(x["q"]), np.abs(x["k"])
    t = to_torch(x)
    o = linac.poly(t["q"], t["k"], t["v"], a=1.0, b=0.5, c=0.25, normalize=normalize)
    assert_close(o, reference_poly.poly(x["q"], x["k"], x["v"], a=1.0, b=0.5, c=0.25, normalize=normalize))


def test_poly_varlen():
    x = inputs(11, B=1, T=30)
    x["q"], x["k"] = np.abs(x["q"]), np.abs(x["k"])
    t = to_torch(x)
    offsets = [0, 7, 30]
    cu_seqlens, cu_cpu = cu(offsets)
    o = linac.poly(t["q"], t["k"], t["v"], cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_cpu)
    assert_close(o, reference_poly.poly(x["q"], x["k"], x["v"], cu_seqlens=offsets))


# varlen: every family, initial and final states per sequence, with and without the host copy of cu_seqlens.
VARLEN = [0, 1, 19, 19, 45]  # an empty sequence, one of a single token


@pytest.mark.parametrize("host_copy", [False, True])
@pytest.mark.parametrize("family", ["simple_gla", "gla", "delta_rule", "gated_delta_rule"])
def test_varlen(family, host_copy):
    gate = {"simple_gla": "head", "gla": "key", "delta_rule": None, "gated_delta_rule": "head"}[family]
    delta = "delta" in family
    x = inputs(12, B=1, T=VARLEN[-1], gate=gate, beta=delta, init=True, N=len(VARLEN) - 1, unit_keys=True)
    t = to_torch(x)
    cu_seqlens, cu_cpu = cu(VARLEN)
    kw = dict(initial_state=t["initial_state"], output_final_state=True, cu_seqlens=cu_seqlens,
              cu_seqlens_cpu=cu_cpu if host_copy else None)
    if family == "simple_gla":
        o, ht = linac.chunk_simple_gla(t["q"], t["k"], t["v"], t["g"], **kw)
        ref = ref_linear_attn(x, VARLEN)
    elif family == "gla":
        o, ht = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"], **kw)
        ref = ref_gla(x, VARLEN)
    elif family == "delta_rule":
        o, ht = linac.chunk_delta_rule(t["q"], t["k"], t["v"], t["beta"], **kw)
        ref = ref_delta(x, VARLEN)
    else:
        o, ht = linac.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], **kw)
        ref = ref_delta(x, VARLEN)
    check(o, ht, ref)


def test_varlen_recurrent_int32_offsets():
    x = inputs(13, B=1, T=VARLEN[-1], gate="key", init=True, N=len(VARLEN) - 1)
    t = to_torch(x)
    cu_seqlens = torch.tensor(VARLEN, dtype=torch.int32, device=t["q"].device)
    o, ht = linac.fused_recurrent_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                                      output_final_state=True, cu_seqlens=cu_seqlens)
    check(o, ht, ref_gla(x, VARLEN))


def test_bf16():
    """bf16 q, k, v (gates fp32): o in bf16, within the op library's bf16 bound of the reference fed the
    same rounded inputs."""
    x = inputs(14, gate="key", init=True, T=40)
    t = {n: tensor(a, torch.bfloat16 if n in "qkv" else torch.float32) for n, a in x.items()}
    o, ht = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                            output_final_state=True)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    rounded = {n: numpy(v) for n, v in t.items()}
    ref = ref_gla(rounded)
    assert_close(o, ref[0], 2e-2, "o")
    assert_close(ht, ref[1], 2e-2, "final_state")


def test_bf16_gate_in_q_dtype():
    x = inputs(15, gate="head")
    t = {n: tensor(a, torch.bfloat16) for n, a in x.items()}
    o, _ = linac.chunk_simple_gla(t["q"], t["k"], t["v"], t["g"])
    assert o.dtype == torch.bfloat16
    assert_close(o, ref_linear_attn({n: numpy(v) for n, v in t.items()})[0], 2e-2)


def test_non_contiguous_inputs_are_copied():
    """Transposed views (a [B, H, T, D] layout seen as [B, T, H, D]) give the contiguous result."""
    x = inputs(16, gate="key", init=True)
    t = to_torch(x)
    views = {n: v.transpose(1, 2).contiguous().transpose(1, 2) if v.dim() == 4 and n != "initial_state" else v
             for n, v in t.items()}
    assert not views["q"].is_contiguous()
    o1, h1 = linac.chunk_gla(views["q"], views["k"], views["v"], views["g"], initial_state=t["initial_state"],
                             output_final_state=True)
    o2, h2 = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                             output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)


def test_state_v_first():
    x = inputs(17, gate="key", init=True, K=16, V=8)
    t = to_torch(x)
    h0_vk = t["initial_state"].transpose(-1, -2).contiguous()
    o, ht = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=h0_vk, output_final_state=True,
                            state_v_first=True)
    ref = ref_gla(x)
    assert ht.shape == (2, 2, 8, 16)
    assert_close(o, ref[0])
    assert_close(ht, np.swapaxes(ref[1], -1, -2))


def test_g_gamma():
    x = inputs(18)
    t = to_torch(x)
    gamma = torch.tensor([-0.1, -0.5], device=t["q"].device)
    o, _ = linac.chunk_simple_gla(t["q"], t["k"], t["v"], g_gamma=gamma)
    x["g"] = np.broadcast_to(numpy(gamma), x["q"].shape[:3])
    assert_close(o, ref_linear_attn(x)[0])


def test_final_state_only_when_asked():
    t = to_torch(inputs(19, gate="key"))
    o, ht = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"])
    assert ht is None and o.shape == (2, 37, 2, 8)


def test_chunk_size_option():
    x = inputs(20, gate="key")
    t = to_torch(x)
    o, _ = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"], chunk_size=16)
    assert_close(o, ref_gla(x)[0])


def test_initial_state_in_bf16_is_used_as_fp32():
    x = inputs(21, gate="head", init=True)
    t = to_torch(x)
    h0 = t["initial_state"].bfloat16()
    o, _ = linac.chunk_simple_gla(t["q"], t["k"], t["v"], t["g"], initial_state=h0)
    x["initial_state"] = numpy(h0)
    assert_close(o, ref_linear_attn(x)[0])
