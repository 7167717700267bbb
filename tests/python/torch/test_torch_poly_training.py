"""linac.poly in training. The training pair: with gradients needed, the forward also writes its
per-segment states (and, normalized, their normalizer and its denominator) and the backward takes them
with o instead of recomputing them; its gradients must be the recomputing backward's. Learned
coefficients: a, b, c as tensors get gradients, against torch autograd of a float64 pure-torch poly
(itself checked by torch.autograd.gradcheck). torch.compile(fullgraph=True) over a small model with
learned coefficients, against eager. Segments of 16 rows (the custom op's `config`), so that T = 40
spans three of them (four with varlen)."""

import numpy as np
import pytest

from torch_util import assert_close, cu, inputs, numpy, to_torch, torch

import linac
import linac._lib
import linac._ops


@pytest.fixture(params=["eager", "dispatcher"])
def path(request, monkeypatch):
    if request.param == "dispatcher":
        monkeypatch.setattr(linac._ops, "eager", lambda t: False)
    return request.param


@pytest.fixture
def backward_inputs(monkeypatch):
    """The input names of every poly backward that reaches linac (a list, filled as they run)."""
    seen = []
    run = linac._lib.run

    def spy(op, options, in_names, *rest):
        if op == b"poly" and b"backward=1" in options:
            seen.append(set(in_names))
        return run(op, options, in_names, *rest)

    monkeypatch.setattr(linac._lib, "run", spy)
    return seen


def poly64(q, k, v, a, b, c, normalize=True, offsets=None):
    """poly in float64 torch, literally: the T x T scores, f masked to s <= t within a sequence;
    differentiable in q, k, v and the coefficients (numbers or tensors)."""
    q, k, v = (x.double() for x in (q, k, v))
    T, K = q.shape[1], q.shape[3]
    x = K ** -0.5 * torch.einsum("bthk,bshk->bhts", q, k)
    pos = torch.arange(T, device=q.device)
    mask = pos[:, None] >= pos[None, :]
    if offsets is not None:
        seq = torch.bucketize(pos, torch.tensor(offsets[1:-1], device=q.device), right=True)
        mask = mask & (seq[:, None] == seq[None, :])
    f = (a + b * x + c * x * x) * mask
    num = torch.einsum("bhts,bshv->bthv", f, v)
    return num / (f.sum(-1).transpose(1, 2)[..., None] + 1e-6) if normalize else num


def sample(seed, varlen, T=40):
    x = inputs(seed, B=1 if varlen else 2, T=T, H=2, K=16, V=8)
    x = {n: 0.5 * a for n, a in x.items()}
    offsets = [0, 7, T] if varlen else None
    do = np.random.default_rng(seed + 1).standard_normal((1 if varlen else 2, T, 2, 8)).astype(np.float32)
    return x, offsets, do


def float64_like(a, like):
    """`a` as a float64 tensor on `like`'s device (the reference's do: LINAC_TEST_DEVICE=cuda runs there)."""
    return torch.as_tensor(a, device=like.device).double()


def grads(fn, x, do, coefficients=()):
    """fn(q, k, v) backpropagated with do: {name: grad} for q, k, v and the coefficient tensors."""
    t = {n: a.clone().requires_grad_() for n, a in to_torch(x).items()}
    o = fn(t["q"], t["k"], t["v"])
    o.backward(torch.as_tensor(do, device=o.device))
    out = {n: t[n].grad for n in "qkv"}
    for name, c in coefficients:
        out[name] = c.grad
    return out


@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "plain"])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_saved_equals_recompute(path, backward_inputs, normalize, varlen):
    """The backward given the forward's tables gives the recomputing backward's gradients, and both the
    float64 reference's."""
    x, offsets, do = sample(60, varlen)
    cu_t, cu_cpu = cu(offsets) if varlen else (None, None)

    def fn(save):
        return lambda q, k, v: linac._ops.call_poly(q, k, v, cu_t, cu_cpu, None, 16 ** -0.5, 1.0, 0.5, 0.25,
                                                    normalize, "chunk_size=16,segment=16", save)[0]

    saved = grads(fn(True), x, do)
    recomputed = grads(fn(False), x, do)
    wanted = {"saved_states", "saved_zstates", "saved_den", "o"} if normalize else {"saved_states"}
    assert backward_inputs[0] >= wanted and not backward_inputs[0] & ({"saved_zstates", "saved_den", "o"} - wanted)
    assert not backward_inputs[1] & wanted
    t = to_torch(x, grad=True)
    poly64(t["q"], t["k"], t["v"], 1.0, 0.5, 0.25, normalize, offsets).backward(float64_like(do, t["q"]))
    for n in "qkv":
        assert_close(saved[n], numpy(recomputed[n]), 1e-6, f"d{n} saved against recomputed")
        assert_close(saved[n], numpy(t[n].grad), 1e-4, f"d{n} against the float64 reference")


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_public_function_saves(backward_inputs, varlen):
    """linac.poly saves when a gradient is needed (its default segments: one at this T), and not without."""
    x, offsets, do = sample(61, varlen)
    cu_t, cu_cpu = cu(offsets) if varlen else (None, None)
    got = grads(lambda q, k, v: linac.poly(q, k, v, cu_seqlens=cu_t, cu_seqlens_cpu=cu_cpu), x, do)
    assert len(backward_inputs) == 1 and {"saved_states", "saved_zstates", "saved_den", "o"} <= backward_inputs[0]
    t = to_torch(x, grad=True)
    poly64(t["q"], t["k"], t["v"], 1.0, 1.0, 0.5, True, offsets).backward(float64_like(do, t["q"]))
    for n in "qkv":
        assert_close(got[n], numpy(t[n].grad), 1e-4, f"d{n}")


def test_reference_gradcheck():
    """poly64's autograd in a, b, c against its finite differences (the reference of the tests below)."""
    x, offsets, _ = sample(62, True, T=12)
    t = to_torch(x)
    coef = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (1.0, 0.5, 0.25)]
    for normalize in (True, False):
        assert torch.autograd.gradcheck(lambda a, b, c: poly64(t["q"], t["k"], t["v"], a, b, c, normalize, offsets),
                                        coef)


@pytest.mark.parametrize("normalize", [True, False], ids=["normalized", "plain"])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_learned_coefficients(path, backward_inputs, normalize, varlen):
    """a 0-dim float32, b [1] float64 (learned), c a 1x1 float32 tensor that needs no gradient: each
    learned one gets its gradient in its own shape and dtype; q, k, v's gradients are unchanged."""
    x, offsets, do = sample(63, varlen)
    cu_t, cu_cpu = cu(offsets) if varlen else (None, None)
    dev = to_torch(x)["q"].device
    a = torch.tensor(1.0, device=dev, requires_grad=True)
    b = torch.tensor([0.5], dtype=torch.float64, device=dev, requires_grad=True)
    c = torch.tensor([[0.25]], device=dev)
    got = grads(lambda q, k, v: linac.poly(q, k, v, a=a, b=b, c=c, normalize=normalize, cu_seqlens=cu_t,
                                           cu_seqlens_cpu=cu_cpu), x, do, [("a", a), ("b", b), ("c", c)])
    assert got["a"].shape == () and got["a"].dtype == torch.float32
    assert got["b"].shape == (1,) and got["b"].dtype == torch.float64
    assert got["c"] is None
    assert "saved_states" in backward_inputs[0]
    t = to_torch(x, grad=True)
    coef = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (1.0, 0.5, 0.25)]
    poly64(t["q"], t["k"], t["v"], *coef, normalize, offsets).backward(float64_like(do, t["q"]))
    for n in "qkv":
        assert_close(got[n], numpy(t[n].grad), 1e-4, f"d{n}")
    assert_close(got["a"], numpy(coef[0].grad), 1e-4, "da")
    assert_close(got["b"], numpy(coef[1].grad), 1e-4, "db")


def test_learned_coefficients_all_three(path):
    """All three learned (and the custom op's segments of 16 rows): da, db, dc against the reference."""
    x, _, do = sample(64, False)
    dev = to_torch(x)["q"].device
    coef = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64, device=dev, requires_grad=True)
    got = grads(lambda q, k, v: linac._ops.call_poly(q, k, v, None, None, coef, 16 ** -0.5, 0.0, 0.0, 0.0, True,
                                                     "segment=16", True)[0], x, do, [("coef", coef)])
    t = to_torch(x, grad=True)
    ref = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (1.0, 0.5, 0.25)]
    poly64(t["q"], t["k"], t["v"], *ref).backward(float64_like(do, t["q"]))
    assert_close(got["coef"], [r.grad.item() for r in ref], 1e-4, "da, db, dc")


def test_learned_c_of_zero():
    """A learned c of 0 (with b = 0: a positive f) runs the degree-2 blocks at c ~ 0 (the saved tables'
    shapes may not depend on a value): the output of c = 0 given as a number, and dc = sum g x^2."""
    x, _, do = sample(65, False, T=20)
    t = to_torch(x)
    c = torch.tensor(0.0, device=t["q"].device, requires_grad=True)
    got = grads(lambda q, k, v: linac.poly(q, k, v, a=1.0, b=0.0, c=c), x, do, [("c", c)])
    with torch.no_grad():
        assert_close(linac.poly(t["q"], t["k"], t["v"], a=1.0, b=0.0, c=c),
                     numpy(linac.poly(t["q"], t["k"], t["v"], a=1.0, b=0.0, c=0.0)), 1e-6)
    tt = to_torch(x, grad=True)
    ref = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    poly64(tt["q"], tt["k"], tt["v"], 1.0, 0.0, ref).backward(float64_like(do, tt["q"]))
    assert_close(got["c"], ref.grad.item(), 1e-4, "dc")
    for n in "qkv":
        assert_close(got[n], numpy(tt[n].grad), 1e-4, f"d{n}")


def test_coefficient_errors():
    """A learned f that is not positive (normalized) raises linac's message as InvalidCallError, in the
    forward; so do coefficient tensors of more than one element or of an integer dtype."""
    t = to_torch(inputs(66, T=8))
    q, k, v = t["q"], t["k"], t["v"]
    bad = torch.tensor(-0.5, requires_grad=True)
    with pytest.raises(linac.InvalidCallError, match="not positive"):
        linac.poly(q, k, v, c=bad)
    with pytest.raises(linac.InvalidCallError, match="not positive"):
        linac.poly(q, k, v, b=torch.tensor(3.0))  # b^2 >= 4ac
    linac.poly(q, k, v, c=bad, normalize=False).sum().backward()  # no denominator: any f
    assert bad.grad is not None
    with pytest.raises(linac.InvalidCallError, match="one element"):
        linac.poly(q, k, v, a=torch.ones(2))
    with pytest.raises(linac.InvalidCallError, match="float tensor"):
        linac.poly(q, k, v, a=torch.tensor(1))


class PolyMixer(torch.nn.Module):
    """Projections, linac.poly with learned coefficients, an output projection."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.proj = torch.nn.Linear(d, 3 * d, bias=False)
        self.out = torch.nn.Linear(d, d, bias=False)
        self.a = torch.nn.Parameter(torch.tensor(1.0))
        self.b = torch.nn.Parameter(torch.tensor(0.5))
        self.c = torch.nn.Parameter(torch.tensor([0.25]))

    def forward(self, x, cu_seqlens=None):
        B, T, _ = x.shape
        q, k, v = self.proj(x).view(B, T, 3, self.h, self.dk).unbind(2)
        o = linac.poly(q, k, v, a=self.a, b=self.b, c=self.c, cu_seqlens=cu_seqlens)
        return self.out(o.reshape(B, T, -1))


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_compile_fullgraph_learned_coefficients(varlen):
    """torch.compile(fullgraph=True) traces poly with learned coefficients and the saved tables (varlen:
    their length an unbacked size), forward and backward, and gives eager's output and gradients."""
    torch.manual_seed(1)
    model = PolyMixer().to(to_torch(inputs(0, T=1))["q"].device)
    dev = next(model.parameters()).device
    x = torch.randn(1 if varlen else 2, 24, 16, device=dev)
    cu_t = cu([0, 5, 24])[0] if varlen else None

    def step(m):
        for p in m.parameters():
            p.grad = None
        y = m(x, cu_t)
        y.square().mean().backward()
        return y.detach(), [p.grad.clone() for p in m.parameters()]

    y_ref, g_ref = step(model)
    assert all(g is not None for g in g_ref[-3:])
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager" if dev.type == "cpu" else "inductor")
    y, got = step(compiled)
    assert_close(y, numpy(y_ref), 1e-5, "compiled output")
    for name, g, r in zip(["proj", "out", "a", "b", "c"], got, g_ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert_close(g, numpy(r), 1e-4, f"compiled gradient of {name}")


def test_pairwise_backward():
    """fp32 at K > 64 the backward takes the pairwise form: it ignores the saved tables (q, k, v's
    gradients still right) and has no coefficient gradients, which raises InvalidCallError, not a crash."""
    x = inputs(67, B=1, T=8, H=1, K=72, V=8)
    x["q"], x["k"] = 0.3 * x["q"], 0.3 * x["k"]
    do = np.random.default_rng(68).standard_normal((1, 8, 1, 8)).astype(np.float32)
    got = grads(lambda q, k, v: linac.poly(q, k, v), x, do)
    t = to_torch(x, grad=True)
    poly64(t["q"], t["k"], t["v"], 1.0, 1.0, 0.5).backward(float64_like(do, t["q"]))
    for n in "qkv":
        assert_close(got[n], numpy(t[n].grad), 1e-4, f"d{n}")
    c = torch.tensor(0.5, requires_grad=True)
    with pytest.raises(linac.InvalidCallError, match="computes no da, db, dc"):
        grads(lambda q, k, v: linac.poly(q, k, v, c=c), x, do)
