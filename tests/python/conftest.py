"""Shared fixtures for the CLI tests: finding the linac binary and running it in a temp dir.

The binary is $LINAC_BIN, else <repo>/build/linac. A missing binary makes every test that needs it
fail (not skip): a suite that silently skips would hide a broken build.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
# Generous: the CPU interpreter is slow, but a hung CLI must not hang the suite.
CLI_TIMEOUT_S = 300


def linac_binary():
    env = os.environ.get("LINAC_BIN")
    # Absolute, because the CLI runs with a temp dir as its working directory.
    path = Path(env).expanduser().absolute() if env else REPO / "build" / "linac"
    if not path.is_file() or not os.access(path, os.X_OK):
        source = "$LINAC_BIN" if env else "the default location"
        pytest.fail(f"linac CLI not found at {path} ({source}); build it with "
                    f"`cmake -B build && cmake --build build` or set LINAC_BIN", pytrace=False)
    return path


class CliError(AssertionError):
    pass

TEST_DEVICE = os.environ.get("LINAC_TEST_DEVICE", "cpu")


class Linac:
    """Runs the linac CLI with `workdir` as its working directory; files are named relative to it."""

    def __init__(self, binary, workdir):
        self.binary = Path(binary)
        self.workdir = Path(workdir)

    def write(self, name, array):
        """Saves `array` as <workdir>/<name>.npy and returns the file name."""
        fname = f"{name}.npy"
        np.save(self.workdir / fname, array)
        return fname

    def files(self):
        return sorted(p.name for p in self.workdir.iterdir())

    def run(self, *args):
        """Runs `linac <args>`; returns the CompletedProcess (text stdout/stderr), whatever the exit."""
        return subprocess.run([str(self.binary), *map(str, args)], cwd=self.workdir, capture_output=True,
                              text=True, timeout=CLI_TIMEOUT_S)

    def run_op(self, op, inputs, outputs=("o",), options=(), device=None):
        """Writes `inputs` (name -> array) as .npy, runs `linac run <op> name=name.npy ... -o out=out_<out>.npy
        --device <device> <options>` and returns {output name: array}. Raises CliError with the CLI's
        stderr when it fails. The device defaults to $LINAC_TEST_DEVICE (cpu when unset), so that every
        numeric test runs on the GPU machine with LINAC_TEST_DEVICE=cuda."""
        device = device or TEST_DEVICE
        args = ["run", op]
        for name, array in inputs.items():
            args.append(f"{name}={self.write(name, array)}")
        for name in outputs:
            args += ["-o", f"{name}=out_{name}.npy"]
        args += ["--device", device, *options]
        proc = self.run(*args)
        if proc.returncode != 0:
            raise CliError(f"`linac {' '.join(args)}` exited {proc.returncode}:\n{proc.stderr}")
        result = {}
        for name in outputs:
            path = self.workdir / f"out_{name}.npy"
            assert path.is_file(), f"linac did not write output {name} ({path.name})"
            result[name] = np.load(path, allow_pickle=False)
        return result


@pytest.fixture(scope="session")
def linac_bin():
    return linac_binary()


@pytest.fixture
def linac(linac_bin, tmp_path):
    return Linac(linac_bin, tmp_path)


def pytest_collection_modifyitems(config, items):
    """LINAC_TEST_SHARD=i/n keeps every n-th collected test from the i-th (0-based): the GPU machine runs
    a long file as n processes side by side (node ids with spaces do not pass through a shell)."""
    shard = os.environ.get("LINAC_TEST_SHARD")
    if not shard:
        return
    try:
        index, count = (int(x) for x in shard.split("/"))
        assert 0 <= index < count
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"LINAC_TEST_SHARD={shard!r}: expected i/n with 0 <= i < n")
    kept = [item for j, item in enumerate(items) if j % count == index]
    config.hook.pytest_deselected(items=[item for j, item in enumerate(items) if j % count != index])
    items[:] = kept
