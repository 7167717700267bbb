"""tools/bench_poly_scaling.py and tools/plot_scaling.py at tiny sizes on the CPU interpreter (the real runs
are on the GPU machine: docs/poly-scaling.md). Checks the JSON's shape, the budget and bar logic, the
slopes printed and the PNG written; no timing is asserted."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "tools" / "bench_poly_scaling.py"
PLOT = REPO / "tools" / "plot_scaling.py"
TINY = ["--device", "cpu", "--batch", "1", "--heads", "2", "--dims", "16", "--iters", "1", "--warmup", "1"]
POINT_KEYS = {"method", "mode", "B", "H", "D", "T", "ms", "peak_bytes", "held_bytes", "iters", "status", "detail"}


def run(script, *args, cwd, check=True):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script.name} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def test_sweep_json_then_plot(tmp_path):
    out = tmp_path / "scaling.json"
    run(BENCH, *TINY, "--lengths", "64,128", "--json", out, cwd=tmp_path)
    doc = json.loads(out.read_text())
    for key in ("benchmark", "device", "torch", "date", "settings", "points"):
        assert key in doc, key
    assert doc["settings"]["lengths"] == [64, 128] and doc["settings"]["dtype"] == "fp32"
    assert doc["settings"]["poly"] == {"a": 1.0, "b": 1.0, "c": 0.5, "normalize": True}
    points = doc["points"]
    want = {(m, mode, T) for m in ("poly", "linear", "sdpa") for mode in ("fwd", "fwdbwd") for T in (64, 128)}
    assert {(p["method"], p["mode"], p["T"]) for p in points} == want and len(points) == len(want)
    for p in points:
        assert set(p) == POINT_KEYS, p
        assert (p["B"], p["H"], p["D"]) == (1, 2, 16)
        assert p["status"] == "ok", p
        assert p["ms"] > 0 and p["iters"] == 1, p
        assert p["peak_bytes"] is None, "the CPU has no memory figure"

    png = tmp_path / "fig.png"
    proc = run(PLOT, out, "--out", png, "--slope-min-t", "64", cwd=tmp_path)
    assert png.is_file() and png.stat().st_size > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for method in ("poly", "linear", "sdpa"):
        for mode in ("fwd", "fwdbwd"):
            line = rf"^\s*{mode}\s+{method}\s+1\s+2\s+16\s+2\s+-?\d+\.\d\d\s+n/a$"
            assert re.search(line, proc.stdout, re.M), f"no slope line for {mode} {method}:\n{proc.stdout}"


def test_plot_slopes_and_oom(tmp_path):
    # Synthetic points: time ~ T (poly), ~ T^2 (sdpa, out of memory at the last T); memory ~ T.
    points = []
    for method, power in (("poly", 1), ("sdpa", 2)):
        for T in (1024, 2048, 4096, 8192, 16384):
            oom = method == "sdpa" and T == 16384
            points.append({"method": method, "mode": "fwd", "B": 1, "H": 16, "D": 64, "T": T,
                           "ms": None if oom else 1e-3 * T ** power, "peak_bytes": None if oom else 100 * T,
                           "held_bytes": 0, "iters": 1, "status": "oom" if oom else "ok", "detail": ""})
    src = tmp_path / "synthetic.json"
    src.write_text(json.dumps({"device": "test", "torch": "-", "date": "-", "settings": {}, "points": points}))
    png = tmp_path / "synthetic.png"
    proc = run(PLOT, src, "--out", png, cwd=tmp_path)
    assert png.is_file() and png.stat().st_size > 0
    # Fitted over T >= 4096: poly's 3 points, sdpa's 2 (its OOM point has no time).
    assert re.search(r"^\s*fwd\s+poly\s+1\s+16\s+64\s+3\s+1\.00\s+1\.00$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^\s*fwd\s+sdpa\s+1\s+16\s+64\s+2\s+2\.00\s+1\.00$", proc.stdout, re.M), proc.stdout
    assert "sdpa fwd B=1 H=16 D=64 T=16384: oom" in proc.stdout


def test_time_budget_skips_larger_lengths(tmp_path):
    out = tmp_path / "budget.json"
    run(BENCH, *TINY, "--methods", "sdpa", "--modes", "fwd", "--lengths", "16,32,64", "--max-seconds", "1e-9",
        "--json", out, cwd=tmp_path)
    points = json.loads(out.read_text())["points"]
    assert [p["status"] for p in points] == ["ok", "skipped", "skipped"], points
    assert "over --max-seconds" in points[0]["detail"] and points[0]["ms"] > 0
    assert all(p["ms"] is None for p in points[1:])


def test_bars_report_every_bar(tmp_path):
    # The bars' logic at tiny lengths on the interpreter: every bar is printed with a verdict and its
    # numbers; the CPU has no memory figure, so the memory bar is "not measured" and the exit status is 1.
    out = tmp_path / "bars.json"
    proc = run(BENCH, "--device", "cpu", "--bars", "--bar-lengths", "16,32,128,256", "--bar-heads", "1",
               "--bar-dim", "16", "--bar-fla-dims", "16", "--bar-big-dim", "32", "--iters", "1", "--warmup", "1",
               # No time limit: on a loaded machine the extrapolated time of a point could pass the
               # default and skip it ("not measured"), which is the limit's logic, not the bars'.
               "--max-seconds", "100000", "--json", out, cwd=tmp_path, check=False)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(out.read_text())
    names = [b["name"] for b in doc["bars"]]
    assert names == ["fwd_8k", "fwd_64k_5x", "fwdbwd_64k_3x", "linear_fwd", "linear_fwdbwd", "memory_256k"]
    for b in doc["bars"][:5]:
        assert b["passed"] in (True, False), b
        assert re.search(rf"^\s*(PASS|FAIL)\s+{b['name']}\s", proc.stdout, re.M), proc.stdout
    assert doc["bars"][5]["passed"] is None
    assert re.search(r"^\s*not measured\s+memory_256k\s.*no memory figure on cpu", proc.stdout, re.M)
    assert doc["bars"][3]["claim"].endswith("[3.60, 4.40]")   # 128/32 = 4: the band
    assert "fla: not run" in proc.stdout and doc["reference"]["fla"].startswith("not run")
    # The reference points at D = 16 and D = 32 (poly, sdpa; fla's need CUDA) were run too.
    assert {(p["method"], p["D"]) for p in doc["points"]} >= {("poly", 32), ("sdpa", 32), ("poly", 16)}


@pytest.mark.parametrize("args, message", [
    (["--lengths", "128,64"], "ascending"),
    (["--lengths", "64,x"], "comma-separated integers"),
    (["--methods", "poly,flash"], "choose from poly, linear, sdpa"),
    (["--bars", "--bar-lengths", "1,2,3"], "four lengths"),
])
def test_bad_command_lines(tmp_path, args, message):
    proc = run(BENCH, "--device", "cpu", *args, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
