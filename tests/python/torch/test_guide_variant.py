"""docs/dsl-guide.md's "From Python" variant (examples/guide/decayed_op.cpp) loads with linac.load and
matches a float64 token-by-token reference; the guide shows the file verbatim (checked here too)."""
from pathlib import Path

import torch

import linac
from torch_util import DEVICE

REPO = Path(__file__).resolve().parents[3]
SOURCE = REPO / "examples" / "guide" / "decayed_op.cpp"


def reference(q, k, v):
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64)
    out = []
    for t in range(T):
        S = 0.9 * S + k[:, t].double()[..., None] * v[:, t].double()[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t].double(), S))
    return torch.stack(out, 1)


def test_variant_matches_reference():
    decayed = linac.load(SOURCE).decayed
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 20, 3, d, generator=g) * 0.3 for d in (48, 48, 40))
    o = decayed(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE))
    ref = reference(q, k, v)
    assert o.shape == (2, 20, 3, 40)
    assert (o.double().cpu() - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_guide_shows_the_file():
    guide = (REPO / "docs" / "dsl-guide.md").read_text()
    body = SOURCE.read_text().split("\n", 2)[2]  # past the two comment lines
    assert body.strip() in guide, "docs/dsl-guide.md must show examples/guide/decayed_op.cpp as it is"
    code = [l for l in body.splitlines() if l.strip() and not l.startswith(("#include", "using "))]
    assert len(code) <= 25, f"the guide's variant grew to {len(code)} lines"
