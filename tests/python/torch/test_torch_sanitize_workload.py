"""tools/sanitize_ops.py (the workload compute-sanitizer checks on the GPU) runs every op and form on the
CPU interpreter at a tiny shape, so that the GPU run never finds it broken."""

import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("torch", reason="torch is not installed")


def test_sanitize_workload_runs_on_the_interpreter():
    out = subprocess.run([sys.executable, str(REPO / "tools" / "sanitize_ops.py"), "--device", "cpu", "--T", "40",
                          "--D", "16"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.rstrip().endswith("done: 24 calls on cpu"), out.stdout + out.stderr
