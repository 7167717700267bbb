#!/usr/bin/env python3
"""Where a kernel spends its time, from Nsight Compute's per-instruction source page.

    ncu --set full -k regex:KERNEL -c 1 -o rep ./build/linac bench OP ... --iters 1
    ncu -i rep.ncu-rep --page source --csv --print-source sass > KERNEL.sass.csv
    python3 tools/sass_hotspots.py KERNEL.sass.csv [--top N] [--lines KERNEL.disasm]

(scripts/gpu_profile.sh does the first two steps on the GPU machine.) Prints:
  - the warp-stall reasons over all samples (long_sb: waiting on global memory; short_sb: shared memory
    or MUFU; barrier: bar.sync; wait: fixed-latency dependencies; no_inst: instruction fetch);
  - the opcodes the samples sit on, and the opcodes executed (warp instructions);
  - the N instructions with the most samples, with their address, execution count and SASS;
  - with --lines (`nvdisasm -g` of the kernel's cubin, which linac links with line info): the N DSL
    source lines (the PTX's .loc) with the most samples, with their share of executed instructions
    and, under each, that line's instructions by opcode (e.g. a tf32x3 product's LDS, LOP3, FADD, HMMA).
A stall is charged to the instruction that waits, not to the one it waits for: a PRMT or F2FP at the
top right after an LDG is the wait for that load (read the SASS around it).
"""

import argparse
import collections
import csv
import re
import sys
from pathlib import Path


def opcode(sass):
    """The opcode of a SASS line without its predicate and modifiers: '@P1 LDG.E.128 R4, ..' -> 'LDG'."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def load(path):
    """(header, rows) of an ncu source-page CSV: its first line names the kernel, the second is the header."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for i, row in enumerate(rows):
        if "Address" in row and "Source" in row:
            header = row
            return header, [r for r in rows[i + 1:] if len(r) >= len(header)]
    raise SystemExit(f"{path}: no 'Address'/'Source' header: not an `ncu --page source --csv` export")


def counter_reader(header):
    """num(row, column name) -> the integer in that column ("1,234" -> 1234; blank or "-" -> 0)."""
    col = {name: i for i, name in enumerate(header)}

    def num(row, name):
        text = row[col[name]].replace(",", "")
        return int(float(text)) if text not in ("", "-") else 0

    return num


def summarize(header, rows, top):
    col = {name: i for i, name in enumerate(header)}
    samples_col = "Warp Stall Sampling (All Samples)"
    for needed in (samples_col, "Instructions Executed"):
        if needed not in col:
            raise SystemExit(f"column '{needed}' missing: export with --set full (source counters)")
    stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    num = counter_reader(header)

    total = sum(num(r, samples_col) for r in rows)
    executed = sum(num(r, "Instructions Executed") for r in rows)
    if total == 0:
        raise SystemExit("no stall samples in the export")
    stalls = collections.Counter({h[len("stall_"):]: sum(num(r, h) for r in rows) for h in stall_cols})
    by_op = collections.Counter()
    ex_op = collections.Counter()
    for r in rows:
        op = opcode(r[col["Source"]])
        by_op[op] += num(r, samples_col)
        ex_op[op] += num(r, "Instructions Executed")

    def shares(counter, whole, n):
        return ", ".join(f"{k} {v * 100 / whole:.1f}%" for k, v in counter.most_common(n) if v)

    out = [f"samples {total}, instructions {len(rows)}, warp instructions executed {executed}",
           f"stalls:      {shares(stalls, total, 8)}",
           f"samples on:  {shares(by_op, total, 12)}",
           f"executed:    {shares(ex_op, max(executed, 1), 12)}",
           f"top {top} instructions by samples (samples, % of all, address, times executed, SASS):"]
    ranked = sorted(rows, key=lambda r: num(r, samples_col), reverse=True)[:top]
    for r in ranked:
        s = num(r, samples_col)
        out.append(f"  {s:8d} {s * 100 / total:5.1f}%  {r[col['Address']][-6:]}  {num(r, 'Instructions Executed'):>10}  "
                   f"{r[col['Source']].strip()[:90]}")
    return "\n".join(out)


LINE_MARK = re.compile(r'//## File "([^"]+)", line (\d+)')
ADDRESS = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/")


def line_table(disasm_text):
    """{offset: (file, line)} from `nvdisasm -g` output: each instruction's offset in the function, charged
    to the last `//## File "...", line N` mark above it (the innermost location where marks are inlined)."""
    table, where = {}, None
    for text in disasm_text.splitlines():
        m = LINE_MARK.search(text)
        if m:
            where = (m.group(1), int(m.group(2)))
            continue
        a = ADDRESS.match(text)
        if a and where is not None:
            table[int(a.group(1), 16)] = where
    return table


def source_text(path, line):
    """The source line, from the path as recorded or, on another machine, the same path under this
    checkout (the longest tail of the recorded path that exists here)."""
    parts = Path(path).parts
    root = Path(__file__).resolve().parents[1]
    for cand in [Path(path)] + [root.joinpath(*parts[i:]) for i in range(1, len(parts))]:
        if cand.is_file():
            lines = cand.read_text(errors="replace").splitlines()
            return lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return ""


def by_source_line(header, rows, table, top):
    """The `top` source lines with the most samples (instructions with no line are '?')."""
    col = {name: i for i, name in enumerate(header)}
    num = counter_reader(header)

    addresses = [int(r[col["Address"]], 16) for r in rows]
    base = min(addresses) if addresses else 0
    samples, executed = collections.Counter(), collections.Counter()
    mix = collections.defaultdict(collections.Counter)  # per line: warp instructions executed by opcode
    for r, a in zip(rows, addresses):
        where = table.get(a - base, ("?", 0))
        samples[where] += num(r, "Warp Stall Sampling (All Samples)")
        executed[where] += num(r, "Instructions Executed")
        mix[where][opcode(r[col["Source"]])] += num(r, "Instructions Executed")
    total, ex_total = max(sum(samples.values()), 1), max(sum(executed.values()), 1)
    out = [f"top {top} source lines by samples (% of samples, % of executed, file:line, source; then the "
           f"line's executed instructions by opcode):"]
    for where, s in samples.most_common(top):
        f, line = where
        out.append(f"  {s * 100 / total:5.1f}% {executed[where] * 100 / ex_total:5.1f}%  {Path(f).name}:{line}  "
                   f"{source_text(f, line)[:80] if line else ''}")
        line_total = max(executed[where], 1)
        out.append("                 " + ", ".join(f"{op} {n * 100 / line_total:.0f}%"
                                                   for op, n in mix[where].most_common(5)))
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="`ncu --page source --csv --print-source sass` output")
    ap.add_argument("--top", type=int, default=20, help="instructions to list (default 20)")
    ap.add_argument("--lines", help="`nvdisasm -g` of the kernel's cubin: adds the source lines' shares")
    args = ap.parse_args(argv)
    header, rows = load(args.csv)
    print(summarize(header, rows, args.top))
    if args.lines:
        table = line_table(Path(args.lines).read_text(errors="replace"))
        if not table:
            raise SystemExit(f"{args.lines}: no '//## File' line marks: not `nvdisasm -g` of a cubin with line info")
        print(by_source_line(header, rows, table, args.top))


if __name__ == "__main__":
    sys.exit(main())
