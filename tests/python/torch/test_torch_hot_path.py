"""The eager hot path (linac._api's call signatures): the checks run once per signature, and a call that
needs no gradient goes straight to its prepared linac_call. A remembered signature must never let a bad
call through, and the direct calls must give what the general path (autograd, dispatcher) gives."""

import threading

import pytest

from conftest import DEVICE
from torch_util import inputs, to_torch, torch

import linac
import linac._api as api
import linac._lib as lib


@pytest.fixture
def t():
    return to_torch(inputs(70, T=16, gate="key", beta=True, init=True, unit_keys=True))


def other_device():
    return "cpu" if DEVICE == "cuda" else "meta"


# (what changes after a good call, the error it must raise): each a new signature with the good one's
# shapes where it can, so that only the changed dtype, shape or device tells them apart.
BAD = {
    "k dtype": (lambda x: dict(x, k=x["k"].bfloat16()), linac.InvalidCallError, "one dtype"),
    "q, k, v float64": (lambda x: dict(x, q=x["q"].double(), k=x["k"].double(), v=x["v"].double()),
                        linac.InvalidCallError, "float32, float16 or bfloat16"),
    "g dtype": (lambda x: dict(x, g=x["g"].double()), linac.InvalidCallError, "g must be float32 or q's dtype"),
    "k device": (lambda x: dict(x, k=x["k"].to(other_device())), linac.InvalidCallError, "one device"),
    "g device": (lambda x: dict(x, g=x["g"].to(other_device())), linac.InvalidCallError, "every tensor must be on"),
    "k shape": (lambda x: dict(x, k=x["k"][:, :8]), linac.InvalidCallError, "k must have q's shape"),
    "g shape": (lambda x: dict(x, g=x["g"][..., :3]), linac.InvalidCallError, "g must have shape"),
    "initial_state shape": (lambda x: dict(x, initial_state=x["initial_state"][:1]), linac.InvalidCallError,
                            r"initial_state must be \[N, H, K, V\]"),
}


def gla(x):
    return linac.chunk_gla(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"],
                           output_final_state=True)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("change", list(BAD))
def test_bad_call_after_good_call_raises(t, change, grad):
    """A good call (its signature remembered, its direct call made), then one with a new, bad signature:
    the same error as on a first call, every time; the good signature still runs."""
    make_bad, exc, match = BAD[change]
    x = dict(t, q=t["q"].requires_grad_(grad))
    with torch.set_grad_enabled(grad):
        o, _ = gla(x)
        for _ in range(2):
            with pytest.raises(exc, match=match):
                gla(make_bad(x))
            again, _ = gla(x)
            assert torch.equal(again, o)


def test_bad_delta_rule_call_after_good_call_raises(t):
    x = dict(t, g=t["g"][..., 0].contiguous())
    linac.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])
    for _ in range(2):
        with pytest.raises(linac.InvalidCallError, match="beta must have shape"):
            linac.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"][:, :4])
        with pytest.raises(linac.InvalidCallError, match="beta must be float32 or q's dtype"):
            linac.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"].double())
        with pytest.raises(linac.UnsupportedError, match="beta per value channel"):
            linac.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["v"].clone())


def test_option_errors_after_good_call(t):
    """Options are part of a signature: normalized linear attention refuses states after a good call."""
    linac.chunk_linear_attn(t["q"], t["k"], t["v"])
    for _ in range(2):
        with pytest.raises(linac.UnsupportedError, match="keeps no state"):
            linac.chunk_linear_attn(t["q"], t["k"], t["v"], output_final_state=True)


def test_c_abi_error_every_time(t):
    """An error that only linac's C side finds (a chunk size it refuses) is raised on every call: a call
    that failed to prepare leaves nothing behind."""
    for _ in range(2):
        with pytest.raises(linac.InvalidCallError, match="chunk"):
            linac.chunk_gla(t["q"], t["k"], t["v"], t["g"], chunk_size=24)


def test_non_contiguous_after_good_call(t):
    """A non-contiguous input with a remembered signature's shapes is copied (docs/python.md), and gives
    the contiguous input's result."""
    o, ht = gla(t)
    q = t["q"].transpose(1, 2).contiguous().transpose(1, 2)  # same shape and values, other strides
    assert not q.is_contiguous()
    for _ in range(2):
        o2, ht2 = gla(dict(t, q=q))
        assert torch.equal(o2, o) and torch.equal(ht2, ht)


CALLS = {
    "chunk_simple_gla": lambda x, **kw: linac.chunk_simple_gla(x["q"], x["k"], x["v"], x["g"][..., 0], **kw),
    "chunk_linear_attn": lambda x, **kw: linac.chunk_linear_attn(x["q"], x["k"], x["v"]),
    "chunk_gla": lambda x, **kw: linac.chunk_gla(x["q"], x["k"], x["v"], x["g"], **kw),
    "fused_recurrent_gla": lambda x, **kw: linac.fused_recurrent_gla(x["q"], x["k"], x["v"], x["g"], **kw),
    "chunk_delta_rule": lambda x, **kw: linac.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], **kw),
    "chunk_gated_delta_rule": lambda x, **kw: linac.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"][..., 0],
                                                                           x["beta"], **kw),
    "poly": lambda x, **kw: (linac.poly(x["q"], x["k"], x["v"]), None),
}


@pytest.mark.parametrize("states", [False, True], ids=["plain", "states"])
@pytest.mark.parametrize("name", list(CALLS))
def test_direct_equals_general_path(t, name, states):
    """The direct call (no gradient needed) and the autograd path give the same bytes."""
    call = CALLS[name]
    kw = dict(initial_state=t["initial_state"], output_final_state=True) if states else {}
    if states and name in ("chunk_linear_attn", "poly"):
        pytest.skip("the op keeps no state")
    x = {n: a.contiguous() for n, a in t.items()}
    x["g"] = x["g"].clamp(max=-0.01)
    with torch.no_grad():
        direct = [call(x, **kw) for _ in range(2)]
    xg = {n: a.clone().requires_grad_(n in "qkv") for n, a in x.items()}
    general = call(xg, **({**kw, "initial_state": xg["initial_state"]} if states else {}))
    for d in direct:
        assert torch.equal(d[0], general[0].detach())
        if states:
            assert torch.equal(d[1], general[1].detach())


def direct_of(op):
    for entry in list(api._signatures.values()):
        if entry.direct and entry.direct.prepared.op == op:
            return entry.direct
    raise AssertionError(f"no direct call of {op}")


def test_direct_call_cuda_branch(t, monkeypatch):
    """The CUDA branch of a prepared call's run, on the host: the current stream and a scratch tensor
    reach linac_call_run, with the inputs' then the outputs' addresses."""
    if DEVICE != "cpu":
        pytest.skip("fakes the CUDA stream on host tensors")
    lib.forget_prepared_calls()  # this call's direct call the only one
    with torch.no_grad():
        linac.chunk_gla(t["q"], t["k"], t["v"], t["g"])
    d = direct_of(b"gla")
    seen = []

    def fake_run(handle, addresses, stream, scratch, allocator):
        seen.append((handle, list(addresses), stream, scratch, allocator))
        return 0

    monkeypatch.setattr(d, "dev", 0)
    monkeypatch.setattr(lib, "_current_device", lambda: 0)
    monkeypatch.setattr(lib, "_current_stream", lambda dev: 0x5000 + dev)
    monkeypatch.setattr(d.prepared, "workspace", 256)
    monkeypatch.setattr(d.prepared, "fn", fake_run)
    with torch.no_grad():
        o, _ = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"])
    (handle, addresses, stream, scratch, allocator), = seen
    assert handle == d.prepared.handle and stream == 0x5000 and allocator is None and scratch
    assert addresses == [t[n].data_ptr() for n in "qkvg"] + [o.data_ptr()]


def test_threads_share_a_prepared_call():
    """Threads running one signature at once each get their own results (each run fills its own array
    of addresses)."""
    xs = [to_torch(inputs(80 + i, T=16, gate="key")) for i in range(4)]
    with torch.no_grad():
        want = [linac.chunk_gla(x["q"], x["k"], x["v"], x["g"])[0] for x in xs]
    got = [None] * len(xs)
    errors = []

    def work(i):
        try:
            with torch.no_grad():
                for _ in range(5):
                    o = linac.chunk_gla(xs[i]["q"], xs[i]["k"], xs[i]["v"], xs[i]["g"])[0]
                    assert torch.equal(o, want[i])
            got[i] = o
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert all(g is not None for g in got)


def test_forget_prepared_calls_forgets_signatures(t):
    with torch.no_grad():
        o, _ = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"])
        lib.forget_prepared_calls()
        assert not api._signatures
        o2, _ = linac.chunk_gla(t["q"], t["k"], t["v"], t["g"])
    assert torch.equal(o, o2)
