#!/usr/bin/env python3
"""Runs the FileCheck tests of tests/ir: each file holds one or more lines

    // RUN: <command using %linac, %s, %t and FileCheck>

and CHECK patterns. %linac is the CLI, %s this file with its comment lines blanked (so .tir files need
no comment syntax and line numbers stay right), %t a scratch path. Fails on the first failing RUN line
of each file and reports every failure at the end."""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LINAC = os.environ.get("LINAC_BIN", str(ROOT / "build" / "linac"))
FILECHECK = os.environ.get("FILECHECK", "/usr/lib/llvm-22/bin/FileCheck")


def main() -> int:
    for tool in (LINAC, FILECHECK):
        if not os.access(tool, os.X_OK):
            print(f"run_filecheck: {tool} not found or not executable", file=sys.stderr)
            return 1
    files = sorted(p for p in HERE.iterdir() if p.suffix in (".tir", ".check"))
    failures = []
    count = 0
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            text = f.read_text()
            runs = re.findall(r"^//\s*RUN:\s*(.*)$", text, re.M)
            if not runs:
                continue
            blanked = Path(tmp) / f.name
            blanked.write_text("".join("\n" if l.lstrip().startswith("//") else l
                                       for l in text.splitlines(keepends=True)))
            for run in runs:
                count += 1
                cmd = (run.replace("%linac", LINAC).replace("FileCheck", FILECHECK)
                       .replace("%s", str(blanked)).replace("%t", str(Path(tmp) / (f.stem + ".tmp"))))
                # FileCheck reads its patterns from the original file (with the comments).
                cmd = cmd.replace(f"{FILECHECK} {blanked}", f"{FILECHECK} {f}")
                r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)
                if r.returncode != 0:
                    failures.append((f.name, run, r.stdout + r.stderr))
    for name, run, out in failures:
        print(f"FAIL {name}: {run}\n{out}")
    print(f"{count - len(failures)}/{count} FileCheck runs passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
