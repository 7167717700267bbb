"""`linac run linear_attn --backward` on the CPU interpreter against reference_bwd (float64), which is
itself checked against central finite differences of the naive forward reference."""

import numpy as np
import pytest

import reference
import reference_bwd

FP32_TOL = 1e-5
ERROR_PREFIX = "linac: error:"


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def make_inputs(seed, B, T, H, K, V, gate=False, init=False, dfinal=False, N=None, gate_bias=2.0):
    rng = np.random.default_rng(seed)
    N = N or B
    x = {
        "q": rng.standard_normal((B, T, H, K)),
        "k": rng.standard_normal((B, T, H, K)),
        "v": rng.standard_normal((B, T, H, V)),
        "do": rng.standard_normal((B, T, H, V)),
    }
    if gate:
        x["g"] = logsigmoid(rng.standard_normal((B, T, H)) + gate_bias)
    if init:
        x["initial_state"] = rng.standard_normal((N, H, K, V))
    if dfinal:
        x["dfinal_state"] = rng.standard_normal((N, H, K, V))
    return {n: a.astype(np.float32) for n, a in x.items()}


# ---------------------------------------------------------------------------------------------------
# The reference's gradients against central finite differences of the naive forward.


def loss(x, scale):
    o, s = reference.linear_attn(x["q"], x["k"], x["v"], g=x.get("g"), initial_state=x.get("initial_state"),
                                 cu_seqlens=x.get("cu_seqlens"), scale=scale)
    total = np.sum(o * x["do"])
    if "dfinal_state" in x:
        total += np.sum(s * x["dfinal_state"])
    return total


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_reference_matches_finite_differences(gate, varlen):
    if varlen:
        x = make_inputs(7 + gate, B=1, T=6, H=2, K=3, V=2, gate=gate, init=True, dfinal=True, N=3)
        x["cu_seqlens"] = np.array([0, 1, 4, 6], dtype=np.int32)
    else:
        x = make_inputs(5 + gate, B=2, T=5, H=2, K=3, V=2, gate=gate, init=True, dfinal=True)
    x = {n: a.astype(np.float64) if a.dtype != np.int32 else a for n, a in x.items()}
    scale = 0.7
    grads = reference_bwd.linear_attn_bwd(x["q"], x["k"], x["v"], x["do"], g=x.get("g"),
                                          initial_state=x["initial_state"], dfinal_state=x["dfinal_state"],
                                          cu_seqlens=x.get("cu_seqlens"), scale=scale)
    names = {"q": "dq", "k": "dk", "v": "dv", "initial_state": "dinitial_state"}
    if gate:
        names["g"] = "dg"
    eps = 1e-6
    for name, gname in names.items():
        fd = np.zeros_like(x[name])
        for idx in np.ndindex(*x[name].shape):
            xp = dict(x); xp[name] = x[name].copy(); xp[name][idx] += eps
            xm = dict(x); xm[name] = x[name].copy(); xm[name][idx] -= eps
            fd[idx] = (loss(xp, scale) - loss(xm, scale)) / (2 * eps)
        err = reference.rel_err(grads[gname], fd)
        assert err < 1e-7, f"{gname}: reference vs finite differences rel err {err:.3g}"


# ---------------------------------------------------------------------------------------------------
# The CLI against the reference.


def run_bwd(linac, inputs, outputs, options=()):
    return linac.run_op("linear_attn", inputs, outputs=outputs, options=("--backward", *options))


def check(linac, inputs, scale=None, options=()):
    outputs = ["dq", "dk", "dv"]
    if "g" in inputs:
        outputs.append("dg")
    if "initial_state" in inputs or "dfinal_state" in inputs:
        outputs.append("dinitial_state")
    got = run_bwd(linac, inputs, outputs, options)
    ref = reference_bwd.linear_attn_bwd(inputs["q"], inputs["k"], inputs["v"], inputs["do"], g=inputs.get("g"),
                                        initial_state=inputs.get("initial_state"),
                                        dfinal_state=inputs.get("dfinal_state"),
                                        cu_seqlens=inputs.get("cu_seqlens"), scale=scale)
    for name in outputs:
        out = got[name]
        assert out.dtype == np.float32, f"{name}: dtype {out.dtype}"
        assert out.shape == ref[name].shape, f"{name}: shape {out.shape}, expected {ref[name].shape}"
        assert np.all(np.isfinite(out)), f"{name}: non-finite values"
        if not np.any(ref[name]):
            # e.g. dg of a single token with no initial state: exactly zero, computed as q.dq - k.dk.
            assert np.max(np.abs(out)) < FP32_TOL, f"{name}: expected zeros, max |value| {np.max(np.abs(out)):.3g}"
            continue
        err = reference.rel_err(out, ref[name])
        assert err < FP32_TOL, f"{name}: relative error {err:.3g} >= {FP32_TOL:g}"
    return got


@pytest.mark.parametrize("T", [1, 17, 64, 100])
@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_seq_lengths(linac, T, gate):
    check(linac, make_inputs(300 + T + 1000 * gate, B=2, T=T, H=2, K=32, V=16, gate=gate))


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_initial_state_and_dfinal_state(linac, gate):
    check(linac, make_inputs(400 + gate, B=2, T=100, H=2, K=16, V=32, gate=gate, init=True, dfinal=True))


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_dfinal_state_only(linac, gate):
    # No initial state: dinitial_state is still the gradient w.r.t. the (zero) starting state.
    check(linac, make_inputs(450 + gate, B=1, T=70, H=2, K=32, V=32, gate=gate, dfinal=True))


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_varlen(linac, gate):
    # A length-1 sequence, one spanning chunks, one ending inside a chunk.
    cu = np.array([0, 1, 80, 100], dtype=np.int32)
    x = make_inputs(500 + gate, B=1, T=100, H=2, K=32, V=16, gate=gate, init=True, dfinal=True, N=3)
    x["cu_seqlens"] = cu
    check(linac, x)


def test_explicit_scale_and_chunk(linac):
    x = make_inputs(600, B=1, T=50, H=1, K=16, V=16, gate=True, init=True, dfinal=True)
    check(linac, x, scale=0.3, options=("--scale", "0.3", "--chunk-size", "16"))


@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gated"])
def test_head_dim_128(linac, gate):
    # fla's head size. In fp32 the backward defaults to chunks of 32 and column blocks of 64 (two
    # programs per head and walk: at 64 rows the gated dq kernel planned 292 KB of shared memory, more
    # than an H200 has); T = 70 spans three chunks, the last one partial.
    check(linac, make_inputs(650 + gate, B=1, T=70, H=1, K=128, V=128, gate=gate, init=True, dfinal=True))


@pytest.mark.parametrize("config", ["bk=16,bv=16", "bk=32,bv=16,chunk=32,warps=4", "chunk=16,bk=16,bv=64"])
def test_column_blocks(linac, config):
    # Heads split in several column blocks per walk (dg adds the blocks' partial sums), with every
    # input: gate, both states, varlen; V = 48 pads to 64 (the last value block is partly masked).
    cu = np.array([0, 5, 70, 90], dtype=np.int32)
    x = make_inputs(660, B=1, T=90, H=2, K=32, V=48, gate=True, init=True, dfinal=True, N=3)
    x["cu_seqlens"] = cu
    check(linac, x, options=("--config", config))


@pytest.mark.parametrize("config", ["split=1", "split=1,sbk=16,sbv=16", "split=1,chunk=16,sbk=16,sbv=32,warps=4",
                                    "split=1,chunk=64,sbv=16"])
def test_split_schedule(linac, config):
    # State passes in key x value blocks (K = 24 pads to 32, V = 40 to 64: the last blocks partly
    # masked) storing the state and its gradient per chunk, then every chunk's gradients; both states,
    # T = 100 over several chunks, the last partial.
    check(linac, make_inputs(670, B=2, T=100, H=2, K=24, V=40, init=True, dfinal=True), options=("--config", config))


def test_split_schedule_without_states_and_at_head_dim_128(linac):
    check(linac, make_inputs(671, B=1, T=70, H=2, K=16, V=16), options=("--config", "split=1,chunk=16"))
    check(linac, make_inputs(672, B=1, T=70, H=1, K=128, V=128, init=True, dfinal=True),
          options=("--config", "split=1"))


def test_split_schedule_varlen_takes_the_walks(linac):
    cu = np.array([0, 1, 80, 100], dtype=np.int32)
    x = make_inputs(673, B=1, T=100, H=2, K=32, V=16, init=True, dfinal=True, N=3)
    x["cu_seqlens"] = cu
    check(linac, x, options=("--config", "split=1"))


def test_split_schedule_refuses_the_gate(linac):
    x = make_inputs(674, B=1, T=20, H=1, K=16, V=16, gate=True)
    proc = linac.run("run", "linear_attn", *(f"{n}={linac.write(n, a)}" for n, a in x.items()), "-o", "dq=dq.npy",
                     "--device", "cpu", "--backward", "--config", "split=1")
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "split=1 takes the plain form" in lines[0], proc.stderr


def test_non_power_of_two_head_dims(linac):
    check(linac, make_inputs(700, B=1, T=40, H=1, K=20, V=12, gate=True, init=True, dfinal=True))


def test_forward_unchanged_by_backward_inputs_absent(linac):
    # The forward still runs and matches its reference (the dispatch only diverts --backward).
    x = make_inputs(800, B=1, T=20, H=1, K=16, V=16, gate=True)
    del x["do"]
    got = linac.run_op("linear_attn", x, outputs=("o",))
    o_ref, _ = reference.linear_attn(x["q"], x["k"], x["v"], g=x["g"])
    assert reference.rel_err(got["o"], o_ref) < FP32_TOL


# ---------------------------------------------------------------------------------------------------
# Errors: exit 1, one line "linac: error: ...", no output file.


def expect_error(linac, inputs, outputs, options, mentions=None):
    args = ["run", "linear_attn"]
    for name, a in inputs.items():
        args.append(f"{name}={linac.write(name, a)}")
    for name in outputs:
        args += ["-o", f"{name}=out_{name}.npy"]
    proc = linac.run(*args, "--device", "cpu", *options)
    assert proc.returncode == 1, f"exit {proc.returncode}, stderr: {proc.stderr!r}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX), proc.stderr
    if mentions:
        assert mentions in lines[0], lines[0]
    assert not any(f.startswith("out_") for f in linac.files())


def test_error_backward_without_do(linac):
    x = make_inputs(900, B=1, T=8, H=1, K=16, V=16)
    del x["do"]
    expect_error(linac, x, ["dq"], ["--backward"], mentions="do")


def test_error_do_wrong_shape(linac):
    x = make_inputs(901, B=1, T=8, H=1, K=16, V=16)
    x["do"] = x["do"][:, :7]
    expect_error(linac, x, ["dq"], ["--backward"], mentions="do")


def test_error_dfinal_state_wrong_shape(linac):
    x = make_inputs(902, B=1, T=8, H=1, K=16, V=16, dfinal=True)
    x["dfinal_state"] = x["dfinal_state"][..., :8]
    expect_error(linac, x, ["dq"], ["--backward"], mentions="dfinal_state")


def test_error_do_without_backward(linac):
    expect_error(linac, make_inputs(903, B=1, T=8, H=1, K=16, V=16), ["o"], [], mentions="--backward")


def test_error_dg_without_gate(linac):
    expect_error(linac, make_inputs(904, B=1, T=8, H=1, K=16, V=16), ["dg"], ["--backward"], mentions="dg")


def test_error_column_block_wider_than_head(linac):
    expect_error(linac, make_inputs(906, B=1, T=8, H=1, K=16, V=16), ["dq"], ["--backward", "--config", "bk=32"],
                 mentions="bk=32")


def test_error_forward_output_with_backward(linac):
    expect_error(linac, make_inputs(905, B=1, T=8, H=1, K=16, V=16), ["o"], ["--backward"], mentions="'o'")
