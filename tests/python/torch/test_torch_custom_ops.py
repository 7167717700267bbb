"""torch.ops.linac.*: torch.library.opcheck on every forward and backward op, fake shapes and dtypes
against what the C ABI says (linac_op_output_shape), and torch.compile(fullgraph=True) over a small model
(forward and backward), against eager."""

import pytest

from conftest import DEVICE
from torch_util import assert_close, cu, inputs, numpy, to_torch, torch

import linac
import linac._ops as ops


def sample(seed=50, varlen=False, init=True, grad=False):
    x = inputs(seed, B=1 if varlen else 2, T=21, gate="key", beta=True, init=init, N=2 if varlen else None,
               unit_keys=True)
    t = to_torch(x, grad=grad)
    t["gh"] = t["g"][..., 0].detach().clone().requires_grad_(grad)
    t["cu"], t["cu_cpu"] = cu([0, 8, 21]) if varlen else (None, None)
    t["do"] = torch.randn_like(t["v"])
    t["dht"] = torch.randn_like(t["initial_state"])
    # poly's learned coefficients (a, b, c) as the public function stacks them
    t["coef"] = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64, device=t["q"].device, requires_grad=grad)
    return t


def forward_cases(t):
    q, k, v, g, gh, beta, h0, c, cc = (t[n] for n in ("q", "k", "v", "g", "gh", "beta", "initial_state", "cu",
                                                      "cu_cpu"))
    s = q.shape[-1] ** -0.5
    return [
        ("linear_attn", ops.linear_attn, (q, k, v, gh, h0, c, cc, s, True, False, False, "")),
        ("linear_attn normalize", ops.linear_attn, (q, k, v, None, None, c, cc, s, False, True, False, "")),
        ("linear_attn recurrent", ops.linear_attn, (q, k, v, None, h0, c, cc, s, True, False, True, "")),
        ("gla", ops.gla, (q, k, v, g, h0, c, cc, s, True, False, "")),
        ("delta_rule", ops.delta_rule, (q, k, v, beta, h0, c, cc, s, True, False, False, "", False)),
        ("delta_rule l2norm", ops.delta_rule, (q, k, v, beta, None, c, cc, s, False, True, False, "", False)),
        ("gated_delta_rule", ops.gated_delta_rule, (q, k, v, gh, beta, h0, c, cc, s, True, False, False, "", False)),
        # The training pair: the forward saves the backward's tables (dense inputs only).
        # (varlen samples hold one packed row: B = 1, no initial state of N = 2 then.)
        ("delta_rule saving", ops.delta_rule,
         (q, k, v, beta, h0 if c is None else None, None, None, s, True, False, False, "", True)),
        ("gated_delta_rule saving", ops.gated_delta_rule,
         (q, k, v, gh, beta, h0 if c is None else None, None, None, s, True, False, False, "", True)),
        ("poly", ops.poly, (q, k, v, c, cc, None, s, 1.0, 1.0, 0.5, False, "", False)),
        # poly's training pair (segments of 16 rows: two per sequence at T = 21), and learned coefficients.
        ("poly saving", ops.poly, (q, k, v, c, cc, None, s, 1.0, 1.0, 0.5, True, "segment=16", True)),
        ("poly saving plain", ops.poly, (q, k, v, c, cc, None, s, 1.0, 1.0, 0.5, False, "segment=16", True)),
        ("poly coefficients", ops.poly, (q, k, v, c, cc, t["coef"], s, 0.0, 0.0, 0.0, True, "segment=16", True)),
    ]


def backward_cases(t):
    q, k, v, g, gh, beta, h0, c, cc, do, dht = (t[n] for n in ("q", "k", "v", "g", "gh", "beta", "initial_state",
                                                               "cu", "cu_cpu", "do", "dht"))
    s = q.shape[-1] ** -0.5
    return [
        ("linear_attn_bwd", ops.linear_attn_bwd, (q, k, v, gh, h0, c, cc, do, dht, s, False)),
        ("linear_attn_bwd plain", ops.linear_attn_bwd, (q, k, v, None, None, c, cc, do, None, s, False)),
        ("gla_bwd", ops.gla_bwd, (q, k, v, g, h0, c, cc, do, dht, s)),
        ("delta_rule_bwd", ops.delta_rule_bwd, (q, k, v, beta, h0, c, cc, do, dht, s, False, None, None, None, None)),
        ("delta_rule_bwd_l2norm", ops.delta_rule_bwd,
         (q, k, v, beta, h0, c, cc, do, dht, s, True, None, None, None, None)),
        ("gated_delta_rule_bwd", ops.gated_delta_rule_bwd,
         (q, k, v, gh, beta, h0, c, cc, do, None, s, False, None, None, None, None)),
        ("poly_bwd", ops.poly_bwd, (q, k, v, c, cc, do, None, None, None, None, None, s, 1.0, 1.0, 0.5, True, "",
                                    False)),
        ("poly_bwd saved", ops.poly_bwd, (q, k, v, c, cc, do, *poly_saved(t, True), None, s, 1.0, 1.0, 0.5, True,
                                          "segment=16", False)),
        ("poly_bwd saved plain", ops.poly_bwd, (q, k, v, c, cc, do, *poly_saved(t, False), None, s, 1.0, 1.0, 0.5,
                                                False, "segment=16", False)),
        ("poly_bwd coefficients", ops.poly_bwd, (q, k, v, c, cc, do, None, None, None, None, t["coef"].detach(), s,
                                                 0.0, 0.0, 0.0, True, "", True)),
    ]


def poly_saved(t, normalize):
    """o and the saved tables of a poly forward at segments of 16 rows (None where the form saves none)."""
    q, k, v, c, cc = (t[n].detach() if t[n] is not None else None for n in ("q", "k", "v", "cu", "cu_cpu"))
    o, states, zstates, den, _ = ops.poly(q, k, v, c, cc, None, q.shape[-1] ** -0.5, 1.0, 1.0, 0.5, normalize,
                                          "segment=16", True)
    return (o, states, zstates, den) if normalize else (None, states, None, None)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("case", range(13))
def test_opcheck_forward(case, varlen):
    name, op, args = forward_cases(sample(varlen=varlen, grad=True))[case]
    torch.library.opcheck(op, args)


def test_case_counts():
    """The parametrized ranges above and below cover every case."""
    assert len(forward_cases(sample())) == 13 and len(backward_cases(sample())) == 10


@pytest.mark.parametrize("case", range(10))
def test_opcheck_backward(case):
    name, op, args = backward_cases(sample())[case]
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("case", range(6, 10))
def test_opcheck_poly_backward_varlen(case):
    """poly_bwd on packed sequences, the saved tables' segments counted per sequence."""
    name, op, args = backward_cases(sample(varlen=True))[case]
    assert name.startswith("poly_bwd")
    torch.library.opcheck(op, args)


# Fake (meta) outputs against linac_op_output_shape: op name, options, inputs, outputs.
def abi_cases(t):
    q, k, v, g, gh, beta, h0, do, dht = (t[n] for n in ("q", "k", "v", "g", "gh", "beta", "initial_state", "do",
                                                        "dht"))
    return [
        ("linear_attn", "", dict(q=q, k=k, v=v, g=gh, initial_state=h0), ["o", "final_state"]),
        ("gla", "", dict(q=q, k=k, v=v, g=g, initial_state=h0), ["o", "final_state"]),
        ("delta_rule", "", dict(q=q, k=k, v=v, beta=beta, initial_state=h0), ["o", "final_state"]),
        ("gated_delta_rule", "", dict(q=q, k=k, v=v, g=gh, beta=beta), ["o", "final_state"]),
        ("poly", "segment=16", dict(q=q, k=k, v=v), ["o", "saved_states", "saved_zstates", "saved_den"]),
        ("linear_attn", "backward=1", dict(q=q, k=k, v=v, g=gh, initial_state=h0, do=do, dfinal_state=dht),
         ["dq", "dk", "dv", "dg", "dinitial_state"]),
        ("gla", "backward=1", dict(q=q, k=k, v=v, g=g, initial_state=h0, do=do),
         ["dq", "dk", "dv", "dg", "dinitial_state"]),
        ("gated_delta_rule", "backward=1", dict(q=q, k=k, v=v, g=gh, beta=beta, initial_state=h0, do=do),
         ["dq", "dk", "dv", "dg", "dbeta", "dinitial_state"]),
        ("poly", "backward=1", dict(q=q, k=k, v=v, do=do), ["dq", "dk", "dv", "da", "db", "dc"]),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_outputs_match_c_abi(dtype):
    from torch._subclasses.fake_tensor import FakeTensorMode
    t = sample()
    for n in ("q", "k", "v", "do"):
        t[n] = t[n].to(dtype)
    for op, options, ins, outs in abi_cases(t):
        bwd = options == "backward=1"
        s = 0.25
        mode = FakeTensorMode()
        fake_ins = {n: mode.from_tensor(v) for n, v in dict(ins, coef=t["coef"]).items()}
        with mode:
            f = fake_ins
            if not bwd:
                if op == "linear_attn":
                    res = ops.linear_attn(f["q"], f["k"], f["v"], f["g"], f["initial_state"], None, None, s, True,
                                          False, False, "")
                elif op == "gla":
                    res = ops.gla(f["q"], f["k"], f["v"], f["g"], f["initial_state"], None, None, s, True, False, "")
                elif op == "delta_rule":
                    res = ops.delta_rule(f["q"], f["k"], f["v"], f["beta"], f["initial_state"], None, None, s, True,
                                         False, False, "", False)
                elif op == "gated_delta_rule":
                    res = ops.gated_delta_rule(f["q"], f["k"], f["v"], f["g"], f["beta"], None, None, None, s, True,
                                               False, False, "", False)
                else:
                    res = ops.poly(f["q"], f["k"], f["v"], None, None, None, s, 1.0, 1.0, 0.5, True, "segment=16",
                                   True)
            else:
                if op == "linear_attn":
                    res = ops.linear_attn_bwd(f["q"], f["k"], f["v"], f["g"], f["initial_state"], None, None,
                                              f["do"], f["dfinal_state"], s, False)
                elif op == "gla":
                    res = ops.gla_bwd(f["q"], f["k"], f["v"], f["g"], f["initial_state"], None, None, f["do"], None,
                                      s)
                elif op == "gated_delta_rule":
                    res = ops.gated_delta_rule_bwd(f["q"], f["k"], f["v"], f["g"], f["beta"], f["initial_state"],
                                                   None, None, f["do"], None, s, False, None, None, None, None)
                else:
                    res = ops.poly_bwd(f["q"], f["k"], f["v"], None, None, f["do"], None, None, None, None,
                                       f["coef"], s, 0.0, 0.0, 0.0, True, "", True)
                    res = (*res[:3], *res[3].split(1))
        for name, fake in zip(outs, res):
            shape, abi_dtype = linac.output_shape(op, name, ins, options)
            assert tuple(fake.shape) == shape, f"{op} {options} {name}: fake {tuple(fake.shape)}, C ABI {shape}"
            assert fake.dtype == abi_dtype, f"{op} {options} {name}: fake {fake.dtype}, C ABI {abi_dtype}"


class Mixer(torch.nn.Module):
    """A token mixer as a model would write it: projections, then linac's ops (GLA and Gated DeltaNet)."""

    def __init__(self, d=32, heads=2):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.proj = torch.nn.Linear(d, 6 * d, bias=False)
        self.gk = torch.nn.Linear(d, d, bias=False)
        self.gb = torch.nn.Linear(d, 2 * heads, bias=False)
        self.out = torch.nn.Linear(2 * d, d, bias=False)

    def forward(self, x, h0):
        B, T, _ = x.shape
        q, k, v, q2, k2, v2 = self.proj(x).view(B, T, 6, self.h, self.dk).unbind(2)
        g = torch.nn.functional.logsigmoid(self.gk(x).view(B, T, self.h, self.dk))
        gh, beta = self.gb(x).view(B, T, 2, self.h).unbind(2)
        o1, s1 = linac.chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True)
        o2, _ = linac.chunk_gated_delta_rule(q2, k2, v2, torch.nn.functional.logsigmoid(gh), beta.sigmoid(),
                                             use_qk_l2norm_in_kernel=True)
        return self.out(torch.cat([o1, o2], -1).reshape(B, T, -1)), s1


def test_compile_fullgraph():
    torch.manual_seed(0)
    model = Mixer().to(DEVICE)
    dev = next(model.parameters()).device
    x = torch.randn(2, 19, 32, device=dev)
    h0 = torch.randn(2, 2, 16, 16, device=dev, requires_grad=True)

    def step(m):
        for p in m.parameters():
            p.grad = None
        h0.grad = None
        y, s = m(x, h0)
        (y.square().mean() + s.mean()).backward()
        return y.detach(), [p.grad.clone() for p in m.parameters()] + [h0.grad.clone()]

    y_ref, g_ref = step(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager" if dev.type == "cpu" else "inductor")
    y, grads = step(compiled)
    assert_close(y, numpy(y_ref), 1e-5, "compiled output")
    for a, b in zip(grads, g_ref):
        assert_close(a, numpy(b), 1e-4, "compiled gradient")


def test_compile_inductor_forward():
    """The default backend (inductor) compiles a call too (CPU: a small graph, to keep the time down)."""
    t = sample()
    fn = torch.compile(lambda q, k, v, g: linac.chunk_gla(q, k, v, g)[0] * 2, fullgraph=True)
    torch._dynamo.reset()
    out = fn(t["q"], t["k"], t["v"], t["g"])
    assert torch.allclose(out, linac.chunk_gla(t["q"], t["k"], t["v"], t["g"])[0] * 2)


def test_cuda_graph():
    if not torch.cuda.is_available() or DEVICE != "cuda":
        pytest.skip("CUDA graphs need LINAC_TEST_DEVICE=cuda and a GPU")
    t = sample()
    q, k, v, g = (t[n].bfloat16() if n != "g" else t[n] for n in ("q", "k", "v", "g"))
    ref = linac.chunk_gla(q, k, v, g)[0]  # warm-up: compiles and tunes outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linac.chunk_gla(q, k, v, g)[0]
    q.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, linac.chunk_gla(q, k, v, g)[0]) and not torch.equal(out, ref)
