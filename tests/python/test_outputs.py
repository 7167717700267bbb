"""Outputs all or nothing (issue 23, point 5; runtime/output_files.h): a failed output leaves every other
one as it was, devices are written through and never replaced, symlinks are written through, and a full
standard output is an error."""
import os
import stat
import subprocess

import numpy as np


def qkv(linac):
    rng = np.random.default_rng(0)
    return [f"{n}={linac.write(n, rng.standard_normal((1, 8, 1, 8)).astype(np.float32))}" for n in "qkv"]


def test_a_failed_output_leaves_the_others_untouched(linac):
    good = linac.workdir / "o.npy"
    good.write_bytes(b"before")
    proc = linac.run("run", "linear_attn", *qkv(linac), "-o", "o=o.npy", "-o", "final_state=no_such_dir/s.npy",
                     "--device", "cpu")
    assert proc.returncode == 1 and "no_such_dir/s.npy: cannot write" in proc.stderr, proc.stderr
    assert good.read_bytes() == b"before"
    assert not [p for p in os.listdir(linac.workdir) if ".tmp." in p]


def test_devices_are_written_through_never_replaced(linac):
    proc = linac.run("run", "linear_attn", *qkv(linac), "-o", "o=/dev/full", "--device", "cpu")
    assert proc.returncode == 1 and "/dev/full: cannot write: No space left on device" in proc.stderr, proc.stderr
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    proc = linac.run("run", "linear_attn", *qkv(linac), "-o", "o=/dev/null", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_symlinks_are_written_through(linac):
    os.symlink("target.npy", linac.workdir / "link.npy")
    proc = linac.run("run", "linear_attn", *qkv(linac), "-o", "o=link.npy", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert os.path.islink(linac.workdir / "link.npy")
    assert np.load(linac.workdir / "target.npy").shape == (1, 8, 1, 8)


def test_a_full_standard_output_or_json_file_is_an_error(linac):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([str(linac.binary), "plan", "linear_attn", "--shape", "B=1,T=64,H=1,K=16"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot write to standard output" in proc.stderr, proc.stderr
    proc = linac.run("plan", "linear_attn", "--shape", "B=1,T=64,H=1,K=16", "--json", "/dev/full")
    assert proc.returncode == 1 and "/dev/full: cannot write" in proc.stderr, proc.stderr
