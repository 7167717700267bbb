"""tools/sass_hotspots.py on a small ncu source-page export written here (the real ones come from the GPU
machine: scripts/gpu_profile.sh)."""

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "sass_hotspots.py"
sys.path.insert(0, str(REPO / "tools"))
import sass_hotspots  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_barrier", "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]
ROWS = [
    ["0x7f00000000a0", "      @P1 LDG.E.128 R4, desc[UR8][R2.64]", "5", "5", "100", "0", "0", "5", "0"],
    ["0x7f00000000b0", "      @P1 PRMT R8, R4, 0x7610, R8", "60", "58", "100", "0", "55", "5", "50"],
    ["0x7f00000000c0", "      BAR.SYNC.DEFER_BLOCKING 0x0", "30", "30", "100", "30", "0", "0", "0"],
    ["0x7f00000000d0", "      HMMA.16816.F32.BF16 R12, R16, R20, RZ", "5", "1", "400", "0", "0", "5", "0"],
]


def write_export(path, rows=ROWS, header=HEADER):
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(["Kernel Name", "k"])
    w.writerow(header)
    for r in rows:
        w.writerow(r)
    path.write_text(buf.getvalue())


def test_opcode_drops_predicate_and_modifiers():
    assert sass_hotspots.opcode("@!P2 LDG.E.128 R4, [R2]") == "LDG"
    assert sass_hotspots.opcode("HMMA.16816.F32.BF16 R1, R2, R3, RZ") == "HMMA"
    assert sass_hotspots.opcode("") == "?"


def test_summary_shares_and_ranking(tmp_path):
    f = tmp_path / "k.sass.csv"
    write_export(f)
    out = subprocess.run([sys.executable, str(TOOL), str(f), "--top", "2"], capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "samples 100, instructions 4, warp instructions executed 700"
    # Stall reasons over all samples: 55 long_sb, 30 barrier, 15 wait (the Not Issued column is not counted).
    assert "stalls:      long_sb 55.0%, barrier 30.0%, wait 15.0%" == lines[1]
    assert lines[2].startswith("samples on:  PRMT 60.0%, BAR 30.0%")
    assert lines[3].startswith("executed:    HMMA 57.1%")
    # The two instructions with the most samples, most first.
    assert "PRMT R8, R4" in lines[5] and "60  60.0%" in lines[5]
    assert "BAR.SYNC" in lines[6]
    assert len(lines) == 7


def test_not_an_export_is_a_clear_error(tmp_path):
    f = tmp_path / "details.txt"
    f.write_text("  delta_rule_wy (128, 128, 1)x(128, 1, 1)\n    Duration  us  591.17\n")
    r = subprocess.run([sys.executable, str(TOOL), str(f)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "not an `ncu --page source --csv` export" in r.stderr


def test_export_without_source_counters_is_a_clear_error(tmp_path):
    f = tmp_path / "k.sass.csv"
    write_export(f, rows=[r[:2] for r in ROWS], header=HEADER[:2])
    r = subprocess.run([sys.executable, str(TOOL), str(f)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "missing" in r.stderr


DISASM = """
        .text.k:
        //## File "/elsewhere/kernels/delta_rule/bwd.cpp", line 7
        /*0000*/                   @P1 LDG.E.128 R4, desc[UR8][R2.64] ;   /* 0x000fe200000001ff */
        //## File "/elsewhere/kernels/delta_rule/bwd.cpp", line 9
        /*0010*/                   @P1 PRMT R8, R4, 0x7610, R8 ;
        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        //## File "/elsewhere/dsl/src/blocks.cpp", line 3
        /*0030*/                   HMMA.16816.F32.BF16 R12, R16, R20, RZ ;
"""


def test_source_lines_from_nvdisasm(tmp_path):
    f = tmp_path / "k.sass.csv"
    write_export(f)
    d = tmp_path / "k.disasm"
    d.write_text(DISASM)
    assert sass_hotspots.line_table(DISASM) == {0: ("/elsewhere/kernels/delta_rule/bwd.cpp", 7),
                                                0x10: ("/elsewhere/kernels/delta_rule/bwd.cpp", 9),
                                                0x20: ("/elsewhere/kernels/delta_rule/bwd.cpp", 9),
                                                0x30: ("/elsewhere/dsl/src/blocks.cpp", 3)}
    out = subprocess.run([sys.executable, str(TOOL), str(f), "--top", "2", "--lines", str(d)], capture_output=True,
                         text=True, check=True).stdout
    lines = out.splitlines()
    i = next(n for n, text in enumerate(lines) if text.startswith("top 2 source lines by samples"))
    # Line 9 holds PRMT + BAR: 90 of 100 samples, 200 of 700 executed; line 7 and 3 tie at 5 samples.
    assert lines[i + 1].startswith("   90.0%  28.6%  bwd.cpp:9  ")
    # The recorded path is another machine's: the text comes from this checkout's file at that line.
    repo_line = (REPO / "kernels/delta_rule/bwd.cpp").read_text().splitlines()[8].strip()
    assert repo_line
    assert lines[i + 1].endswith(repo_line[:80])
    # Under it, the line's executed instructions by opcode: 100 PRMT and 100 BAR.
    assert lines[i + 2].split() == ["PRMT", "50%,", "BAR", "50%"]
    assert len(lines) == i + 5


def test_disassembly_without_line_info_is_a_clear_error(tmp_path):
    f = tmp_path / "k.sass.csv"
    write_export(f)
    d = tmp_path / "k.disasm"
    d.write_text("        /*0000*/                   NOP ;\n")
    r = subprocess.run([sys.executable, str(TOOL), str(f), "--lines", str(d)], capture_output=True, text=True)
    assert r.returncode != 0 and "no '//## File' line marks" in r.stderr
