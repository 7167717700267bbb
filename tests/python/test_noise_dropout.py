"""--noise-dropout P [--seed S] (seed 000's noise-dropout: o <- (1-p) o (1+psi), psi ~ N(0, p)) for
linear_attn (forward, backward, normalized) and poly (forward).

The multipliers are regenerated here from the documented counter-based generator
(kernels/common/noise_dropout.h) in numpy, so the tests check the exact noise, its statistics, that the
backward sees the same noise, and that a seed reproduces it bit for bit."""
import numpy as np
import pytest

import reference
import reference_bwd
import reference_poly

MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(MASK)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def multipliers(shape, p, seed):
    with np.errstate(over="ignore"):
        key = splitmix64(np.array([seed], dtype=np.uint64))[0]
        i = np.arange(int(np.prod(shape)), dtype=np.uint64)
        r1 = splitmix64(key + np.uint64(2) * i)
        r2 = splitmix64(key + np.uint64(2) * i + np.uint64(1))
    u1 = ((r1 >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0 ** -53
    u2 = (r2 >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    psi = np.sqrt(p) * np.sqrt(-2 * np.log(u1)) * np.cos(2 * np.pi * u2)
    return ((1 - p) * (1 + psi)).astype(np.float32).astype(np.float64).reshape(shape)


def inputs(seed, B, T, H, K, V, gate=False, positive=False):
    rng = np.random.default_rng(seed)
    f = (lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))) if positive else (lambda x: x)
    x = {"q": f(rng.standard_normal((B, T, H, K))), "k": f(rng.standard_normal((B, T, H, K))),
         "v": rng.standard_normal((B, T, H, V))}
    if gate:
        x["g"] = -np.logaddexp(0.0, -(rng.standard_normal((B, T, H)) + 2.0))
    return {n: a.astype(np.float32) for n, a in x.items()}


def test_generator_statistics():
    # The generator itself (numpy form of the C++): psi has mean 0 and variance p.
    p, n = 0.1, 1 << 18
    psi = multipliers((n,), p, seed=3) / (1 - p) - 1
    assert abs(psi.mean()) < 5 * np.sqrt(p / n)
    assert abs(psi.var() / p - 1) < 5 * np.sqrt(2 / n)
    assert abs(np.mean(psi ** 3)) < 5 * np.sqrt(15 * p ** 3 / n)  # symmetric


@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gated"])
def test_forward_is_exactly_the_noisy_output(linac, gate):
    x = inputs(1, B=2, T=70, H=2, K=16, V=24, gate=gate)
    p, seed = 0.2, 12345
    o = linac.run_op("linear_attn", x, options=["--noise-dropout", str(p), "--seed", str(seed)])["o"]
    o_ref, _ = reference.linear_attn(x["q"], x["k"], x["v"], g=x.get("g"))
    assert reference.rel_err(o, o_ref * multipliers(o_ref.shape, p, seed)) < 1e-5


def test_noise_statistics_in_the_output(linac):
    # psi recovered from the CLI's outputs: o_noisy / ((1-p) o) - 1, over 2^16 elements.
    x = inputs(2, B=1, T=256, H=4, K=16, V=64)
    p = 0.1
    clean = linac.run_op("linear_attn", x)["o"].astype(np.float64)
    noisy = linac.run_op("linear_attn", x, options=["--noise-dropout", str(p), "--seed", "7"])["o"]
    keep = np.abs(clean) > 1e-2
    psi = noisy[keep] / ((1 - p) * clean[keep]) - 1
    n = psi.size
    assert n > 50000
    assert abs(psi.mean()) < 5 * np.sqrt(p / n)
    assert abs(psi.var() / p - 1) < 0.05


def test_seed_reproduces_bit_for_bit(linac):
    x = inputs(3, B=1, T=50, H=2, K=16, V=16)
    run = lambda seed: linac.run_op("linear_attn", x, options=["--noise-dropout", "0.3", "--seed", str(seed)])["o"]
    a, b, c = run(5), run(5), run(6)
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()


def test_p_zero_is_no_noise(linac):
    x = inputs(4, B=1, T=40, H=2, K=16, V=16)
    assert linac.run_op("linear_attn", x, options=["--noise-dropout", "0"])["o"].tobytes() == \
        linac.run_op("linear_attn", x)["o"].tobytes()


@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gated"])
def test_backward_sees_the_same_noise(linac, gate):
    # d/dq of sum(do * (o m)) = the plain backward with do * m.
    x = inputs(5, B=1, T=70, H=2, K=16, V=24, gate=gate)
    p, seed = 0.25, 99
    x["do"] = np.random.default_rng(6).standard_normal(x["v"].shape).astype(np.float32)
    outputs = ["dq", "dk", "dv"] + (["dg"] if gate else [])
    got = linac.run_op("linear_attn", x, outputs=outputs,
                       options=["--backward", "--noise-dropout", str(p), "--seed", str(seed)])
    m = multipliers(x["v"].shape, p, seed)
    ref = reference_bwd.linear_attn_bwd(x["q"], x["k"], x["v"], x["do"] * m, g=x.get("g"))
    for name in outputs:
        assert reference.rel_err(got[name], ref[name]) < 1e-5, name


def test_normalized_forward(linac):
    x = inputs(8, B=1, T=60, H=2, K=16, V=16, gate=True, positive=True)
    o = linac.run_op("linear_attn", x, options=["--normalize", "--noise-dropout", "0.1", "--seed", "2"])["o"]
    o_ref = reference_poly.linear_attn_normalized(x["q"], x["k"], x["v"], g=x["g"])
    assert reference.rel_err(o, o_ref * multipliers(o_ref.shape, 0.1, 2)) < 1e-5


def test_poly_forward(linac):
    x = inputs(9, B=1, T=60, H=2, K=16, V=16)
    o = linac.run_op("poly", x, options=["--noise-dropout", "0.1", "--seed", "4"])["o"]
    o_ref = reference_poly.poly(x["q"], x["k"], x["v"])
    assert reference.rel_err(o, o_ref * multipliers(o_ref.shape, 0.1, 4)) < 1e-5


@pytest.mark.parametrize("op,extra,mention", [
    ("linear_attn", ["--noise-dropout", "1"], "[0, 1)"),
    ("linear_attn", ["--noise-dropout", "-0.1"], "[0, 1)"),
    ("linear_attn", ["--noise-dropout", "0.1", "--seed", "-1"], "--seed"),
    ("gla", ["--noise-dropout", "0.1"], "--noise-dropout"),
])
def test_errors(linac, op, extra, mention):
    x = inputs(10, B=1, T=8, H=1, K=16, V=16)
    if op == "gla":
        x["g"] = np.full((1, 8, 1, 16), -0.1, dtype=np.float32)
    proc = linac.run("run", op, *(f"{n}={linac.write(n, a)}" for n, a in x.items()), "-o", "o=o.npy",
                     "--device", "cpu", *extra)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and mention in lines[0], proc.stderr
    assert not (linac.workdir / "o.npy").exists()


@pytest.mark.parametrize("op,options", [("linear_attn", ["--normalize"]), ("poly", [])], ids=["normalized", "poly"])
def test_backward_of_other_forms_sees_the_same_noise(linac, op, options):
    # The gradients with noise-dropout equal the plain gradients with do * m (m regenerated here).
    x = inputs(11, B=1, T=40, H=2, K=16, V=16, positive=True)
    x["do"] = np.random.default_rng(12).standard_normal(x["v"].shape).astype(np.float32)
    p, seed = 0.2, 31
    outputs = ("dq", "dk", "dv")
    noisy = linac.run_op(op, x, outputs=outputs,
                         options=[*options, "--backward", "--noise-dropout", str(p), "--seed", str(seed)])
    scaled = dict(x, do=(x["do"] * multipliers(x["v"].shape, p, seed)).astype(np.float32))
    plain = linac.run_op(op, scaled, outputs=outputs, options=[*options, "--backward"])
    for name in outputs:
        assert reference.rel_err(noisy[name], plain[name]) < 1e-5, name
