"""Inputs and comparisons for the PyTorch-op tests (tiny shapes: the CPU interpreter runs them)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the PyTorch ops cannot be tested")

from conftest import DEVICE  # noqa: E402

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.fail("LINAC_TEST_DEVICE=cuda but torch sees no CUDA device", pytrace=False)

F = torch.nn.functional


def tensor(x, dtype=torch.float32, grad=False):
    t = torch.as_tensor(np.ascontiguousarray(x)).to(device=DEVICE, dtype=dtype)
    return t.requires_grad_() if grad else t


def inputs(seed, B=2, T=37, H=2, K=16, V=8, gate=None, beta=False, init=False, N=None, unit_keys=False):
    """float32 numpy inputs: q, k, v [, g: 'head' [B,T,H] or 'key' [B,T,H,K] log-decays] [, beta]
    [, initial_state [N,H,K,V]]."""
    rng = np.random.default_rng(seed)
    x = {"q": rng.standard_normal((B, T, H, K)), "k": rng.standard_normal((B, T, H, K)),
         "v": rng.standard_normal((B, T, H, V))}
    if unit_keys:
        x["k"] /= np.linalg.norm(x["k"], axis=-1, keepdims=True)
    if gate == "head":
        x["g"] = -np.logaddexp(0.0, -(rng.standard_normal((B, T, H)) + 2.0))
    elif gate == "key":
        x["g"] = -np.logaddexp(0.0, -(rng.standard_normal((B, T, H, K)) + 2.0))
    if beta:
        x["beta"] = 1.0 / (1.0 + np.exp(-rng.standard_normal((B, T, H))))
    if init:
        x["initial_state"] = 0.5 * rng.standard_normal((N or B, H, K, V))
    return {n: a.astype(np.float32) for n, a in x.items()}


def to_torch(x, grad=False):
    return {n: tensor(a, grad=grad) for n, a in x.items()}


def numpy(t):
    return t.detach().float().cpu().numpy()


def rel_err(out, ref):
    out = np.asarray(numpy(out) if isinstance(out, torch.Tensor) else out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def assert_close(out, ref, tol=1e-5, what="output"):
    err = rel_err(out, ref)
    assert err < tol, f"{what}: relative error {err:.3g} (tolerance {tol:g})"


def cu(offsets):
    """cu_seqlens on the test device (int64, as fla makes them) and its host copy."""
    t = torch.tensor(offsets, dtype=torch.int64)
    return t.to(DEVICE), t
