"""Every top-level load of the library's kernels at the bar shape that can be an asynchronous copy is one.

A load outside any loop is prefetched (a cp.async copy issued where it stands, waited for at first use)
when its tile goes to shared memory: as a dot operand, a reduction's or scan's operand, a read in
another layout, or by AccessOptions::prefetch. Otherwise it is a register load, waited for at its first
use before the loads after it are issued. gla_chunk's and gla_bwd_intra's gates and q/k were such loads
until session 27 (18% and 22% of those kernels' time on an H200: docs/ops/gla.md, "Measured"), and the
numeric tests could not see it. `--emit smem` names the register loads that could be copies (its
"register load" lines: the planner's own rule, compiler/passes/smem_plan.cpp); one is reported here
where its first use comes before another top-level load, whose issue it then delays."""
import re

import pytest

SHAPE = "B=8,T=4096,H=16,K=128"
FORMS = [("linear_attn", []), ("linear_attn", ["--gated"]), ("linear_attn", ["--normalize"]), ("gla", []),
         ("delta_rule", []), ("gated_delta_rule", [])]


def kernels_of(linac, op, extra, backward):
    args = ["compile", op, "--shape", SHAPE, "--dtype", "bf16", "--target", "sm_90a", *extra,
            *(["--backward"] if backward else [])]
    layouts = linac.run(*args, "--emit", "layouts")
    plans = linac.run(*args, "--emit", "smem")
    assert layouts.returncode == 0 and plans.returncode == 0, layouts.stderr + plans.stderr
    bodies = re.split(r"^kernel @", layouts.stdout, flags=re.M)[1:]
    plan_texts = plans.stdout.split("smem total")[:-1]
    assert len(bodies) == len(plan_texts), (len(bodies), len(plan_texts))
    return list(zip(bodies, plan_texts))


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("op,extra", FORMS, ids=[f"{op}{''.join(e)}" for op, e in FORMS])
def test_top_level_loads_are_prefetched(linac, op, extra, backward):
    problems = []
    for body, plan in kernels_of(linac, op, extra, backward):
        name = body.split("(", 1)[0]
        in_registers = set(re.findall(r"^register load (%\d+) ", plan, flags=re.M))
        lines = body.splitlines()
        # Top level: two spaces of indentation (loop and branch bodies are deeper).
        top_loads = [(i, re.match(r"  (%\d+) = load %(\w+)\[.*: tile<([\dx]+)x([a-z]+\d+)>", line))
                     for i, line in enumerate(lines)]
        top_loads = [(i, m) for i, m in top_loads if m]
        for i, m in top_loads:
            value, tensor, dims, dtype = m.groups()
            if value not in in_registers:
                continue
            use = re.compile(re.escape(value) + r"(?!\d)")
            first_use = next((j for j in range(i + 1, len(lines)) if use.search(lines[j])), len(lines))
            later = [n.group(2) for j, n in top_loads if j > first_use]
            if later:
                problems.append(f"{name}: {value} = load %{tensor} tile<{dims}x{dtype}> is a register load, "
                                f"waited for before the loads of {', '.join(later)}")
    assert not problems, "\n".join(problems)
