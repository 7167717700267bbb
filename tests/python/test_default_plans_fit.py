"""Every kernel a call launches at its default configuration fits the shared memory of a block of the GPU
it plans for: an sm_90 block (232448 bytes on an H100/H200) and an sm_80 one (166912 bytes on an A100:
`--target sm_80` plans for it), for every op, form and dtype at head dims 64, 128 and 256 (fla's
8x2048x32x256 shape; poly's K stops at 128).

`linac compile OP --shape S [--backward] --emit smem` plans exactly the kernels of that call, with no
GPU. The GPU reports an overflow only when the call runs ("kernel X needs N bytes of shared memory"),
as it did for the delta rules' fp32 backward at head dim 128 (241-289 KB at chunk 32) and for
gated_delta_rule_wy at chunk 128 once 2-D scans took scratch: both found on the H200 first; and for the
linear_attn backward at head dim 256 (239616 bytes at chunk 64), found there by bench_bwd.py."""
import re
import subprocess

import pytest

MAX_SMEM = {"sm_90a": 232448, "sm_80": 166912}  # dynamic shared memory per block: H100/H200 227 KB, A100 163 KB

FORMS = [
    ("linear_attn", []), ("linear_attn", ["--gated"]), ("linear_attn", ["--normalize"]),
    ("gla", []), ("delta_rule", []), ("gated_delta_rule", []), ("poly", []),
]
MAX_HEAD_DIM = {"poly": 128}  # the polynomial kernel's degree-2 state (K^2 columns) takes K up to 128


def smem_totals(linac_bin, op, flags, dtype, d, backward, bh, target):
    args = [str(linac_bin), "compile", op, "--shape", f"{bh},K={d}", "--dtype", dtype, "--emit", "smem",
            "--target", target, *flags, *(["--backward"] if backward else [])]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"`{' '.join(args[1:])}` failed:\n{r.stderr}"
    totals = [int(m.group(1)) for m in re.finditer(r"smem total (\d+) bytes", r.stdout)]
    assert totals, f"`{' '.join(args[1:])}` printed no plan:\n{r.stdout}"
    return totals


# Few and many sequences x heads: some defaults depend on whether one program per head fills the GPU.
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("bh", ["B=1,H=2,T=2048", "B=8,H=16,T=256"])
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("op,flags", FORMS, ids=[" ".join([op, *f]) for op, f in FORMS])
def test_default_plans_fit_a_block(linac_bin, op, flags, dtype, d, backward, bh, target):
    if d > MAX_HEAD_DIM.get(op, 256):
        pytest.skip(f"{op} takes head dims up to {MAX_HEAD_DIM[op]}")
    totals = smem_totals(linac_bin, op, flags, dtype, d, backward, bh, target)
    too_big = [t for t in totals if t > MAX_SMEM[target]]
    assert not too_big, f"{op} {' '.join(flags)} {dtype} D={d} {bh} {'backward' if backward else 'forward'}: " \
                        f"kernels plan {too_big} bytes of shared memory (an {target} block has {MAX_SMEM[target]}); " \
                        f"all: {totals}"
