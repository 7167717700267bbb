"""`linac run gla ... do=.. [dfinal_state=..] --backward` (token by token) against the float64 forward
reference (reference_gla.gla): every gradient by directional central differences (gradcheck.py) of
L = sum(o do) + sum(S_T dfinal)."""
import numpy as np
import pytest

import gradcheck
import reference
import reference_gla

GRADS = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "initial_state": "dinitial_state"}


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def make_inputs(seed, B, T, H, K, V, init=False, dfinal=False, N=None):
    rng = np.random.default_rng(seed)
    N = N or B
    x = {"q": rng.standard_normal((B, T, H, K)), "k": rng.standard_normal((B, T, H, K)),
         "v": rng.standard_normal((B, T, H, V)), "g": logsigmoid(rng.standard_normal((B, T, H, K)) + 2.0),
         "do": rng.standard_normal((B, T, H, V))}
    if init:
        x["initial_state"] = rng.standard_normal((N, H, K, V))
    if dfinal:
        x["dfinal_state"] = rng.standard_normal((N, H, K, V))
    return {n: a.astype(np.float32) for n, a in x.items()}


def loss(x):
    o, s = reference_gla.gla(x["q"], x["k"], x["v"], x["g"], initial_state=x.get("initial_state"),
                             cu_seqlens=x.get("cu_seqlens"))
    total = np.sum(o * x["do"])
    if "dfinal_state" in x:
        total += np.sum(s * x["dfinal_state"])
    return total


def check(linac, x, options=()):
    names = [n for n in GRADS if n in x]
    got = linac.run_op("gla", x, outputs=[GRADS[n] for n in names], options=["--backward", *options])
    gradcheck.check_directional({n: got[GRADS[n]] for n in names}, x, loss)
    return got


@pytest.mark.parametrize("T", [1, 17, 64])
def test_gradients(linac, T):
    check(linac, make_inputs(10 + T, B=2, T=T, H=2, K=16, V=8))


def test_states(linac):
    check(linac, make_inputs(30, B=2, T=40, H=2, K=16, V=12, init=True, dfinal=True))


def test_varlen(linac):
    x = make_inputs(40, B=1, T=50, H=2, K=8, V=8, init=True, dfinal=True, N=3)
    x["cu_seqlens"] = np.array([0, 1, 30, 50], dtype=np.int32)
    check(linac, x)


def test_non_power_of_two_head_dims(linac):
    check(linac, make_inputs(50, B=1, T=30, H=1, K=20, V=12, init=True, dfinal=True))


@pytest.mark.parametrize("config", ["bk=16,bv=16", "bk=32,bv=16,warps=2", "warps=8", "chunk=16", "chunk=32,bk=16",
                                    "take=0", "chunk=32,take=0", "fuse=0", "bk=32,bv=64,fuse=1",
                                    "split=1", "split=1,sbk=16,sbv=16", "split=1,chunk=16,sbk=16,sbv=32,warps=4",
                                    "split=1,chunk=64,sbv=16", "tokenwise=1"])
def test_configs(linac, config):
    # The chunked form over many 16-row chunks (T=100: seven, the last partial) with key and value
    # column blocks (K=24 pads to 32, V=40 to 64: the last blocks partly masked), both states; the
    # split schedule (state passes in key x value blocks: sbv=16 gives four value blocks, the last
    # wholly past V, each with its own part of dg's final-state term); and the token-by-token
    # reference form (tokenwise=1).
    check(linac, make_inputs(80, B=2, T=100, H=2, K=24, V=40, init=True, dfinal=True), options=("--config", config))


def test_varlen_across_chunks(linac):
    x = make_inputs(81, B=1, T=120, H=2, K=16, V=16, init=True, dfinal=True, N=4)
    x["cu_seqlens"] = np.array([0, 7, 40, 41, 120], dtype=np.int32)
    check(linac, x, options=("--config", "bk=16"))


@pytest.mark.parametrize("config", ["split=0", "split=1"])
def test_head_dim_128(linac, config):
    check(linac, make_inputs(82, B=1, T=40, H=1, K=128, V=128, init=True, dfinal=True), options=("--config", config))


def test_split_varlen_takes_the_walks(linac):
    # The state passes are dense only: with cu_seqlens, split=1 runs the walks (and still gets every gradient).
    x = make_inputs(83, B=1, T=60, H=2, K=16, V=16, init=True, dfinal=True, N=3)
    x["cu_seqlens"] = np.array([0, 9, 40, 60], dtype=np.int32)
    check(linac, x, options=("--config", "split=1"))


def test_split_over_many_chunks(linac):
    # 69 chunks of 16: dg's offsets walk two blocks of 64 chunk totals (the carry crosses a block).
    check(linac, make_inputs(86, B=1, T=1100, H=1, K=16, V=16, init=True, dfinal=True),
          options=("--config", "split=1,chunk=16"))


def test_split_without_states(linac):
    # No initial state, no dfinal_state: the state passes start from zero and dg has no final-state term.
    check(linac, make_inputs(84, B=2, T=70, H=1, K=16, V=24), options=("--config", "split=1,sbk=16,sbv=16"))


@pytest.mark.parametrize("chunk,config", [(16, "take=0"), (32, "take=0"), (64, "take=0"), (16, "take=1"),
                                          (64, "split=1")])
def test_very_negative_gates_stay_finite(linac, chunk, config):
    # -1e4 gates that start and end inside 16-row blocks and chunks: every decay is a sum of gates over
    # the rows it spans (diagonal blocks, blocks below them, the walks), so precision is kept.
    x = make_inputs(60, B=1, T=100, H=1, K=8, V=8, init=True, dfinal=True)
    x["g"][:, 10:20] = -1e4
    x["g"][:, 37:70] = -1e4
    check(linac, x, options=("--chunk-size", str(chunk), "--config", config))


@pytest.mark.parametrize("gate", [-4.0, -4.01], ids=["factored_at_limit", "elementwise_past_limit"])
def test_gate_spread_at_the_factored_limit(linac, gate):
    # As test_gla's: a gate of -4 per token spreads exactly kGlaFactorSpread = 60 over a 16-row block
    # (the factored diagonal block at its largest factors), -4.01 just past it (elementwise). Half the
    # channels decay slowly.
    x = make_inputs(65, B=1, T=50, H=1, K=16, V=8, init=True, dfinal=True)
    x["g"][..., 0::2] = gate
    x["g"][..., 1::2] *= 0.05
    check(linac, x, options=("--chunk-size", "32"))


def test_bf16(linac):
    x = make_inputs(70, B=1, T=40, H=2, K=16, V=16, init=True, dfinal=True)
    got = linac.run_op("gla", x, outputs=("dq", "dk", "dv", "dg"), options=["--backward", "--dtype", "bf16"])
    ref = linac.run_op("gla", {n: reference.round_to_bf16(a) if n in ("q", "k", "v", "do") else a for n, a in x.items()},
                       outputs=("dq", "dk", "dv", "dg"), options=["--backward"])
    for name in ("dq", "dk", "dv", "dg"):
        assert reference.rel_err(got[name], ref[name]) < 3e-2, name


def test_errors(linac):
    x = make_inputs(80, B=1, T=8, H=1, K=8, V=8)
    for extra, outputs, mention in ((["--backward", "--chunk-size", "128"], ["dq"], "--chunk-size"),
                                    (["--backward", "--config", "tokenwise=1", "--chunk-size", "16"], ["dq"],
                                     "--chunk-size"),
                                    ([], ["o"], "--backward"),
                                    (["--backward"], ["o"], "'o'")):
        proc = linac.run("run", "gla", *(f"{n}={linac.write(n, a)}" for n, a in x.items()),
                         *(a for o in outputs for a in ("-o", f"{o}={o}.npy")), "--device", "cpu", *extra)
        assert proc.returncode == 1, (extra, proc.stderr)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and mention in lines[0], proc.stderr


def test_split_above_head_dim_128_is_refused(linac):
    x = make_inputs(85, B=1, T=8, H=1, K=256, V=16)
    proc = linac.run("run", "gla", *(f"{n}={linac.write(n, a)}" for n, a in x.items()), "-o", "dq=dq.npy",
                     "--device", "cpu", "--backward", "--config", "split=1")
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "split=1 takes head dims up to 128" in lines[0], proc.stderr
