"""`linac cache ls|clear|prune` on a cache populated by the cache stress worker (which writes one
entry the way the GPU path does)."""
import os
import subprocess

from test_cache_concurrency import stress_binary


def cli(linac_bin, cache, *args):
    env = dict(os.environ, LINAC_CACHE_DIR=str(cache))
    return subprocess.run([str(linac_bin), "cache", *args], capture_output=True, text=True, env=env, timeout=60)


def test_ls_clear_prune(linac_bin, tmp_path):
    cache = tmp_path / "cache"
    r = cli(linac_bin, cache, "ls")
    assert r.returncode == 0 and r.stdout.strip().startswith("0 entries"), r.stdout + r.stderr
    w = subprocess.run([stress_binary(), str(cache)], capture_output=True, text=True, timeout=60)
    assert w.returncode == 0, w.stderr
    r = cli(linac_bin, cache, "ls")
    assert r.returncode == 0 and "1 entries" in r.stdout.splitlines()[-1], r.stdout
    r = cli(linac_bin, cache, "prune", "--max-size", "1G")
    assert r.returncode == 0
    assert "1 entries" in cli(linac_bin, cache, "ls").stdout.splitlines()[-1]
    r = cli(linac_bin, cache, "prune", "--max-size", "0")
    assert r.returncode == 0
    assert cli(linac_bin, cache, "ls").stdout.strip().startswith("0 entries")
    subprocess.run([stress_binary(), str(cache)], capture_output=True, timeout=60, check=True)
    r = cli(linac_bin, cache, "clear")
    assert r.returncode == 0 and r.stdout.startswith("removed 1 entries"), r.stdout
    assert cli(linac_bin, cache, "ls").stdout.strip().startswith("0 entries")


def test_bad_subcommand_and_flags(linac_bin, tmp_path):
    for args in (["bogus"], ["prune"], ["prune", "--max-size", "x"], ["ls", "--nope"]):
        r = cli(linac_bin, tmp_path / "c", *args)
        assert r.returncode == 1, args
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("linac: error:"), (args, r.stderr)


def test_clear_without_permission_is_an_error(linac_bin, tmp_path):
    # Issue 23: `cache clear` by a user who may not remove the entries printed "removed 0 entries" and
    # exited 0. Run as nobody on a cache root made by this (root) test.
    import shutil
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        import pytest
        pytest.skip("needs root and setpriv to run the CLI as another user")
    import tempfile
    base = tempfile.mkdtemp(prefix="linac-cache-perm-", dir="/tmp")  # pytest's tmp_path is root's alone
    try:
        os.chmod(base, 0o755)
        cache = os.path.join(base, "cache")
        subprocess.run([stress_binary(), cache], capture_output=True, timeout=60, check=True)
        for root, dirs, files in os.walk(cache):
            os.chmod(root, 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        env = dict(os.environ, LINAC_CACHE_DIR=cache)
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(linac_bin), "cache",
                            "clear"], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "could not remove 1: Permission denied" in r.stderr, r.stderr
        assert "1 entries" in cli(linac_bin, cache, "ls").stdout.splitlines()[-1]
    finally:
        shutil.rmtree(base, ignore_errors=True)
