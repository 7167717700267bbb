"""`linac bench` without a GPU: its help says what the numbers are, and bad --peak-gbs values give one
clear line before any GPU is needed. (The timing itself runs on the GPU machine: tools/bench_vs_fla.py.)"""
import subprocess


def bench(linac_bin, *args):
    return subprocess.run([str(linac_bin), "bench", *args], capture_output=True, text=True, timeout=60)


def test_help_explains_the_hbm_floor(linac_bin):
    r = bench(linac_bin, "--help")
    assert r.returncode == 0
    for word in ("HBM floor", "--peak-gbs", "floor_ms", "peak_gbs", "fraction_of_floor", "scratch"):
        assert word in r.stdout, word


def test_bad_peak_bandwidth_is_one_clear_error(linac_bin):
    for value in ("0", "-1", "fast"):
        r = bench(linac_bin, "linear_attn", "--shape", "B=1,T=64,H=1,K=64", "--peak-gbs", value)
        lines = r.stderr.splitlines()
        assert r.returncode == 1 and len(lines) == 1 and "--peak-gbs" in lines[0], (value, r.stderr)


def test_a_backward_key_in_config_says_bwd_config(linac_bin):
    # bench times the forward at --config and the backward at --bwd-config: a backward-only key given to
    # --config is one line saying where it goes, before any GPU is needed.
    r = bench(linac_bin, "linear_attn", "--shape", "B=1,T=64,H=1,K=64", "--backward", "--config", "split=1")
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "--bwd-config split=1" in lines[0], r.stderr
