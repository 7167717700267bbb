"""What a measuring tool records about its run (device, commit) and how it reports an error in one line;
shared by tools/bench_poly_scaling.py and tools/poly_accuracy.py."""
import os
import platform
import subprocess
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def git_commit():
    """HEAD of the checkout the tool runs from (a copy's own .git: on the GPU machine, whatever the copy
    carried, which may be older than its files), or None without one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except Exception:  # noqa: BLE001 - a copy without .git
        return None
