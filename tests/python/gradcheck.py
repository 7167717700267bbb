"""Gradients checked against directional central differences of a float64 forward: for random
directions d, <grad, d> must match (L(x + e d) - L(x - e d)) / 2e. Needs no gradient formula, so the
check shares nothing with the kernels under test.

The error is measured relative to |grad| (the 2-norm), not to <grad, d>: for d ~ N(0, I) the error
<grad - exact, d> has the scale of |grad - exact|, so |<grad, d> - fd| / |grad| estimates the relative
error per gradient |grad - exact| / |exact| that the backward issue bounds. Dividing by <grad, d> instead
measured cancellation in the random sum: on the GPU, gla's dv at T=17 was off by 2.8e-7 of |dv| but
failed at 2e-5 because that direction's <dv, d> happened to be 0.555 where |dv| is 41."""
import numpy as np


def check_directional(grads, x, loss, directions=3, tol=1e-5, eps=1e-6, seed=0):
    """grads: {input name: gradient array from the kernels}; x: the inputs (any float dtype; others pass
    through); loss(inputs in float64) -> float. Relative error per direction, with a floor of 0.01 where
    the gradient is small; a derivative that is exactly 0 requires |<grad, d>| < tol |d|."""
    x64 = {n: (a.astype(np.float64) if a.dtype.kind == "f" else a) for n, a in x.items()}
    rng = np.random.default_rng(seed)
    for name, grad in grads.items():
        g = np.asarray(grad, dtype=np.float64)
        assert g.shape == x[name].shape, f"d{name}: shape {g.shape}, expected {x[name].shape}"
        assert np.all(np.isfinite(g)), f"d{name}: non-finite values"
        for _ in range(directions):
            d = rng.standard_normal(x[name].shape)
            xp = dict(x64)
            xp[name] = x64[name] + eps * d
            xm = dict(x64)
            xm[name] = x64[name] - eps * d
            fd = (loss(xp) - loss(xm)) / (2 * eps)
            gd = float(np.sum(g * d))
            if fd == 0:
                assert abs(gd) < tol * np.linalg.norm(d), f"d{name}: should vanish, <grad, d> = {gd:.3g}"
                continue
            err = abs(gd - fd) / max(float(np.linalg.norm(g)), 1e-2)
            assert err < tol, f"d{name}: directional derivative {gd:.9g} vs finite differences {fd:.9g}"
