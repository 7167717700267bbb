#!/usr/bin/env python3
"""Mutation fuzzing of what a user hands the CLI: tile IR text, edited LLVM stage overrides and .npy
files (issue 23, point 8). Every case must end as a success or a one-line user error (exit 0 or 1), within
its time limit: no crash (a signal, LLVM's abort), no hang, no internal error (exit 2).

  python3 tests/fuzz/fuzz_cli.py [--cases N] [--seed S] [--kinds tir,ll,npy] [--keep DIR]

CI runs a fixed number of cases per kind (tests/python/test_fuzz.py); run more by hand. A failing case is
written to --keep (default: a temporary directory) with the command that failed; add it to
tests/fuzz/regress/ to keep it failing-free.
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30


def binary():
    return os.environ.get("LINAC_BIN", str(REPO / "build" / "linac"))


# --- mutations ---------------------------------------------------------------------------------------

NUMBERS = ["0", "1", "-1", "3", "16", "64", "127", "4096", "65536", "2147483647", "-2147483648",
           "9223372036854775807", "1e308", "nan", "inf"]


def mutate_text(text, rng):
    """One random edit of a text file: delete, duplicate or swap lines, replace a number or a token,
    truncate."""
    lines = text.splitlines(keepends=True)
    if not lines:
        return text
    kind = rng.randrange(6)
    i = rng.randrange(len(lines))
    if kind == 0:
        del lines[i]
    elif kind == 1:
        lines.insert(i, lines[rng.randrange(len(lines))])
    elif kind == 2:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == 3:
        words = lines[i].split(" ")
        nums = [k for k, w in enumerate(words) if any(c.isdigit() for c in w)]
        if nums:
            k = rng.choice(nums)
            tail = "".join(c for c in words[k] if not (c.isdigit() or c in "-."))
            words[k] = rng.choice(NUMBERS) + (tail if rng.random() < 0.5 else "")
            lines[i] = " ".join(words)
    elif kind == 4:
        words = lines[i].split(" ")
        other = rng.choice(lines).split(" ")
        if len(words) > 1 and other:
            words[rng.randrange(len(words))] = rng.choice(other).strip()
            lines[i] = " ".join(words) + ("\n" if not lines[i].endswith("\n") or True else "")
    else:
        cut = rng.randrange(len(text) + 1)
        return text[:cut]
    return "".join(lines)


def mutate_bytes(data, rng, header_bytes):
    """One random edit of a binary file, mostly in its first `header_bytes` bytes."""
    b = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0 and b:
        i = rng.randrange(min(len(b), header_bytes))
        b[i] = rng.randrange(256)
    elif kind == 1:
        i = rng.randrange(min(len(b), header_bytes) + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
    elif kind == 2:
        del b[rng.randrange(len(b) + 1):]
    else:
        text = bytes(b[:header_bytes]).decode("latin-1")
        text = mutate_text(text.replace(", ", " , "), rng).replace(" , ", ", ")
        b[:header_bytes] = text.encode("latin-1", "replace")
    return bytes(b)


# --- running ------------------------------------------------------------------------------------------

def run(cmd, cwd, env=None):
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return "hang", f"no answer in {TIMEOUT_S} s"
    if p.returncode in (0, 1) and "internal error" not in p.stderr:
        return None, None
    if p.returncode < 0:
        return "crash", f"signal {-p.returncode}: {p.stderr[-400:]}"
    return "error", f"exit {p.returncode}: {p.stderr[-400:]}"


def tir_seeds():
    return sorted((REPO / "tests" / "ir").glob("*.tir")) + sorted((REPO / "tests" / "regress").glob("*.tir"))


def fuzz_tir(rng, work, n):
    seeds = [p.read_text() for p in tir_seeds()]
    for case in range(n):
        text = rng.choice(seeds)
        for _ in range(rng.randrange(1, 4)):
            text = mutate_text(text, rng)
        f = work / f"tir_{case}.tir"
        f.write_text(text)
        emit = rng.choice(["tir", "tir", "layouts", "smem", "ptx"])
        yield f, [binary(), "compile", str(f), "--emit", emit], None


def fuzz_ll(rng, work, n):
    dump = work / "dump"
    if not dump.exists():
        p = subprocess.run([binary(), "dump", "linear_attn", "--dir", str(dump)], capture_output=True, text=True,
                           timeout=300)
        if p.returncode != 0:
            raise SystemExit(f"fuzz: linac dump failed: {p.stderr}")
    kernel = sorted(d for d in dump.iterdir() if (d / "5-optimized.ll").is_file())[0]
    pristine = (kernel / "5-optimized.ll").read_text()
    for case in range(n):
        over = work / f"ll_{case}"
        shutil.rmtree(over, ignore_errors=True)
        kdir = over / kernel.name
        kdir.mkdir(parents=True)
        shutil.copy(kernel / "1-recorded.tir", kdir / "1-recorded.tir")
        text = pristine
        for _ in range(rng.randrange(1, 3)):
            text = mutate_text(text, rng)
        (kdir / "5-optimized.ll").write_text(text)
        env = dict(os.environ, LINAC_OVERRIDE_DIR=str(over))
        yield kdir / "5-optimized.ll", [binary(), "compile", "linear_attn", "--emit", "ptx"], env


def fuzz_npy(rng, work, n):
    q = np.random.default_rng(1).standard_normal((1, 8, 1, 8)).astype(np.float32)
    for name in "kv":
        np.save(work / f"{name}.npy", q)
    np.save(work / "q_pristine.npy", q)
    pristine = (work / "q_pristine.npy").read_bytes()
    for case in range(n):
        f = work / f"q_{case}.npy"
        data = pristine
        for _ in range(rng.randrange(1, 3)):
            data = mutate_bytes(data, rng, 128)
        f.write_bytes(data)
        yield f, [binary(), "run", "linear_attn", f"q={f}", f"k={work / 'k.npy'}", f"v={work / 'v.npy'}", "-o",
                  f"o={work / 'o.npy'}", "--device", "cpu"], None


KINDS = {"tir": fuzz_tir, "ll": fuzz_ll, "npy": fuzz_npy}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100, help="cases per kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default="tir,ll,npy")
    ap.add_argument("--keep", help="where failing cases are copied (default: a temporary directory)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    failures = []
    with tempfile.TemporaryDirectory(prefix="linac-fuzz-") as tmp:
        work = Path(tmp)
        keep = Path(args.keep or tempfile.mkdtemp(prefix="linac-fuzz-failures-"))
        for kind in [k for k in args.kinds.split(",") if k]:
            counts = {"ok": 0}
            for path, cmd, env in KINDS[kind](rng, work, args.cases):
                what, detail = run(cmd, work, env)
                if what is None:
                    counts["ok"] += 1
                    continue
                counts[what] = counts.get(what, 0) + 1
                keep.mkdir(parents=True, exist_ok=True)
                kept = keep / f"{kind}_{len(failures)}{path.suffix}"
                shutil.copy(path, kept)
                failures.append(f"{kind}: {what}: {' '.join(cmd)} (input kept at {kept}): {detail}")
            print(f"fuzz {kind}: {args.cases} cases, " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    for f in failures:
        print("FAILED", f)
    print(f"fuzz: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
