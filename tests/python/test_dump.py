"""`linac dump`: every stage of an op's kernels, the PTX annotated with DSL source lines, and (with
ptxas installed) the cubin and resource report."""
import re
import shutil
import subprocess


def test_dump_writes_every_stage_and_annotates_ptx(linac_bin, tmp_path):
    r = subprocess.run([str(linac_bin), "dump", "linear_attn", "--dir", str(tmp_path)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    first = tmp_path / "0-linear_attn_fwd"
    for name in ("1-recorded.tir", "2-layouts.tir", "3-smem-plan.txt", "4-lowered.ll", "5-optimized.ll",
                 "6-kernel.ptx", "7-annotated.txt"):
        assert (first / name).stat().st_size > 0, name
    annotated = (first / "7-annotated.txt").read_text()
    # Each run of PTX sits under "// <file>:<line>  <that line of the DSL source>".
    heads = re.findall(r"^// (\S+linear_attn/fwd\.cpp):(\d+)  (.*)$", annotated, re.M)
    assert heads, annotated[:2000]
    assert any("dot(" in text for _, _, text in heads), "no DSL line with a dot"
    assert "wgmma.mma_async" in annotated  # sm_90a, the default target: its dots on warpgroup tensor cores
    if shutil.which("ptxas") or shutil.os.path.exists("/usr/local/cuda/bin/ptxas"):
        assert (first / "8-kernel.cubin").stat().st_size > 0
        assert "registers" in (first / "9-resources.txt").read_text()
        assert re.search(r"\d+ registers", r.stdout)


def test_dump_needs_a_directory(linac_bin):
    r = subprocess.run([str(linac_bin), "dump", "linear_attn"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("linac: error:") and len(r.stderr.splitlines()) == 1
