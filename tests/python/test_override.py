"""LINAC_OVERRIDE_DIR: a `linac dump` directory, edited, replaces stages of the kernels it holds (as
Triton's kernel override does). Checked through `linac compile --emit ptx`, which needs no GPU; the
runtime reads the same files through the same lookup.
"""
import os
import shutil
import subprocess

import pytest

OP = "linear_attn"
KERNEL = "linear_attn_fwd"
MARK = "// linac-override-test"


def run(linac_bin, *args, override_dir=None):
    env = dict(os.environ)
    env.pop("LINAC_OVERRIDE_DIR", None)
    if override_dir is not None:
        env["LINAC_OVERRIDE_DIR"] = str(override_dir)
    return subprocess.run([str(linac_bin), *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def dumped(linac_bin, tmp_path_factory):
    """A pristine `linac dump OP` directory (the tests copy it before editing)."""
    d = tmp_path_factory.mktemp("dump")
    r = run(linac_bin, "dump", OP, "--dir", d)
    assert r.returncode == 0, r.stderr
    assert (d / f"0-{KERNEL}" / "6-kernel.ptx").is_file()
    return d


def copy_of(dumped, tmp_path):
    d = tmp_path / "override"
    shutil.copytree(dumped, d)
    return d


def insert_after_first_line(path, line):
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + line + "\n" + "".join(lines[1:]))


def test_edited_ptx_of_a_dump_directory_replaces_the_stage(linac_bin, dumped, tmp_path):
    d = copy_of(dumped, tmp_path)
    ptx = d / f"0-{KERNEL}" / "6-kernel.ptx"
    insert_after_first_line(ptx, MARK)
    plain = run(linac_bin, "compile", OP, "--emit", "ptx")
    assert plain.returncode == 0 and MARK not in plain.stdout and "replaced by" not in plain.stderr
    r = run(linac_bin, "compile", OP, "--emit", "ptx", override_dir=d)
    assert r.returncode == 0, r.stderr
    # Only the edited kernel carries the mark: its namesake 1-linear_attn_fwd (the gated variant) is
    # told apart by its recorded tile IR.
    assert r.stdout.count(MARK) == 1
    assert f"linac: kernel {KERNEL}: ptx replaced by {ptx}" in r.stderr.splitlines()
    # Every other stage file of the dump is the compiler's own output: the PTX is unchanged elsewhere.
    assert r.stdout.replace(MARK + "\n", "") == plain.stdout


def test_edited_optimized_llvm_ir_is_compiled_to_ptx(linac_bin, dumped, tmp_path):
    d = copy_of(dumped, tmp_path)
    kdir = d / f"0-{KERNEL}"
    (kdir / "6-kernel.ptx").unlink()  # the latest stage present wins: without the PTX, the .ll does
    with open(kdir / "5-optimized.ll", "a") as f:
        f.write('module asm "// linac-override-ll"\n')  # module-level asm reaches the PTX verbatim
    r = run(linac_bin, "compile", OP, "--emit", "ptx", override_dir=d)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("// linac-override-ll") == 1
    assert f"linac: kernel {KERNEL}: llvm-opt replaced by {kdir / '5-optimized.ll'}" in r.stderr.splitlines()


def single_error(r):
    assert r.returncode == 1, (r.returncode, r.stderr)
    errors = [l for l in r.stderr.splitlines() if l.startswith("linac: error:")]
    assert len(errors) == 1 and "internal" not in r.stderr, r.stderr
    return errors[0]


def test_llvm_ir_that_does_not_parse_is_one_clear_error(linac_bin, dumped, tmp_path):
    d = copy_of(dumped, tmp_path)
    kdir = d / f"0-{KERNEL}"
    (kdir / "6-kernel.ptx").unlink()
    (kdir / "5-optimized.ll").write_text("this is not LLVM IR\n")
    error = single_error(run(linac_bin, "compile", OP, "--emit", "ptx", override_dir=d))
    assert KERNEL in error and f"{kdir / '5-optimized.ll'}:1:" in error, error


def test_llvm_ir_that_parses_but_does_not_verify_is_one_clear_error(linac_bin, dumped, tmp_path):
    # Issue 23: an instruction using its own value parses, and LLVM's debug-info upgrade, which runs as
    # it parses, aborted the process on the broken module ("LLVM ERROR: Broken module found").
    import re
    d = copy_of(dumped, tmp_path)
    kdir = d / f"0-{KERNEL}"
    (kdir / "6-kernel.ptx").unlink()
    ll = kdir / "5-optimized.ll"
    text = ll.read_text()
    m = re.search(r"^  (%\d+) = add i32 (%\w+), ", text, re.M)
    assert m, "no add to break in the dump"
    ll.write_text(text.replace(m.group(0), f"  {m.group(1)} = add i32 {m.group(1)}, ", 1))
    error = single_error(run(linac_bin, "compile", OP, "--emit", "ptx", override_dir=d))
    assert f"{ll} is not valid LLVM IR: Only PHI nodes may reference their own value" in error, error


def test_ptx_without_the_kernel_entry_is_one_clear_error(linac_bin, dumped, tmp_path):
    d = copy_of(dumped, tmp_path)
    ptx = d / f"0-{KERNEL}" / "6-kernel.ptx"
    ptx.write_text(ptx.read_text().replace(f".entry {KERNEL}", ".entry renamed"))
    error = single_error(run(linac_bin, "compile", OP, "--emit", "ptx", override_dir=d))
    assert str(ptx) in error and f".entry {KERNEL}" in error, error


def test_missing_override_directory_is_one_clear_error(linac_bin, tmp_path):
    error = single_error(run(linac_bin, "compile", OP, "--emit", "ptx", override_dir=tmp_path / "absent"))
    assert "LINAC_OVERRIDE_DIR" in error


def test_dump_help_documents_the_override(linac_bin):
    r = run(linac_bin, "dump", "--help")
    assert r.returncode == 0 and "LINAC_OVERRIDE_DIR" in r.stdout and "6-kernel.ptx" in r.stdout
