"""tools/train_compare.py --cpu: a small GLA / Gated DeltaNet model trains with linac's ops on the CPU
interpreter, its loss goes down, and its curve matches a naive PyTorch mixer's to fp32 rounding."""

import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("torch", reason="torch is not installed")


@pytest.mark.parametrize("mixer", ["gla", "gdn"])
def test_train_compare_cpu(mixer):
    out = subprocess.run([sys.executable, str(REPO / "tools" / "train_compare.py"), "--cpu", "--mixer", mixer],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.rstrip().endswith("ok"), out.stdout + out.stderr
