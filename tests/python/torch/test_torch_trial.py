"""Issue 22's trial: a linear-attention variant written from Python in one sitting. RetNet retention (a
fixed decay per head) as one C++ file of under 40 lines (the DSL kernel and its op declaration), loaded
and checked against a float64 recurrence in under 20 lines of Python. The line counts are asserted: the
point is that a variant stays this short."""

import math
import os
import shutil

import pytest

from conftest import DEVICE

torch = pytest.importorskip("torch", reason="torch is not installed")
import linac  # noqa: E402

if shutil.which(os.environ.get("CXX", "c++")) is None:
    pytest.skip("no C++ compiler (c++ or $CXX) to build users' ops with", allow_module_level=True)

RETNET = r"""
#include "linac/user_op.h"
#include "linac/dsl.h"
using namespace linac::dsl;

static std::shared_ptr<linac::ir::Kernel> retnet(int64_t BT, int64_t BK, int64_t BV, linac::DType dt) {
  KernelBuilder kb("retnet_trial");
  Tensor q = kb.tensor("q", dt, 4), k = kb.tensor("k", dt, 4), v = kb.tensor("v", dt, 4), o = kb.tensor("o", dt, 4);
  Tile i_b = program_id(1) / q.dim(2), i_h = program_id(1) % q.dim(2), v0 = program_id(0) * BV;
  Tile g = log(1.0f - exp2(-5.0f - i_h.to(linac::DType::f32)));               // log gamma_h
  Tile r = expand_dims(iota(BT), 1), c = expand_dims(iota(BT), 0);
  Tile D = where(r >= c, exp((r - c).to(linac::DType::f32) * g), 0.0f);      // gamma^(r-c), causal
  Tile S = zeros({BK, BV}, linac::DType::f32);
  for_range(0, (q.dim(1) + (BT - 1)) / BT, [&](Tile i) {
    Tile Q = load(q, {i_b, i * BT, i_h, 0}, {kIndex, BT, kIndex, BK});
    Tile K = load(k, {i_b, i * BT, i_h, 0}, {kIndex, BT, kIndex, BK});
    Tile V = load(v, {i_b, i * BT, i_h, v0}, {kIndex, BT, kIndex, BV});
    Tile O = dot(Q, S.to(dt)) * exp((r + 1).to(linac::DType::f32) * g) + dot((dot(Q, K.T()) * D).to(dt), V);
    store(o, {i_b, i * BT, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt));
    Tile Kd = (K.to(linac::DType::f32) * exp(((BT - 1) - r).to(linac::DType::f32) * g)).to(dt);
    S = S * exp(g * static_cast<float>(BT)) + dot(Kd.T(), V);
  }, S);
  return kb.finish();
}

LINAC_USER_OP(retnet_trial) {
  linac::ops::UserOp op;
  op.inputs = {"q", "k", "v"};
  op.outputs = {"o"};
  op.tuning = {{"chunk", {64, 32, 16}}};
  op.plan = [](const linac::ops::UserCall& c) {
    const auto& q = c.inputs.at("q");
    linac::ops::UserPlan p;
    p.outputs["o"] = {q.dtype, c.inputs.at("v").shape};
    p.launches.push_back({retnet(c.config.at("chunk"), 64, 64, q.dtype), {1, q.shape[0] * q.shape[2], 1}});
    return p;
  };
  return op;
}
"""


def trial(path):
    retnet = linac.load(path).retnet_trial
    B, T, H, D = 2, 50, 3, 64
    q, k, v = (torch.randn(B, T, H, D) / math.sqrt(D) for _ in range(3))
    gamma = torch.tensor([1 - 2.0 ** (-5 - h) for h in range(H)], dtype=torch.float64)[None, :, None, None]
    S, ref = torch.zeros(B, H, D, D, dtype=torch.float64), []
    for t in range(T):
        S = gamma * S + k[:, t].double()[..., None] * v[:, t].double()[..., None, :]
        ref.append(torch.einsum("bhk,bhkv->bhv", q[:, t].double(), S))
    ref = torch.stack(ref, 1)
    for chunk in (64, 16):
        o = retnet(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), chunk=chunk).double().cpu()
        assert ((o - ref).abs().max() / ref.abs().max()).item() < 1e-5
    return True


def test_retnet_from_python_in_a_few_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("LINAC_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "retnet_trial.cpp"
    path.write_text(RETNET)
    assert trial(path)
    cpp_lines = [line for line in RETNET.strip().splitlines() if line.strip()]
    assert len(cpp_lines) < 40, len(cpp_lines)
    import inspect
    python_lines = [line for line in inspect.getsource(trial).splitlines()[1:-1] if line.strip()]
    assert len(python_lines) < 20, len(python_lines)
