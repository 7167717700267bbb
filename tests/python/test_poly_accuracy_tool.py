"""tools/poly_accuracy.py at tiny sizes on the CPU (the real run is on the GPU: B1 T64K H8 D64 bf16). Its
chunked float64 reference against reference_poly.poly (the literal double sum) and its autograd gradients
against a pairwise float64 form; then the script end to end: the table, the verdict, the JSON."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import reference_poly

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "poly_accuracy.py"
TINY = ["--device", "cpu", "--dtype", "fp32", "-B", "1", "-T", "300", "-H", "2", "-D", "16", "--ref-chunk", "64"]
RESULT_KEYS = {"tensor", "rel", "max_ratio", "max_abs_err", "max_abs_ref", "finite", "passed"}


def load_tool():
    spec = importlib.util.spec_from_file_location("poly_accuracy", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def rand64(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def pairwise(q, k, v, a, b, c, scale, normalize):
    """poly as the masked T x T score matrix, in torch float64 (differentiable)."""
    x = scale * torch.einsum("bthk,bshk->bhts", q, k)
    T = q.shape[1]
    f = torch.where(torch.ones(T, T, dtype=torch.bool).tril(), a + b * x + c * x * x, torch.zeros((), dtype=x.dtype))
    num = torch.einsum("bhts,bshv->bthv", f, v)
    return num / (f.sum(-1).transpose(1, 2)[..., None] + reference_poly.EPS) if normalize else num


@pytest.mark.parametrize("B, T, H, K, V, chunk, coeffs", [
    (1, 300, 2, 16, 16, 64, dict(a=1.0, b=1.0, c=0.5, scale=None, normalize=True)),     # T not a chunk multiple
    (2, 70, 1, 8, 5, 16, dict(a=0.5, b=-0.3, c=0.2, scale=0.7, normalize=False)),
    (1, 40, 2, 4, 4, 1, dict(a=2.0, b=1.0, c=0.0, scale=None, normalize=True)),         # token by token, c = 0
])
def test_chunked_reference_equals_literal(B, T, H, K, V, chunk, coeffs):
    tool = load_tool()
    gen = torch.Generator().manual_seed(7)
    q, k, v = rand64(gen, B, T, H, K), rand64(gen, B, T, H, K), rand64(gen, B, T, H, V)
    got = tool.poly_reference(q, k, v, chunk=chunk, **coeffs).numpy()
    want = reference_poly.poly(q.numpy(), k.numpy(), v.numpy(), **coeffs)
    assert got.shape == want.shape == (B, T, H, V)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-10, err


@pytest.mark.parametrize("T, chunk", [(200, 64), (50, 7)])
def test_chunked_reference_gradients(T, chunk):
    tool = load_tool()
    gen = torch.Generator().manual_seed(11)
    B, H, K, V = 1, 2, 16, 12
    coeffs = dict(a=1.0, b=1.0, c=0.5, scale=K ** -0.5, normalize=True)
    q, k, v = (rand64(gen, B, T, H, d).requires_grad_() for d in (K, K, V))
    do = rand64(gen, B, T, H, V)
    got = torch.autograd.grad(tool.poly_reference(q, k, v, chunk=chunk, **coeffs), (q, k, v), do)
    want = torch.autograd.grad(pairwise(q, k, v, **coeffs), (q, k, v), do)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        err = ((g - w).abs().max() / w.abs().max()).item()
        assert err <= 1e-10, (name, err)


def test_end_to_end_fp32(tmp_path):
    out = tmp_path / "acc.json"
    proc = run(*TINY, "--json", out, cwd=tmp_path)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    doc = json.loads(out.read_text())
    for key in ("tool", "device", "torch", "date", "commit", "settings", "results", "passed", "error"):
        assert key in doc, key
    s = doc["settings"]
    assert (s["B"], s["T"], s["H"], s["D"], s["dtype"], s["ref_chunk"]) == (1, 300, 2, 16, "fp32", 64)
    assert (s["a"], s["b"], s["c"], s["scale"], s["normalize"], s["grad"]) == (1.0, 1.0, 0.5, 0.25, True, True)
    assert doc["passed"] is True and doc["error"] is None
    assert [r["tensor"] for r in doc["results"]] == ["o", "dq", "dk", "dv"]
    for r in doc["results"]:
        assert set(r) == RESULT_KEYS, r
        assert r["finite"] and r["passed"], r
        assert 0 <= r["rel"] < 1e-4 and 0 <= r["max_ratio"] < 1e-4, r
        assert r["max_abs_ref"] > 0.1, r   # the reference is not trivially zero
        assert re.search(rf"^{r['tensor']}\s+\S+\s+\S+\s+\S+\s+\S+\s+PASS$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^PASS: o, dq, dk, dv against tolerance 0\.01;", proc.stdout, re.M), proc.stdout


def test_no_grad_and_failing_verdict(tmp_path):
    # fp32 is about 1e-7 from the reference: a bar of 1e-12 must fail, with exit status 1.
    out = tmp_path / "acc.json"
    proc = run(*TINY, "--no-grad", "--tol", "1e-12", "--json", out, cwd=tmp_path)
    assert proc.returncode == 1, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    doc = json.loads(out.read_text())
    assert doc["settings"]["grad"] is False and doc["passed"] is False
    assert [r["tensor"] for r in doc["results"]] == ["o"]
    assert doc["results"][0]["passed"] is False and 0 < doc["results"][0]["rel"] < 1e-4
    assert re.search(r"^o\s+.*FAIL$", proc.stdout, re.M) and re.search(r"^FAIL: o against", proc.stdout, re.M)


@pytest.mark.parametrize("args, message", [
    (["-T", "0"], "-T must be positive"),
    (["--ref-chunk", "0"], "--ref-chunk must be positive"),
    (["--json", "no/such/folder/x.json"], "does not exist"),
])
def test_bad_command_lines(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        load_tool().parse_args(["--device", "cpu", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
