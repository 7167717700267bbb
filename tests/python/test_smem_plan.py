"""Shared-memory plans never give the bytes of a buffer to another value while it is still read.

tests/regress/view_liveness.tir reads %x through a view (%xc) after %p and %red are spilled, so their
buffers must not overlap %x's bytes. (%q may: %x is last read while %q is computed, and the barrier
before %q's spill orders the two.) In the printed plan (printer numbering) %x is %5, %p is %9 and
%red is %10."""
import re
import subprocess
from pathlib import Path

import pytest

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


def smem_events(linac_bin, tir):
    """The shared-memory accesses and barriers of the kernel in `tir`, in emission order (unoptimized
    LLVM IR): ("R", line), ("W", line), ("CP", line) for an asynchronous copy into shared memory (cp.async
    or TMA's cp.async.bulk.tensor), or ("BAR", None) for a block barrier (not an mbarrier operation),
    `line` the tir line of the op emitting it."""
    r = subprocess.run([str(linac_bin), "compile", str(tir), "--emit", "llvm"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    text = r.stdout.splitlines()
    lines = {m.group(1): int(m.group(2)) for m in (re.match(r"!(\d+) = !DILocation\(line: (\d+)", t) for t in text) if m}
    events = []
    for t in text:
        dbg = re.search(r"!dbg !(\d+)", t)
        line = lines.get(dbg.group(1)) if dbg else None
        if "call" in t and "barrier" in t and "mbarrier" not in t:
            events.append(("BAR", None))
        elif "call" in t and ("cp.async" in t and "shared.global" in t or "cp.async.bulk.tensor" in t):
            events.append(("CP", line))
        elif re.search(r"\bstore .*addrspace\(3\)", t):
            events.append(("W", line))
        elif re.search(r"= load .*addrspace\(3\)", t):
            events.append(("R", line))
    return events


def test_barrier_between_dot_operand_reads_and_reuse_of_their_bytes(linac_bin):
    tir = ROOT / "tests" / "regress" / "dot_operand_reuse.tir"
    bufs = plan(linac_bin, tir)
    a, z = bufs["%3"], bufs["%8"]  # printer numbering: %a is %3, %z is %8
    assert z[0] < a[1] and a[0] < z[1], "the plan no longer reuses %a's bytes for %z: the test checks nothing"
    events = smem_events(linac_bin, tir)
    last_dot_read = max(i for i, e in enumerate(events) if e == ("R", 14))  # %d2 = dot %a, %x1
    first_z_write = min(i for i, e in enumerate(events) if e == ("W", 15))  # %z's spill
    assert last_dot_read < first_z_write
    assert ("BAR", None) in events[last_dot_read:first_z_write], \
        "no barrier between the dot's reads of %a and the write of %z into the same bytes"


def test_delta_rule_wy_prefetches_its_key_and_value_blocks(linac_bin):
    # delta_rule_wy at head dim 128, bf16 (chunk 64: four 16-row blocks; value blocks of 128: one): the
    # K and V blocks of every row block are copied with cp.async where they stand ("prefetched"), so
    # that their latency overlaps T's inverse. With U's value blocks in a loop, V waited in it (ncu: the
    # gated wy's hottest stall); the plan then shows four prefetched buffers instead of eight. (128 heads:
    # where the walks are few the value blocks are 64 columns: few_walks, kernels/common/device_limits.h.)
    # That is the W and U form (tform=0); by default (tform) the UT kernel reads no V: K's four alone.
    for config, blocks in (("tform=0", 8), ("tform=1", 4)):
        r = subprocess.run([str(linac_bin), "compile", "delta_rule", "--shape", "B=8,T=256,H=16,K=128", "--dtype",
                            "bf16", "--emit", "smem", "--config", config], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        wy = r.stdout.split("smem total")[0]  # the first kernel of the call: delta_rule_wy
        prefetched = re.findall(r"tile<16x128xbf16>.* prefetched", wy)
        assert len(prefetched) == blocks, (config, wy)


def test_ut_kernel_forming_t_alone_frees_k_for_the_inverse(linac_bin):
    # The gated UT kernel forming T alone from two halves (tform, the default at chunks of 64) forms A's
    # blocks across the halves with the others, before the inverse: K's blocks are dead by then and the
    # inverse's fp32 blocks take their bytes (shared memory 31.0 -> 21.5 KB, more programs per SM:
    # docs/ops/delta_rule.md, "Measured", session 32). It runs on 2 warps ([16, 16] products span two);
    # the W and U form on 4.
    for config, warps in (("tform=1", 2), ("tform=0", 4)):
        r = subprocess.run([str(linac_bin), "compile", "gated_delta_rule", "--shape", "B=8,T=256,H=16,K=128",
                            "--dtype", "bf16", "--emit", "smem", "--config", config], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        wy = r.stdout.split("smem total")[1]  # the call's second kernel: gated_delta_rule_wy
        spans = lambda kind: [(int(a), int(a) + int(n)) for a, n in re.findall(rf"smem +(\d+) \+(\d+) +%\d+ {kind}", wy)]
        if config == "tform=1":
            keys, inverse = spans(r"tile<16x128xbf16>.* prefetched"), spans(r"tile<16x16xf32>")
            assert len(keys) == 4 and inverse, wy
            assert any(a < d and c < b for a, b in keys for c, d in inverse), wy
        r = subprocess.run([str(linac_bin), "compile", "gated_delta_rule", "--shape", "B=8,T=256,H=16,K=128",
                            "--dtype", "bf16", "--emit", "tir", "--config", config], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        header = r.stdout.split("kernel @gated_delta_rule_wy(")[1].split("\n", 1)[0]
        assert f"num_warps = {warps}," in header, (config, header)


@pytest.mark.parametrize("tma", ["1", "0"])
def test_barrier_between_reads_before_a_loop_and_its_first_copies(linac_bin, tma, monkeypatch):
    monkeypatch.setenv("LINAC_TMA", tma)  # the loop's load by TMA (sm_90a's default) or cp.async
    tir = ROOT / "tests" / "regress" / "loop_copy_reuse.tir"
    bufs = plan(linac_bin, tir)
    a, x = bufs["%5"], bufs["%13"]  # printer numbering: %a is %5, the loop's %x is %13
    assert x[0] < a[1] and a[0] < x[1], "the plan no longer gives %a's bytes to %x: the test checks nothing"
    events = smem_events(linac_bin, tir)
    last_a_read = max(i for i, e in enumerate(events) if e == ("R", 13))  # %r = reduce %a
    first_copy = min(i for i, e in enumerate(events) if e[0] == "CP" and i > last_a_read)
    assert ("BAR", None) in events[last_a_read:first_copy], \
        "no barrier between the reads of %a and the loop's first copies into the same bytes"
