"""tools/gpu_check_ops.py (the GPU machine's check of gla and the delta rules at fla's shapes) on the CPU
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
    assert len(rows) == 6 and all(row["ok"] and row["bitwise_identical"] for row in rows), rows
    assert [row["runs"] for row in rows[:2]] == [2, 1]
