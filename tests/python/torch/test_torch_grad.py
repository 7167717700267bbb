"""Gradients of every Python op (linac's backward kernels through autograd) for every differentiable
input, initial state included: linear attention against reference_bwd's hand-derived gradients, the
others by directional finite differences of the float64 forward references (gradcheck.py). Each test
runs once through the eager fast path and once through torch.ops.linac.* (the dispatcher's autograd)."""

import numpy as np
import pytest

from conftest import DEVICE
from torch_util import assert_close, cu, inputs, numpy, to_torch, torch

import gradcheck
import linac
import linac._ops
import reference
import reference_bwd
import reference_delta
import reference_gla
import reference_poly


@pytest.fixture(params=["eager", "dispatcher"])
def path(request, monkeypatch):
    if request.param == "dispatcher":
        monkeypatch.setattr(linac._ops, "eager", lambda t: False)
    return request.param


def run_grads(fn, x, diff, seed=0, final=True):
    """Runs fn(torch inputs) -> (o, final_state or None) and backpropagates random do (and dfinal);
    returns ({name: grad numpy}, do, dfinal)."""
    t = {n: v.clone().requires_grad_(n in diff) for n, v in to_torch(x).items()}
    o, ht = fn(t)
    rng = np.random.default_rng(seed)
    do = rng.standard_normal(o.shape).astype(np.float32)
    outs, grads = [o], [torch.as_tensor(do, device=o.device)]
    dfinal = None
    if final:
        dfinal = rng.standard_normal(ht.shape).astype(np.float32)
        outs.append(ht)
        grads.append(torch.as_tensor(dfinal, device=o.device))
    torch.autograd.backward(outs, grads)
    for n in diff:
        assert t[n].grad is not None, f"no gradient for {n}"
        assert t[n].grad.dtype == t[n].dtype and t[n].grad.shape == t[n].shape
    return {n: numpy(t[n].grad) for n in diff}, do, dfinal


def fd_check(got, x, do, dfinal, forward):
    """Directional finite differences of L = sum(o do) + sum(S_T dfinal) with `forward(x64) -> (o, S)`."""
    def loss(xx):
        o, s = forward(xx)
        total = np.sum(o * do)
        if dfinal is not None:
            total += np.sum(s * dfinal)
        return total
    gradcheck.check_directional(got, x, loss, tol=2e-5)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_simple_gla(path, gated, varlen):
    offsets = [0, 9, 30] if varlen else None
    x = inputs(30, B=1 if varlen else 2, T=30, gate="head" if gated else None, init=True,
               N=2 if varlen else None)
    cu_t = cu(offsets)[0] if varlen else None
    diff = [n for n in ("q", "k", "v", "g", "initial_state") if n in x]
    got, do, dfinal = run_grads(lambda t: linac.chunk_simple_gla(t["q"], t["k"], t["v"], t.get("g"),
                                                                 initial_state=t["initial_state"],
                                                                 output_final_state=True, cu_seqlens=cu_t), x, diff)
    ref = reference_bwd.linear_attn_bwd(x["q"], x["k"], x["v"], do, g=x.get("g"), initial_state=x["initial_state"],
                                        dfinal_state=dfinal, cu_seqlens=offsets)
    for n in diff:
        assert_close(got[n], ref["d" + n], 1e-5, "d" + n)


def test_linear_attn_normalized(path):
    x = inputs(31, T=25)
    x["q"], x["k"] = np.abs(x["q"]) + 0.1, np.abs(x["k"]) + 0.1
    got, do, _ = run_grads(lambda t: linac.chunk_linear_attn(t["q"], t["k"], t["v"]), x, ["q", "k", "v"],
                           final=False)
    fd_check(got, x, do, None, lambda xx: (reference_poly.linear_attn_normalized(xx["q"], xx["k"], xx["v"]), 0))


@pytest.mark.parametrize("recurrent", [False, True])
def test_gla(path, recurrent):
    x = inputs(32, T=33, gate="key", init=True, V=12)
    fn = linac.fused_recurrent_gla if recurrent else linac.chunk_gla
    got, do, dfinal = run_grads(lambda t: fn(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                                             output_final_state=True), x, ["q", "k", "v", "g", "initial_state"])
    fd_check(got, x, do, dfinal, lambda xx: reference_gla.gla(xx["q"], xx["k"], xx["v"], xx["g"],
                                                              initial_state=xx["initial_state"]))


def test_gla_varlen(path):
    offsets = [0, 5, 5, 28]
    x = inputs(33, B=1, T=28, gate="key", init=True, N=3)
    cu_t, cu_cpu = cu(offsets)
    got, do, dfinal = run_grads(lambda t: linac.chunk_gla(t["q"], t["k"], t["v"], t["g"],
                                                          initial_state=t["initial_state"], output_final_state=True,
                                                          cu_seqlens=cu_t, cu_seqlens_cpu=cu_cpu),
                                x, ["q", "k", "v", "g", "initial_state"])
    fd_check(got, x, do, dfinal, lambda xx: reference_gla.gla(xx["q"], xx["k"], xx["v"], xx["g"],
                                                              initial_state=xx["initial_state"], cu_seqlens=offsets))


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("l2norm", [False, True])
def test_delta_rules(path, gated, l2norm):
    x = inputs(34, T=30, gate="head" if gated else None, beta=True, init=True, unit_keys=not l2norm)
    diff = [n for n in ("q", "k", "v", "g", "beta", "initial_state") if n in x]

    def fn(t):
        kw = dict(initial_state=t["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
        if gated:
            return linac.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], **kw)
        return linac.chunk_delta_rule(t["q"], t["k"], t["v"], t["beta"], **kw)

    got, do, dfinal = run_grads(fn, x, diff)
    fd_check(got, x, do, dfinal, lambda xx: reference_delta.delta_rule(
        xx["q"], xx["k"], xx["v"], xx["beta"], g=xx.get("g"), initial_state=xx["initial_state"], l2norm_qk=l2norm))


def test_delta_rule_recurrent_varlen(path):
    offsets = [0, 11, 26]
    x = inputs(35, B=1, T=26, gate="head", beta=True, init=True, N=2, unit_keys=True)
    cu_t = cu(offsets)[0]
    got, do, dfinal = run_grads(lambda t: linac.fused_recurrent_gated_delta_rule(
        t["q"], t["k"], t["v"], t["g"], beta=t["beta"], initial_state=t["initial_state"], output_final_state=True,
        cu_seqlens=cu_t), x, ["q", "k", "v", "g", "beta", "initial_state"])
    fd_check(got, x, do, dfinal, lambda xx: reference_delta.delta_rule(
        xx["q"], xx["k"], xx["v"], xx["beta"], g=xx["g"], initial_state=xx["initial_state"], cu_seqlens=offsets))


def test_poly(path):
    x = inputs(36, T=20)
    got, do, _ = run_grads(lambda t: (linac.poly(t["q"], t["k"], t["v"], normalize=False), None), x,
                           ["q", "k", "v"], final=False)
    fd_check(got, x, do, None, lambda xx: (reference_poly.poly(xx["q"], xx["k"], xx["v"], normalize=False), 0))


def test_only_final_state_used(path):
    """Gradients flow from final_state alone (o unused: its gradient is not materialized)."""
    x = inputs(37, gate="key", init=True)
    t = {n: v.clone().requires_grad_() for n, v in to_torch(x).items()}
    _, ht = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                            output_final_state=True)
    ht.sum().backward()
    dfinal = np.ones(ht.shape, np.float32)
    got = {n: numpy(v.grad) for n, v in t.items()}
    fd_check(got, x, np.zeros((2, 37, 2, 8), np.float32), dfinal, lambda xx: reference_gla.gla(
        xx["q"], xx["k"], xx["v"], xx["g"], initial_state=xx["initial_state"]))


def test_bf16_gradients_have_input_dtypes(path):
    x = inputs(38, gate="head", beta=True, unit_keys=True)
    t = {n: torch.as_tensor(a).to(torch.bfloat16 if n in "qkv" else torch.float32).to(DEVICE)
         .requires_grad_() for n, a in x.items()}
    o, _ = linac.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"])
    o.float().sum().backward()
    for n, v in t.items():
        assert v.grad.dtype == v.dtype, n


def test_backward_saves_only_inputs():
    """The autograd graph keeps the inputs (O(T*D)), nothing per chunk: every saved tensor is an input."""
    x = inputs(39, gate="key", init=True)
    t = {n: v.clone().requires_grad_() for n, v in to_torch(x).items()}
    o, _ = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"])
    saved = [s for s in o.grad_fn.saved_tensors if s is not None]
    ids = {v.data_ptr() for v in t.values()}
    assert saved and all(s.data_ptr() in ids for s in saved)
