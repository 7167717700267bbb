"""Shared setup of the PyTorch-op tests: the `linac` package (installed with `pip install -e python`, else
taken from <repo>/python), the float64 references of tests/python, and the device.

The tests run on the CPU interpreter (tiny shapes); LINAC_TEST_DEVICE=cuda runs the same tests on CUDA
tensors. torch missing skips these tests with that reason; a missing or broken liblinac fails them.
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# The package from this checkout first (an editable install points here too), the references after.
sys.path.insert(0, str(REPO / "python"))
sys.path.append(str(REPO / "tests" / "python"))

DEVICE = os.environ.get("LINAC_TEST_DEVICE", "cpu")
