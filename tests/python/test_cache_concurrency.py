"""Cross-process tests of the disk cache (runtime/disk_cache.h) through linac_cache_stress.

Eight processes race to build and install one entry in an empty cache: all must succeed, exactly one
entry may result, and no staging dirs may be left. Then the entry is corrupted and one process must
notice, rebuild it and leave a good entry.

The binary is $LINAC_CACHE_STRESS_BIN, else <repo>/build/linac_cache_stress. A missing binary fails the
test (it is not skipped): a silently skipped test would hide a broken build.
"""

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROCESSES = 8
TIMEOUT_S = 120
BLOB_BYTES = 1 << 20


def stress_binary():
    env = os.environ.get("LINAC_CACHE_STRESS_BIN")
    path = Path(env).expanduser().absolute() if env else REPO / "build" / "linac_cache_stress"
    if not path.is_file() or not os.access(path, os.X_OK):
        source = "$LINAC_CACHE_STRESS_BIN" if env else "the default location"
        pytest.fail(f"linac_cache_stress not found at {path} ({source}); build it with "
                    f"`cmake -B build && cmake --build build` or set LINAC_CACHE_STRESS_BIN", pytrace=False)
    return path


def expected_blob():
    """The blob linac_cache_stress builds (make_blob() in cache_stress_main.cpp)."""
    return bytes(((i * 131 + (i >> 8) * 7) & 0xFF) for i in range(BLOB_BYTES))


def stress_env():
    env = dict(os.environ)
    env.pop("LINAC_DISABLE_CACHE", None)
    env["LINAC_CACHE_LOG"] = "1"
    return env


def start(binary, root):
    return subprocess.Popen([str(binary), str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=stress_env())


def finish(proc):
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"linac_cache_stress timed out:\n{err}")
    return proc.returncode, out.strip(), err


def entry_dirs(root):
    """Installed entry dirs: <root>/v1/<2 hex>/<key>."""
    v1 = root / "v1"
    return sorted(d for shard in v1.iterdir() if shard.is_dir() and len(shard.name) == 2
                  for d in shard.iterdir())


def leftovers(root):
    """Staging dirs and trash that should not outlive a process."""
    return [p for sub in ("tmp", "trash") if (root / "v1" / sub).is_dir() for p in (root / "v1" / sub).iterdir()]


def verify_entry(entry):
    """Checks the entry against its MANIFEST, independently of the C++ code, and the blob's bytes."""
    lines = (entry / "MANIFEST").read_text().splitlines()
    assert lines[0] == "linac-cache-manifest 1"
    assert lines[-1] == "end"
    count = int(lines[1].removeprefix("files "))
    listed = lines[2:-1]
    assert len(listed) == count
    names = set()
    for line in listed:
        size, digest, name = line.split(" ")
        data = (entry / name).read_bytes()
        assert len(data) == int(size), name
        assert hashlib.sha256(data).hexdigest() == digest, name
        names.add(name)
    assert names == {"blob.bin", "meta.json"}
    assert sorted(p.name for p in entry.iterdir()) == ["MANIFEST", "blob.bin", "meta.json"]
    assert (entry / "blob.bin").read_bytes() == expected_blob()


def test_concurrent_builders_then_corruption(tmp_path):
    binary = stress_binary()
    root = tmp_path / "cache"  # does not exist yet: the processes race to create it too

    procs = [start(binary, root) for _ in range(PROCESSES)]
    results = [finish(p) for p in procs]
    for rc, out, err in results:
        assert rc == 0, f"exit {rc}, stdout {out!r}, stderr:\n{err}"
        assert out in ("ok hit", "ok built"), out
    assert any(out == "ok built" for _, out, _ in results), "nobody built the entry in an empty cache"

    entries = entry_dirs(root)
    assert len(entries) == 1, entries
    assert leftovers(root) == []
    entry = entries[0]
    verify_entry(entry)

    # A warm cache: a hit, and nothing changes.
    rc, out, err = finish(start(binary, root))
    assert (rc, out) == (0, "ok hit"), err

    # Corrupt the entry: flip one byte of the blob. The next process must notice, rebuild, reinstall.
    blob = bytearray((entry / "blob.bin").read_bytes())
    blob[BLOB_BYTES // 2 + 17] ^= 0x40
    (entry / "blob.bin").write_bytes(bytes(blob))

    rc, out, err = finish(start(binary, root))
    assert rc == 0, err
    assert out == "ok built", f"expected a rebuild of the corrupt entry, got {out!r}; stderr:\n{err}"
    assert "linac cache: corrupt" in err, err
    assert entry_dirs(root) == [entry]
    assert leftovers(root) == []
    verify_entry(entry)

    rc, out, err = finish(start(binary, root))
    assert (rc, out) == (0, "ok hit"), err


def test_concurrent_builders_with_corrupt_entry(tmp_path):
    """Eight processes meet a corrupt entry at once: they may all detect it, race to remove it and to
    reinstall it, and must all still succeed with one good entry at the end."""
    binary = stress_binary()
    root = tmp_path / "cache"
    rc, out, err = finish(start(binary, root))
    assert (rc, out) == (0, "ok built"), err
    [entry] = entry_dirs(root)
    (entry / "MANIFEST").write_text("garbage\n")

    procs = [start(binary, root) for _ in range(PROCESSES)]
    for rc, out, err in (finish(p) for p in procs):
        assert rc == 0, f"exit {rc}, stdout {out!r}, stderr:\n{err}"
        assert out in ("ok hit", "ok built"), out
    assert entry_dirs(root) == [entry]
    assert leftovers(root) == []
    verify_entry(entry)
