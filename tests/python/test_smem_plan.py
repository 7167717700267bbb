"""Shared-memory plans never give the bytes of a buffer to another value while it is still read.

tests/regress/view_liveness.tir reads %x through a view (%xc) after %p and %red are spilled, so their
buffers must not overlap %x's bytes. (%q may: %x is last read while %q is computed, and the barrier
before %q's spill orders the two.) In the printed plan (printer numbering) %x is %5, %p is %9 and
%red is %10."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def plan(linac_bin, tir):
    r = subprocess.run([str(linac_bin), "compile", str(tir), "--emit", "smem"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    bufs = {}
    for line in r.stdout.splitlines():
        m = re.match(r"smem\s+(\d+)\s+\+(\d+)\s+(%\S+)", line)
        if m:
            bufs[m.group(3)] = (int(m.group(1)), int(m.group(1)) + int(m.group(2)))
    return bufs


def test_view_keeps_its_source_live(linac_bin):
    bufs = plan(linac_bin, ROOT / "tests" / "regress" / "view_liveness.tir")
    x = bufs["%5"]
    for name in ("%9", "%10"):
        lo, hi = bufs[name]
        assert hi <= x[0] or lo >= x[1], f"{name} {lo}..{hi} overlaps %x {x} while %x is still read"
