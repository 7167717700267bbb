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


def test_sigterm_removes_the_temporaries(linac):
    # Outputs are committed in the order given: a FIFO first (written directly, its open blocks until a
    # reader comes) holds the command while o's temporary is complete beside o.npy; SIGTERM then must
    # leave neither o.npy nor a temporary behind.
    import signal
    import time
    fifo = linac.workdir / "fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([str(linac.binary), "run", "linear_attn", *qkv(linac), "-o", f"final_state={fifo}",
                             "-o", "o=o.npy", "--device", "cpu"], cwd=linac.workdir, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 60
    while not [p for p in os.listdir(linac.workdir) if p.startswith("o.npy.tmp.")]:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    assert not [p for p in os.listdir(linac.workdir) if p.startswith("o.npy")]
