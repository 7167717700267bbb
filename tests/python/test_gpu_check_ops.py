"""tools/gpu_check_ops.py (the GPU machine's check of gla, the delta rules and poly at fla's shapes) on the CPU
interpreter at small shapes: its oracle passes its self-check and every case passes, so that the tool
works when the GPU run comes."""
import json
import os
import subprocess
import sys

from conftest import REPO


def test_gpu_check_ops_on_the_interpreter(linac_bin, tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check_ops.py"), "--device", "cpu", "--shapes",
                        "2x40x2x16,1x33x3x8", "--repeats", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "LINAC_BIN": str(linac_bin)})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 8 and all(row["ok"] and row["bitwise_identical"] for row in rows), rows
    assert [row["runs"] for row in rows[:2]] == [2, 1]


def test_gpu_check_ops_skips_poly_above_head_dim_128(linac_bin, tmp_path):
    # fla's B8 T2048 H32 D256 is outside poly's contract (K up to 128): listed as skipped, not failed.
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check_ops.py"), "--device", "cpu", "--ops", "poly",
                        "--shapes", "1x9x1x256,1x12x1x16", "--repeats", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "LINAC_BIN": str(linac_bin)})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())
    assert "skipped" in rows[0] and rows[1]["ok"], rows
    assert "1/1 cases passed, 1 skipped" in r.stdout
