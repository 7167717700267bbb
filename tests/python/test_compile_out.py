"""`linac compile OP --out DIR` (issue 23, point 7): with several kernels, one file per kernel, each a
module that linac's parser reads back (tir) or ptxas assembles (ptx); stdout alone lists them one after
another."""
import subprocess

import pytest

from ptxas_util import find_ptxas


def files_of(linac, *args):
    proc = linac.run("compile", *args)
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.split()
    assert len(paths) > 1 and all((linac.workdir / p).is_file() for p in paths), proc.stdout
    return paths


def test_tir_files_round_trip(linac):
    for path in files_of(linac, "gla", "--emit", "tir", "--out", "tir"):
        text = (linac.workdir / path).read_text()
        assert text.count("\nkernel ") + text.startswith("kernel ") == 1, path
        again = linac.run("compile", path, "--emit", "tir")
        assert again.returncode == 0 and again.stdout == text, (path, again.stderr)


def test_ptx_files_assemble(linac):
    ptxas, why = find_ptxas()
    if ptxas is None:
        pytest.skip(why or "ptxas (CUDA toolkit) is not installed")
    for path in files_of(linac, "linear_attn", "--emit", "ptx", "--out", "ptx"):
        text = (linac.workdir / path).read_text()
        assert text.count(".entry ") == 1, path
        proc = subprocess.run([ptxas, "-arch=sm_90a", "-o", "/dev/null", str(linac.workdir / path)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (path, proc.stderr)
