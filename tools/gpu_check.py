#!/usr/bin/env python3
"""Correctness and determinism of `linac run linear_attn ... --device cuda`, on the GPU machine.

Run from the repository root (build/linac built, LD_LIBRARY_PATH set so it runs). Every case writes
fresh random inputs as float32 .npy files (q, k, v ~ randn; g = logsigmoid(randn); initial_state ~
randn; bf16 cases hold the bf16-rounded values and pass --dtype bf16), runs the CLI, and compares o
and final_state with an independent float64 oracle: a torch implementation of the chunked form of
docs/ops/linear_attn.md (chunks of --ref-chunk rows, computed exactly in float64 on the GPU), itself
checked at startup against the naive token-by-token recurrence of tests/python/reference.py (abort
if they differ by more than 1e-10).

Cases: fla's six benchmark shapes and 8x4096x16x128 in bf16 (gate none and g); 8x1024x8x64 in fp32;
T=1000 (B=2, H=4, D=64); K != V (K=64, V=128); varlen (cu_seqlens [0,1,300,1024,2000], B=1, H=4,
D=64) with initial and final states. Bounds: ||out-ref||/||ref|| < 2e-2 (bf16), < 1e-4 (fp32); any
non-finite value fails. Determinism: one mid-size case per gate is run 5 times; the output files must
be bitwise identical.

Prints a table, writes JSON (--json; default $OUT/gpu_check.json when $OUT is set, else
gpu_check.json) and exits non-zero if anything failed.
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

BIG_SHAPES = [
    (1, 8192, 96, 128),
    (2, 16384, 16, 128),
    (4, 2048, 16, 128),
    (4, 4096, 64, 128),
    (8, 2048, 32, 256),
    (8, 1024, 8, 64),
    (8, 4096, 16, 128),
]
DETERMINISM_SHAPE = (4, 2048, 16, 128)
DETERMINISM_RUNS = 5
VARLEN_CU = [0, 1, 300, 1024, 2000]


def log(msg=""):
    print(msg, file=sys.stderr, flush=True)


def out(msg=""):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------------
# The float64 oracle (torch). Independent of linac: written from docs/ops/linear_attn.md.


def _ref_dense(q, k, v, g, s0, scale, C):
    """One batch of independent (sequence, head) rows. q, k: [N, T, K]; v: [N, T, V]; g: [N, T] or None;
    s0: [N, K, V] or None; all float64. Returns o [N, T, V], final state [N, K, V]."""
    import torch
    N, T, K = q.shape
    V = v.shape[-1]
    nc = max(1, math.ceil(T / C))
    pad = nc * C - T
    if pad:
        # Zero keys and values change no state; zero log-decay keeps the state as it is.
        q = torch.nn.functional.pad(q, (0, 0, 0, pad))
        k = torch.nn.functional.pad(k, (0, 0, 0, pad))
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
        if g is not None:
            g = torch.nn.functional.pad(g, (0, pad))
    q = q.reshape(N, nc, C, K)
    k = k.reshape(N, nc, C, K)
    v = v.reshape(N, nc, C, V)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    A = q @ k.transpose(-1, -2)  # [N, nc, C, C]
    if g is not None:
        b = torch.cumsum(g.reshape(N, nc, C), dim=-1)  # chunk-local inclusive cumsum
        b_last = b[..., -1:]  # [N, nc, 1]
        diff = b[..., :, None] - b[..., None, :]
        diff = diff.masked_fill(~causal, float("-inf"))  # mask before exponentiating
        A = A * torch.exp(diff)
        del diff
        q_dec = q * torch.exp(b)[..., None]
        k_dec = k * torch.exp(b_last - b)[..., None]
        chunk_decay = torch.exp(b_last[..., 0])  # [N, nc]
    else:
        A = A.masked_fill(~causal, 0.0)
        q_dec, k_dec, chunk_decay = q, k, None
    o = A @ v  # intra-chunk
    del A
    dS = k_dec.transpose(-1, -2) @ v  # [N, nc, K, V]
    S = s0.clone() if s0 is not None else torch.zeros(N, K, V, dtype=q.dtype, device=q.device)
    S_before = torch.empty(N, nc, K, V, dtype=q.dtype, device=q.device)
    for i in range(nc):
        S_before[:, i] = S
        S = (chunk_decay[:, i, None, None] * S if chunk_decay is not None else S) + dS[:, i]
    o = o + q_dec @ S_before
    o = scale * o.reshape(N, nc * C, V)[:, :T]
    return o, S


def ref_linear_attn(q, k, v, g=None, initial_state=None, cu_seqlens=None, scale=None, chunk=256,
                    device="cuda", max_elems=1 << 27):
    """float64 linear attention. q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H]; initial_state:
    [N, H, K, V]; arrays (numpy or torch) of any float dtype. Returns torch float64 (o [B, T, H, V],
    final_state [N, H, K, V]) on `device`."""
    import torch

    def f64(x):
        if x is None:
            return None
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(np.ascontiguousarray(x))
        return x.to(device=device, dtype=torch.float64)

    q, k, v, g, s0 = f64(q), f64(k), f64(v), f64(g), f64(initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    if scale is None:
        scale = K ** -0.5
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in np.asarray(cu_seqlens)]
        assert B == 1 and cu[0] == 0 and cu[-1] == T, (B, cu, T)
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = None if cu_seqlens is None else torch.zeros(B, T, H, V, dtype=torch.float64, device=device)
    final = torch.zeros(len(seqs), H, K, V, dtype=torch.float64, device=device)
    if cu_seqlens is None:
        groups = [(list(range(B)), 0, T)]  # all batch rows at once
    else:
        groups = [([n], s, e) for n, (_, s, e) in enumerate(seqs)]
    for rows, s, e in groups:
        L = e - s
        if L == 0:
            if s0 is not None:
                final[rows] = s0[rows]
            continue
        nb = B if cu_seqlens is None else 1

        def part(x):  # the batch rows and time steps of this group
            return x if cu_seqlens is None else x[:, s:e]

        def rows_of(x, d):  # [nb, L, H, d] -> [nb*H, L, d]
            return part(x).permute(0, 2, 1, 3).reshape(nb * H, L, d)

        qq, kk, vv = rows_of(q, K), rows_of(k, K), rows_of(v, V)
        gg = None if g is None else part(g).permute(0, 2, 1).reshape(nb * H, L)
        ss = None if s0 is None else s0[rows].reshape(len(rows) * H, K, V)
        n_rows = qq.shape[0]
        # Bound the memory of the C x C score tiles: rows per slice.
        per_row = math.ceil(L / chunk) * chunk * (chunk + K + V) + K * V * (math.ceil(L / chunk) + 2)
        step = max(1, min(n_rows, max_elems // max(1, per_row)))
        oo = torch.empty(n_rows, L, V, dtype=torch.float64, device=device)
        sf = torch.empty(n_rows, K, V, dtype=torch.float64, device=device)
        for a in range(0, n_rows, step):
            z = slice(a, min(n_rows, a + step))
            oo[z], sf[z] = _ref_dense(qq[z], kk[z], vv[z], None if gg is None else gg[z],
                                      None if ss is None else ss[z], scale, chunk)
        if cu_seqlens is None:
            o = oo.reshape(B, H, L, V).permute(0, 2, 1, 3)
        else:
            o[:, s:e] = oo.reshape(1, H, L, V).permute(0, 2, 1, 3)
        final[rows] = sf.reshape(len(rows), H, K, V)
    return o, final


def rel_err_t(out, ref):
    import torch
    diff = torch.linalg.vector_norm((out - ref).flatten()).item()
    den = torch.linalg.vector_norm(ref.flatten()).item()
    return diff / den if den > 0 else (0.0 if diff == 0 else float("inf"))


def logsigmoid_np(x):
    return -np.logaddexp(0.0, -x)


def validate_reference(device, chunk):
    """The torch float64 oracle against tests/python/reference.py (naive numpy recurrence)."""
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import reference  # noqa: E402

    import torch
    checks = []
    configs = [
        # name, B, T, H, K, V, gate, init, cu, chunk
        ("gate+init", 2, 300, 2, 16, 24, True, True, None, chunk),
        ("gate+init C=64", 2, 300, 2, 16, 24, True, True, None, 64),
        ("nogate", 2, 300, 2, 16, 16, False, False, None, chunk),
        ("nogate+init C=16", 1, 70, 3, 8, 12, False, True, None, 16),
        ("varlen gate+init", 1, 300, 2, 16, 16, True, True, [0, 1, 100, 250, 300], 64),
        ("varlen nogate", 1, 300, 2, 16, 16, False, False, [0, 0, 37, 300], chunk),
    ]
    worst = 0.0
    for i, (name, B, T, H, K, V, gate, init, cu, C) in enumerate(configs):
        rng = np.random.default_rng(12345 + i)
        q = rng.standard_normal((B, T, H, K))
        k = rng.standard_normal((B, T, H, K))
        v = rng.standard_normal((B, T, H, V))
        g = logsigmoid_np(rng.standard_normal((B, T, H)) + 1.0) if gate else None
        N = len(cu) - 1 if cu else B
        s0 = rng.standard_normal((N, H, K, V)) if init else None
        o_n, s_n = reference.linear_attn(q, k, v, g=g, initial_state=s0, cu_seqlens=cu)
        o_t, s_t = ref_linear_attn(q, k, v, g=g, initial_state=s0, cu_seqlens=cu, chunk=C, device=device)
        eo = rel_err_t(o_t, torch.from_numpy(o_n).to(device))
        es = rel_err_t(s_t, torch.from_numpy(s_n).to(device))
        worst = max(worst, eo, es)
        checks.append({"name": name, "o_err": eo, "state_err": es})
        log(f"  reference check {name:<18} o {eo:.2e}  state {es:.2e}")
    return worst, checks


# ---------------------------------------------------------------------------------------------------
# Cases


def make_cases():
    cases = []
    for shape in BIG_SHAPES:
        for gate in (False, True):
            B, T, H, D = shape
            cases.append(dict(B=B, T=T, H=H, K=D, V=D, gate=gate, dtype="bf16", init=False, cu=None))
    for gate in (False, True):
        cases.append(dict(B=8, T=1024, H=8, K=64, V=64, gate=gate, dtype="fp32", init=True, cu=None))
    for dtype, gate in (("fp32", False), ("fp32", True), ("bf16", True)):
        cases.append(dict(B=2, T=1000, H=4, K=64, V=64, gate=gate, dtype=dtype, init=True, cu=None))
    for dtype, gate in (("fp32", False), ("fp32", True), ("bf16", True)):
        cases.append(dict(B=2, T=1000, H=4, K=64, V=128, gate=gate, dtype=dtype, init=True, cu=None))
    for dtype, gate in (("fp32", False), ("fp32", True), ("bf16", True)):
        cases.append(dict(B=1, T=VARLEN_CU[-1], H=4, K=64, V=64, gate=gate, dtype=dtype, init=True,
                          cu=list(VARLEN_CU)))
    for c in cases:
        c["name"] = case_name(c)
    return cases


def case_name(c):
    kv = f"K{c['K']}" if c["K"] == c["V"] else f"K{c['K']}V{c['V']}"
    s = f"{c['dtype']} {c['B']}x{c['T']}x{c['H']} {kv} {'g' if c['gate'] else 'nog'}"
    if c["init"]:
        s += " init"
    if c["cu"]:
        s += " varlen"
    return s


def make_inputs(c, seed, device):
    """Random inputs on the GPU, rounded to bf16 for bf16 cases; returned as float32 numpy arrays."""
    import torch
    import torch.nn.functional as F
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    B, T, H, K, V = c["B"], c["T"], c["H"], c["K"], c["V"]

    def rnd(*shape):
        x = torch.randn(*shape, device=device, dtype=torch.float32, generator=gen)
        return x

    def fin(x):
        if c["dtype"] == "bf16":
            x = x.to(torch.bfloat16).to(torch.float32)  # round to nearest even
        return x.cpu().numpy()

    inputs = {"q": fin(rnd(B, T, H, K)), "k": fin(rnd(B, T, H, K)), "v": fin(rnd(B, T, H, V))}
    if c["gate"]:
        inputs["g"] = fin(F.logsigmoid(rnd(B, T, H)))
    N = len(c["cu"]) - 1 if c["cu"] else B
    if c["init"]:
        inputs["initial_state"] = fin(rnd(N, H, K, V))
    if c["cu"]:
        inputs["cu_seqlens"] = np.asarray(c["cu"], dtype=np.int32)
    return inputs


def linac_cmd(linac, workdir, inputs, outputs, dtype, device):
    cmd = [str(linac), "run", "linear_attn"]
    for name in inputs:
        cmd.append(f"{name}={workdir / (name + '.npy')}")
    for name, path in outputs.items():
        cmd += ["-o", f"{name}={path}"]
    cmd += ["--device", device]
    if dtype == "bf16":
        cmd += ["--dtype", "bf16"]
    return cmd


def run_linac(cmd, timeout):
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s", time.time() - t0
    except OSError as exc:
        return f"cannot run {cmd[0]}: {exc}", time.time() - t0
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {(proc.stderr.strip() or proc.stdout.strip())[-2000:]}", time.time() - t0
    return None, time.time() - t0


def check_array(name, path, ref, tol, device):
    """Compares the float32 .npy at `path` with the float64 torch `ref`. Returns (err or None, problem)."""
    import torch
    if not path.is_file():
        return None, f"{name}: not written"
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        return None, f"{name}: unreadable ({exc})"
    if arr.dtype != np.float32:
        return None, f"{name}: dtype {arr.dtype}, expected float32"
    if tuple(arr.shape) != tuple(ref.shape):
        return None, f"{name}: shape {tuple(arr.shape)}, expected {tuple(ref.shape)}"
    t = torch.from_numpy(arr).to(device)
    del arr
    n_bad = int((~torch.isfinite(t)).sum().item())
    if n_bad:
        return None, f"{name}: {n_bad} non-finite values"
    err = rel_err_t(t.to(torch.float64), ref)
    if not err < tol:
        return err, f"{name}: rel err {err:.3g} >= {tol:g}"
    return err, None


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def pick_tmpdir(requested, need_bytes):
    if requested:
        return Path(requested)
    for cand in ("/dev/shm", tempfile.gettempdir()):
        try:
            if os.path.isdir(cand) and os.access(cand, os.W_OK) and shutil.disk_usage(cand).free > need_bytes:
                return Path(cand)
        except OSError:
            pass
    return Path(tempfile.gettempdir())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--linac", default=str(REPO / "build" / "linac"), help="linac binary (default build/linac)")
    ap.add_argument("--device", default="cuda", help="linac's --device (default cuda; cpu runs the interpreter)")
    ap.add_argument("--ref-device", help="torch device of the float64 oracle (default cuda if available, else cpu)")
    ap.add_argument("--ref-chunk", type=int, default=256, help="the oracle's chunk size (default 256)")
    ap.add_argument("--filter", action="append", default=[],
                    help="run only cases whose name contains this substring (repeatable; any matches); "
                         "see --list")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--no-determinism", action="store_true", help="skip the determinism runs")
    ap.add_argument("--det-shape", default="x".join(map(str, DETERMINISM_SHAPE)), metavar="BxTxHxD",
                    help="shape of the determinism case (default %(default)s; bf16, initial state)")
    ap.add_argument("--validate-only", action="store_true", help="only check the oracle against reference.py")
    ap.add_argument("--bf16-tol", type=float, default=2e-2)
    ap.add_argument("--fp32-tol", type=float, default=1e-4)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per linac call (default 300)")
    ap.add_argument("--tmpdir", help="where the .npy files go (default /dev/shm when it has room, else $TMPDIR)")
    ap.add_argument("--json", help="where to write the results (default $OUT/gpu_check.json if $OUT is set, "
                                   "else gpu_check.json)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    try:
        det = [int(x) for x in args.det_shape.lower().split("x")]
        assert len(det) == 4 and min(det) > 0
    except (ValueError, AssertionError):
        ap.error(f"--det-shape {args.det_shape}: expected BxTxHxD")
    cases = make_cases()
    if args.filter:
        cases = [c for c in cases if any(f in c["name"] for f in args.filter)]
    if args.list:
        for c in cases:
            out(c["name"])
        out(f"determinism: bf16 {args.det_shape} init (nog, g), {DETERMINISM_RUNS} runs each")
        return 0
    json_path = Path(args.json) if args.json else (
        Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else Path("gpu_check.json"))

    import torch
    ref_device = args.ref_device or ("cuda" if torch.cuda.is_available() else "cpu")
    env = {"torch": torch.__version__, "ref_device": ref_device, "linac": args.linac, "device": args.device,
           "ref_chunk": args.ref_chunk, "bf16_tol": args.bf16_tol, "fp32_tol": args.fp32_tol}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    out(f"torch {env['torch']}, oracle on {ref_device}, GPU {env.get('gpu', 'none')}, linac --device {args.device}")
    report = {"env": env, "reference_check": None, "cases": [], "determinism": []}

    def save():
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))

    t_start = time.time()
    log("checking the float64 oracle against tests/python/reference.py ...")
    worst, checks = validate_reference(ref_device, args.ref_chunk)
    report["reference_check"] = {"worst": worst, "checks": checks}
    if not worst < 1e-10:
        out(f"ABORT: the torch float64 oracle disagrees with reference.py: worst rel err {worst:.3g} >= 1e-10")
        save()
        return 2
    out(f"oracle agrees with reference.py (worst rel err {worst:.1e})")
    if args.validate_only:
        save()
        return 0

    linac = Path(args.linac)
    if not (linac.is_file() and os.access(linac, os.X_OK)):
        out(f"FAIL: linac binary not found at {linac}")
        report["error"] = "linac binary not found"
        save()
        return 1

    biggest = max((c["B"] * c["T"] * c["H"] * (2 * c["K"] + 2 * c["V"]) * 4 for c in cases), default=0)
    tmp_root = pick_tmpdir(args.tmpdir, 2 * biggest + (1 << 30))
    workdir = Path(tempfile.mkdtemp(prefix="linac_gpu_check_", dir=tmp_root))
    env["tmpdir"] = str(workdir)
    log(f"temporary files in {workdir}")

    failures = 0
    try:
        for idx, c in enumerate(cases):
            tol = args.bf16_tol if c["dtype"] == "bf16" else args.fp32_tol
            r = {k: c[k] for k in ("name", "B", "T", "H", "K", "V", "gate", "dtype", "init", "cu")}
            r["tol"] = tol
            log(f"[{idx + 1}/{len(cases)}] {c['name']} (elapsed {time.time() - t_start:.0f} s)")
            t0 = time.time()
            problems = []
            try:
                inputs = make_inputs(c, args.seed * 1000 + idx, ref_device)
                for name, arr in inputs.items():
                    np.save(workdir / f"{name}.npy", arr)
                outputs = {"o": workdir / "out_o.npy", "final_state": workdir / "out_final_state.npy"}
                for p in outputs.values():
                    p.unlink(missing_ok=True)  # nothing stale can pass for an output
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                err, wall = run_linac(linac_cmd(linac, workdir, inputs, outputs, c["dtype"], args.device),
                                      args.timeout)
                r["linac_s"] = wall
                if err:
                    problems.append(f"linac: {err}")
                else:
                    o_ref, s_ref = ref_linear_attn(inputs["q"], inputs["k"], inputs["v"], g=inputs.get("g"),
                                                   initial_state=inputs.get("initial_state"), cu_seqlens=c["cu"],
                                                   chunk=args.ref_chunk, device=ref_device)
                    del inputs
                    e, p = check_array("o", outputs["o"], o_ref, tol, ref_device)
                    r["o_err"] = e
                    if p:
                        problems.append(p)
                    del o_ref
                    e, p = check_array("final_state", outputs["final_state"], s_ref, tol, ref_device)
                    r["state_err"] = e
                    if p:
                        problems.append(p)
                    del s_ref
            except Exception as exc:  # noqa: BLE001
                problems.append(f"script error: {type(exc).__name__}: {exc}")
                log(traceback.format_exc())
            finally:
                for p in workdir.iterdir():
                    p.unlink()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            r["ok"] = not problems
            r["problems"] = problems
            r["case_s"] = time.time() - t0
            failures += not r["ok"]
            log(f"    {'ok  ' if r['ok'] else 'FAIL'} o {fmt_err(r.get('o_err'))} state {fmt_err(r.get('state_err'))} "
                f"linac {r.get('linac_s', 0):.1f} s, case {r['case_s']:.1f} s"
                + ("" if r["ok"] else f": {'; '.join(problems)[:300]}"))
            report["cases"].append(r)
            save()

        if not args.no_determinism:
            B, T, H, D = (int(x) for x in args.det_shape.lower().split("x"))
            for gate in (False, True):
                c = dict(B=B, T=T, H=H, K=D, V=D, gate=gate, dtype="bf16", init=True, cu=None)
                c["name"] = case_name(c)
                d = {"name": c["name"], "runs": DETERMINISM_RUNS}
                log(f"determinism: {c['name']} x {DETERMINISM_RUNS} (elapsed {time.time() - t_start:.0f} s)")
                problems = []
                try:
                    inputs = make_inputs(c, args.seed * 1000 + 900 + gate, ref_device)
                    for name, arr in inputs.items():
                        np.save(workdir / f"{name}.npy", arr)
                    digests = []
                    for i in range(DETERMINISM_RUNS):
                        outputs = {"o": workdir / "det_o.npy", "final_state": workdir / "det_s.npy"}
                        for p in outputs.values():
                            p.unlink(missing_ok=True)
                        err, _ = run_linac(linac_cmd(linac, workdir, inputs, outputs, c["dtype"], args.device),
                                           args.timeout)
                        if err:
                            problems.append(f"run {i}: linac: {err}")
                            break
                        if not all(p.is_file() for p in outputs.values()):
                            problems.append(f"run {i}: outputs not written")
                            break
                        digests.append((file_digest(outputs["o"]), file_digest(outputs["final_state"])))
                    d["distinct_o"] = len({x[0] for x in digests})
                    d["distinct_state"] = len({x[1] for x in digests})
                    if digests and (d["distinct_o"] > 1 or d["distinct_state"] > 1):
                        problems.append(f"outputs differ between runs: {d['distinct_o']} distinct o, "
                                        f"{d['distinct_state']} distinct final_state over {len(digests)} runs")
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"script error: {type(exc).__name__}: {exc}")
                    log(traceback.format_exc())
                finally:
                    for p in workdir.iterdir():
                        p.unlink()
                d["ok"] = not problems
                d["problems"] = problems
                failures += not d["ok"]
                log(f"    {'ok' if d['ok'] else 'FAIL: ' + '; '.join(problems)[:300]}")
                report["determinism"].append(d)
                save()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    total = time.time() - t_start
    env["total_s"] = total
    out("")
    hdr = f"{'case':<36} {'o rel err':>10} {'state err':>10} {'tol':>7} {'linac s':>8}  result"
    out(hdr)
    out("-" * len(hdr))
    for r in report["cases"]:
        out(f"{r['name']:<36} {fmt_err(r.get('o_err')):>10} {fmt_err(r.get('state_err')):>10} {r['tol']:7.0e} "
            f"{r.get('linac_s', 0):8.1f}  {'ok' if r['ok'] else 'FAIL: ' + '; '.join(r['problems'])[:200]}")
    for d in report["determinism"]:
        out(f"{'determinism ' + d['name']:<36} {'':>10} {'':>10} {'':>7} {'':>8}  "
            f"{'ok (bitwise identical x%d)' % d['runs'] if d['ok'] else 'FAIL: ' + '; '.join(d['problems'])[:200]}")
    n = len(report["cases"]) + len(report["determinism"])
    out(f"{n - failures} passed, {failures} failed ({total:.0f} s)")
    report["passed"] = n - failures
    report["failed"] = failures
    save()
    out(f"wrote {json_path}")
    return 1 if failures else 0


def fmt_err(e):
    return "-" if e is None else f"{e:.2e}"


if __name__ == "__main__":
    sys.exit(main())
