"""linac.load: a user's C++ DSL file compiled at run time, its ops called on torch tensors (forward, a
tuning parameter, autograd through the op the file names as the backward), the build cached, and the
mistakes a user makes reported as errors that say what is wrong. Also the examples' Python drivers.
"""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import DEVICE, REPO

torch = pytest.importorskip("torch", reason="torch is not installed")
import linac  # noqa: E402

if shutil.which(os.environ.get("CXX", "c++")) is None:
    pytest.skip("no C++ compiler (c++ or $CXX) to build users' ops with", allow_module_level=True)

# y = factor * x in blocks of the tuning parameter "block"; the backward dx = factor * dy.
SOURCE = r"""
#include "linac/dsl.h"
#include "linac/user_op.h"

using namespace linac::dsl;
using linac::DType;

static std::shared_ptr<linac::ir::Kernel> scale(const char* name, int64_t block, DType dt) {
  KernelBuilder kb(name);
  Tensor src = kb.tensor("src", dt, 1), dst = kb.tensor("dst", dt, 1);
  Tile f = kb.scalar("factor", DType::f32);
  Tile i0 = program_id(0) * block;
  store(dst, {i0}, {block}, (load(src, {i0}, {block}).to(DType::f32) * f).to(dt));
  return kb.finish();
}

static linac::ops::UserOp scale_op(const char* in, const char* out, std::vector<int64_t> blocks) {
  linac::ops::UserOp op;
  op.inputs = {in};
  op.outputs = {out};
  op.tuning = {{"block", blocks}};
  op.plan = [in = std::string(in), out = std::string(out)](const linac::ops::UserCall& c) {
    const auto& x = c.inputs.at(in);
    const int64_t b = c.config.at("block");
    linac::ops::UserPlan p;
    p.outputs[out] = x;
    p.launches.push_back({scale("scale", b, x.dtype), {(x.shape[0] + b - 1) / b, 1, 1},
                          {{"src", in}, {"dst", out}}, {{"factor", 3.0}}});
    return p;
  };
  return op;
}

LINAC_USER_OP(NAME) {
  linac::ops::UserOp op = scale_op("x", "y", {64, 32});
  op.backward = "NAME_bwd";
  return op;
}

LINAC_USER_OP(NAME_bwd) {
  linac::ops::UserOp op = scale_op("dy", "dx", {64});
  op.inputs = {"x", "dy"};
  return op;
}
"""


def write(tmp_path, text, name="user_op.cpp"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LINAC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_load_forward_tuning_and_autograd(tmp_path, cache):
    mod = linac.load(write(tmp_path, SOURCE.replace("NAME", "triple")))
    assert mod.ops == ["triple", "triple_bwd"]
    assert list(cache.glob("load/user_op-*/libuser_op.so"))
    x = torch.randn(100, device=DEVICE)
    torch.testing.assert_close(mod.triple(x), 3 * x)
    torch.testing.assert_close(mod.triple(x, block=32), 3 * x)
    torch.testing.assert_close(mod.triple(x=x), 3 * x)
    xg = x.clone().requires_grad_(True)
    dy = torch.randn(100, device=DEVICE)
    mod.triple(xg).backward(dy)
    torch.testing.assert_close(xg.grad, 3 * dy)
    # Loading the same file again returns the same module (its ops are registered once).
    assert linac.load(tmp_path / "user_op.cpp") is mod


def test_load_reports_mistakes(tmp_path, cache):
    mod = linac.load(write(tmp_path, SOURCE.replace("NAME", "quad")))
    x = torch.randn(8, device=DEVICE)
    with pytest.raises(TypeError, match="unexpected argument 'chunk'.*tuning parameters: block"):
        mod.quad(x, chunk=16)
    with pytest.raises(TypeError, match="missing input 'x'"):
        mod.quad()
    with pytest.raises(linac.InvalidCallError, match="no such file"):
        linac.load(tmp_path / "missing.cpp")
    with pytest.raises(linac.InvalidCallError, match="compiling .*broken.cpp failed:(.|\n)*error"):
        linac.load(write(tmp_path, SOURCE.replace("NAME", "broken") + "\nthis is not C++;\n", "broken.cpp"))
    with pytest.raises(linac.InvalidCallError, match="defines no op"):
        linac.load(write(tmp_path, '#include "linac/user_op.h"\n', "empty.cpp"))
    # A library op's name is refused, naming the op.
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(linac.InvalidCallError, match="user op gla: 'gla' is the name of one of linac's ops"):
        linac.load(write(other, SOURCE.replace("NAME", "gla")))


def test_load_again_after_an_edit(tmp_path, cache):
    """A notebook's loop: edit the file, load it again; the same names now run the new kernels."""
    path = write(tmp_path, SOURCE.replace("NAME", "edited"))
    x = torch.randn(50, device=DEVICE)
    torch.testing.assert_close(linac.load(path).edited(x), 3 * x)
    path.write_text(SOURCE.replace("NAME", "edited").replace("{\"factor\", 3.0}", "{\"factor\", 5.0}"))
    torch.testing.assert_close(linac.load(path).edited(x), 5 * x)


@pytest.mark.parametrize("example,extra", [("retnet", []), ("hedgehog", ["--F", "16"]), ("kda", [])])
def test_example_from_python(example, extra):
    script = REPO / "examples" / example / f"{example}.py"
    out = subprocess.run([sys.executable, str(script), "--device", DEVICE, "--T", "40", "--H", "2", "--K", "32",
                          "--V", "32", *extra], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.rstrip().endswith("ok"), out.stdout + out.stderr


def test_load_under_torch_compile(tmp_path, cache):
    """A user's op inside a compiled function: traced with no graph break (fullgraph), forward and
    backward through the registered custom op (torch.ops.linac_user.*), and opcheck passes."""
    mod = linac.load(write(tmp_path, SOURCE.replace("NAME", "fivefold").replace('{"factor", 3.0}', '{"factor", 5.0}')))
    x = torch.randn(70, device=DEVICE, requires_grad=True)

    def f(x):
        return mod.fivefold(x * 2, block=32).sum()

    loss = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    loss.backward()
    torch.testing.assert_close(loss, (10 * x).sum())
    torch.testing.assert_close(x.grad, torch.full_like(x, 10.0))
    torch.library.opcheck(torch.ops.linac_user.fivefold.default, (torch.randn(33, device=DEVICE), ""))
