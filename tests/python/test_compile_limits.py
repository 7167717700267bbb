"""Issue 23, point 2: compile time is bounded. Our passes are linear in a kernel's tiles (`--emit layouts`
and `--emit smem` of a 512x512 tile take milliseconds; they used to run all of LLVM first); LLVM's
optimizer and PTX emission are not, over the straight-line code a thread's share of a tile becomes, so
the GPU backend refuses a tile of more than 1024 registers per thread (docs/dsl-guide.md) with its line."""
import time

KERNEL = """kernel @big(%x: tensor<?x?xf32>, %out: tensor<?x?xf32>) attributes {{num_warps = 4, num_stages = 1}} {{
  %zero = constant 0 : i32
  %m = dim %x {{axis = 0}} : i32
  %n = dim %x {{axis = 1}} : i32
  %v = load %x[%zero, %zero] limits[%m, %n] {{dims = [0, 1], shape = [{n}, {n}]}} : tile<{n}x{n}xf32>
  %e = exp %v : tile<{n}x{n}xf32>
  %t = transpose %e {{perm = [1, 0]}} : tile<{n}x{n}xf32>
  %s = add %e, %t : tile<{n}x{n}xf32>
  store %out[%zero, %zero] limits[%m, %n], %s {{dims = [0, 1]}}
}}
"""


def compile_big(linac, n, emit):
    (linac.workdir / f"big{n}.tir").write_text(KERNEL.format(n=n))
    t0 = time.time()
    proc = linac.run("compile", f"big{n}.tir", "--emit", emit)
    return proc, time.time() - t0


def test_early_stages_stop_before_llvm(linac):
    for emit in ("layouts", "smem"):
        proc, seconds = compile_big(linac, 512, emit)
        assert proc.returncode == 0, proc.stderr
        assert seconds < 2, (emit, seconds)


def test_a_tile_beyond_the_register_rule_is_refused_at_once(linac):
    proc, seconds = compile_big(linac, 512, "ptx")
    assert proc.returncode == 1 and seconds < 2, (proc.returncode, seconds)
    expected = "tile<512x512xf32> needs 2048 registers per thread on 128 threads; the GPU backend takes at most 1024"
    assert expected in proc.stderr, proc.stderr
    proc, _ = compile_big(linac, 128, "ptx")  # 128 registers per thread: compiled
    assert proc.returncode == 0 and ".entry big" in proc.stdout, proc.stderr
