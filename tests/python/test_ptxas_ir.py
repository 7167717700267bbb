"""The IR test files whose lowering is new enough to want ptxas's word beside FileCheck's: each is
compiled to PTX for sm_80 and sm_90a and assembled with `ptxas -v`, which must accept it without
register spills. FileCheck (tests/ir) checks what the PTX says; this checks that ptxas takes it.

Needs ptxas from the CUDA toolkit (as test_ptxas.py: $PTXAS, PATH, $CUDA_HOME/bin or
/usr/local/cuda/bin); without it the module is skipped. It needs no GPU.
"""

import subprocess
from pathlib import Path

import pytest

from ptxas_util import find_ptxas
from test_ptxas import TARGETS, TIMEOUT_S, assemble, linac_path, parse_ptxas_report

PTXAS, PTXAS_ERROR = find_ptxas()
if PTXAS is None and PTXAS_ERROR is None:
    pytest.skip("ptxas (CUDA toolkit) is not installed: set $PTXAS or put ptxas on PATH to assemble the "
                "IR tests' kernels", allow_module_level=True)

IR_DIR = Path(__file__).resolve().parents[1] / "ir"
# Static slicing and assembly (slice, concat, place), and dots of slices read in place.
FILES = ("slice_concat_place.tir", "assemble_dot.tir")


def strip_comments(text):
    """The .tir text without its `//` lines (FileCheck patterns and RUN lines), which the parser would
    read as comments anyway; kept as blank lines so that locations stay right."""
    return "".join("\n" if line.lstrip().startswith("//") else line for line in text.splitlines(keepends=True))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", FILES)
def test_ir_file_assembles_without_spills(name, target, tmp_path):
    if PTXAS_ERROR:
        pytest.fail(PTXAS_ERROR, pytrace=False)
    tir = tmp_path / name
    tir.write_text(strip_comments((IR_DIR / name).read_text()))
    proc = subprocess.run([str(linac_path()), "compile", str(tir), "--emit", "ptx", "--target", target],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"`linac compile {name} --emit ptx --target {target}` exited " \
                                 f"{proc.returncode}:\n{proc.stderr}"
    ptx = tmp_path / f"{tir.stem}.{target}.ptx"
    ptx.write_text(proc.stdout)
    r = assemble(ptx, target)
    report = r.stdout + r.stderr
    assert r.returncode == 0, f"ptxas exited {r.returncode} on {ptx}:\n{report}"
    entries = parse_ptxas_report(report)
    assert entries, f"ptxas -v reported no entry function:\n{report}"
    for entry, regs, stack, stores, loads in entries:
        print(f"{name} {target}: {entry}: {regs} registers, {stores} bytes spill stores, {loads} bytes spill loads")
        assert stores == 0 and loads == 0, f"{entry} spills on {target}: {stores} stores, {loads} loads"
