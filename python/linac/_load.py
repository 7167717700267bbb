"""linac.load: a researcher's own ops, written in linac's C++ DSL with LINAC_USER_OP (linac/user_op.h),
compiled at run time and called on torch tensors.

    retnet = linac.load("retnet_op.cpp")        # compiles (about a second), or reuses the cached build
    o = retnet.retnet(q, k, v)                   # CPU tensors: the interpreter; CUDA tensors: the GPU
    o = retnet.retnet(q, k, v, chunk=32)         # a tuning parameter by name

The file is compiled with the system C++ compiler ($CXX, else c++) against linac's headers into a shared
library cached by the hash of everything that goes into it (the source and the C++ files beside it, which
it may include, linac's headers, the compiler, the flags, liblinac), under $LINAC_CACHE_DIR/load (default ~/.cache/linac/load); the library registers its
ops with linac when loaded. Each op becomes a function of its inputs (positional in the op's order, or
by name) returning its outputs (one tensor, or a tuple in the op's order). An op whose UserOp::backward
names another op of the file is differentiable: autograd calls that op with the inputs and the outputs'
gradients ("d" + name) and gets the inputs' gradients ("d" + name). Each op is also the torch.library
custom op torch.ops.linac_user.<name> (fake implementation, autograd), which torch.compile traces.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

import torch

from . import _lib, _ops
from ._errors import InvalidCallError

_FLAGS = ["-std=c++20", "-O2", "-fPIC", "-shared", "-Wall"]
_CXX_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cxx", ".inc"}
_loaded = {}  # library path -> module
_lock = threading.Lock()


def _include_dir():
    env = os.environ.get("LINAC_INCLUDE")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    for candidate in (here / "include", here.parents[1] / "dsl" / "include"):
        if (candidate / "linac" / "user_op.h").is_file():
            return candidate
    raise InvalidCallError("linac.load: linac's headers (linac/user_op.h) not found in the package or the source "
                           "tree; set LINAC_INCLUDE to the directory that holds linac/")


def _compiler():
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx)
    if path is None:
        raise InvalidCallError(f"linac.load: no C++ compiler: '{cxx}' is not on PATH (set CXX)")
    return path


_versions = {}


def _compiler_version(cxx):
    if cxx not in _versions:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True)
        _versions[cxx] = out.stdout
    return _versions[cxx]


def _cache_dir():
    base = os.environ.get("LINAC_CACHE_DIR")
    root = Path(base) if base else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "linac"
    return root / "load"


def _build(source, extra_cflags, verbose):
    """The shared library of `source`: from the cache, or compiled now."""
    cxx = _compiler()
    include = _include_dir()
    libpath = Path(_lib.library_path()).resolve()
    flags = _FLAGS + list(extra_cflags)
    h = hashlib.sha256()
    h.update(source.read_bytes())
    # Files the source may include with quotes: its folder's C++ files (a superset of its dependencies,
    # cheaper than asking the preprocessor).
    for dep in sorted(p for p in source.parent.iterdir() if p.suffix in _CXX_SUFFIXES and p != source):
        h.update(dep.name.encode())
        h.update(dep.read_bytes())
    for header in sorted((include / "linac").glob("*.h")):
        h.update(header.name.encode())
        h.update(header.read_bytes())
    st = libpath.stat()
    h.update(f"{cxx}\n{_compiler_version(cxx)}\n{flags}\n{libpath}\n{st.st_size}\n{st.st_mtime_ns}".encode())
    digest = h.hexdigest()[:20]
    out_dir = _cache_dir() / f"{source.stem}-{digest}"
    out = out_dir / f"lib{source.stem}.so"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    # Compiled under a temporary name and renamed: a concurrent load never sees half a library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [cxx, *flags, f"-I{include}", str(source), "-o", tmp, f"-L{libpath.parent}", "-llinac",
           f"-Wl,-rpath,{libpath.parent}"]
    if verbose:
        print("linac.load:", " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise InvalidCallError(f"linac.load: compiling {source} failed:\n{proc.stderr.strip()}")
    os.replace(tmp, out)
    return out


def _raise_load(status, source):
    _lib._raise(status, f"load {source}")


_generations = {}  # op name -> custom ops registered for it (a reloaded file registers another)


class _Op:
    """One user op as a function of torch tensors: eager calls run it directly; under torch.compile and
    for tensor subclasses the call goes through a torch.library custom op (torch.ops.linac_user.<name>)
    with a fake implementation and, when the op has a backward op, registered autograd."""

    def __init__(self, desc):
        self.name = desc["name"]
        self.__doc__ = desc.get("summary", "")
        self.inputs = [a["name"] for a in desc["inputs"]]
        self.required = [a["name"] for a in desc["inputs"] if a["required"]]
        self.outputs = [a["name"] for a in desc["outputs"]]
        self.config = [c["name"] for c in desc["config"]]
        self.gradient = None  # the _Op computing this one's gradients (set by load)
        self._specs = {}
        self._function = None
        self.custom = self._register()

    def __repr__(self):
        return f"<linac user op {self.name}({', '.join(self.inputs)}) -> {', '.join(self.outputs)}>"

    def _bind(self, args, kwargs):
        if len(args) > len(self.inputs):
            raise TypeError(f"{self.name}() takes {len(self.inputs)} tensors ({', '.join(self.inputs)}), "
                            f"got {len(args)}")
        named = dict(zip(self.inputs, args))
        config = {}
        for key, value in kwargs.items():
            if key in self.inputs:
                if key in named:
                    raise TypeError(f"{self.name}() got '{key}' twice")
                named[key] = value
            elif key in self.config:
                config[key] = int(value)
            else:
                raise TypeError(f"{self.name}() got an unexpected argument '{key}' (inputs: "
                                f"{', '.join(self.inputs)}; tuning parameters: {', '.join(self.config) or 'none'})")
        named = {k: v for k, v in named.items() if v is not None}
        for name in self.required:
            if name not in named:
                raise TypeError(f"{self.name}() is missing input '{name}'")
        return named, ",".join(f"{k}={v}" for k, v in sorted(config.items()))

    def output_specs(self, named, options):
        """(shape, dtype) of each output for these inputs (tensors of any kind: only shapes are read).
        Symbolic sizes (torch.compile's dynamic shapes) are made concrete: the op's plan, C++ code, gives
        output shapes for given sizes only, so a traced call specializes on its inputs' sizes."""
        names = tuple(n for n in self.inputs if n in named)
        shapes = [tuple(int(d) for d in named[n].shape) for n in names]
        key = (names, options, *[(shape, named[n].dtype) for shape, n in zip(shapes, names)])
        specs = self._specs.get(key)
        if specs is None:
            meta = {n: torch.empty(shape, dtype=named[n].dtype, device="meta") for shape, n in zip(shapes, names)}
            specs = self._specs[key] = [_lib.output_shape(self.name, o, meta, options, shapes_only=True)
                                        for o in self.outputs]
        return specs

    def run(self, named, options):
        """The op's outputs (a tuple) for {name: tensor} inputs, without autograd."""
        names = tuple(n for n in self.inputs if n in named)
        tensors = tuple(named[n].contiguous() for n in names)
        first = tensors[0]
        for n, t in zip(names, tensors):
            if t.device != first.device:
                raise InvalidCallError(f"{self.name}: '{n}' is on {t.device}, '{names[0]}' on {first.device}; "
                                       f"every tensor must be on one device")
        outs = tuple(torch.empty(shape, dtype=dtype, device=first.device)
                     for shape, dtype in self.output_specs(named, options))
        _lib.run(self.name.encode(), options.encode(), names, tensors, tuple(self.outputs), outs)
        return outs

    def __call__(self, *args, **kwargs):
        named, options = self._bind(args, kwargs)
        if not all(_ops.eager(t) for t in named.values()):
            outs = self.custom(*[named.get(n) for n in self.inputs], options)
            return outs
        needs_grad = (self.gradient is not None and torch.is_grad_enabled() and
                      any(t.requires_grad for t in named.values()))
        if needs_grad:
            outs = self._autograd()(options, *[named.get(n) for n in self.inputs])
        else:
            outs = self.run(named, options)
        return outs[0] if len(outs) == 1 else outs

    # --- torch.library ----------------------------------------------------------------------------------

    def _register(self):
        n = _generations.get(self.name, 0)
        _generations[self.name] = n + 1
        qualname = f"linac_user::{self.name}" + (f"_v{n}" if n else "")
        params = ", ".join(f"Tensor{'' if i in self.required else '?'} {i}" for i in self.inputs)
        returns = "Tensor" if len(self.outputs) == 1 else f"({', '.join(['Tensor'] * len(self.outputs))})"
        op = self

        def impl(*args):
            named = {n: t for n, t in zip(op.inputs, args[:-1]) if t is not None}
            outs = op.run(named, args[-1])
            return outs[0] if len(outs) == 1 else outs

        custom = torch.library.custom_op(qualname, impl, mutates_args=(), schema=f"({params}, str config) -> {returns}")

        def fake(*args):
            named = {n: t for n, t in zip(op.inputs, args[:-1]) if t is not None}
            first = next(iter(named.values()))
            outs = tuple(torch.empty(shape, dtype=dtype, device=first.device)
                         for shape, dtype in op.output_specs(named, args[-1]))
            return outs[0] if len(outs) == 1 else outs

        custom.register_fake(fake)
        return custom

    def register_gradient(self, gradient):
        """Autograd through `gradient` (an _Op of the same file) for eager and traced calls."""
        self.gradient = gradient
        op = self

        def setup(ctx, inputs, output):
            ctx.save_for_backward(*inputs[:-1])
            ctx.options = inputs[-1]
            ctx.set_materialize_grads(False)

        def backward(ctx, *grads):
            return (*op._input_grads(ctx.saved_tensors, grads, ctx.options, traced=True), None)

        self.custom.register_autograd(backward, setup_context=setup)

    def _input_grads(self, inputs, grads, options, traced):
        """Gradients of the inputs (None where an input is absent or needs none) from the outputs'."""
        named = {n: t for n, t in zip(self.inputs, inputs) if t is not None}
        g = self.gradient
        specs = None
        for i, (name, grad) in enumerate(zip(self.outputs, grads)):
            if f"d{name}" not in g.inputs:
                continue
            if grad is None:  # an output the loss does not use: a zero gradient
                specs = specs or self.output_specs(named, options)
                grad = torch.zeros(specs[i][0], dtype=specs[i][1], device=inputs[0].device)
            named[f"d{name}"] = grad
        gin = {n: t for n, t in named.items() if n in g.inputs}
        if traced:
            res = g.custom(*[gin.get(n) for n in g.inputs], "")
            res = (res,) if len(g.outputs) == 1 else res
        else:
            res = g.run(gin, "")
        results = dict(zip(g.outputs, res))
        return [results.get(f"d{n}") if t is not None and t.requires_grad else None
                for n, t in zip(self.inputs, inputs)]

    def _autograd(self):
        if self._function is None:
            op = self

            def forward(ctx, options, *inputs):
                named = {n: t for n, t in zip(op.inputs, inputs) if t is not None}
                ctx.save_for_backward(*inputs)
                ctx.options = options
                ctx.set_materialize_grads(False)
                return op.run(named, options)

            def backward(ctx, *grads):
                return (None, *op._input_grads(ctx.saved_tensors, grads, ctx.options, traced=False))

            self._function = type(f"{self.name}_function", (torch.autograd.Function,),
                                  {"forward": staticmethod(forward), "backward": staticmethod(backward)})
        return self._function.apply


def load(path, extra_cflags=(), verbose=False):
    """Compiles (or reuses the cached build of) the C++ file at `path`, loads its ops into linac and
    returns them as a module-like object: one attribute per op (see the module's docstring)."""
    source = Path(path).resolve()
    if not source.is_file():
        raise InvalidCallError(f"linac.load: {path}: no such file")
    with _lock:
        library = _build(source, extra_cflags, verbose)
        key = str(library)
        if key in _loaded:
            return _loaded[key]
        status = _lib.lib().linac_load_ops(key.encode())
        if status != 0:
            _raise_load(status, source)
        names = [n for n in _lib.lib().linac_loaded_ops().decode().split(",") if n]
        if not names:
            raise InvalidCallError(f"linac.load: {source} defines no op (LINAC_USER_OP(name) {{ ... }})")
        # The file's ops replace any of the same names loaded before (an edited file): calls this package
        # prepared for those names must be prepared again.
        _lib.forget_prepared_calls()
        descs = {n: _lib.describe(n) for n in names}
        ops = {name: _Op(d) for name, d in descs.items()}
        for name, d in descs.items():
            grad = d.get("gradient_op")
            if grad:
                if grad not in ops:
                    raise InvalidCallError(f"linac.load: op {name}'s backward '{grad}' is not an op of {source}")
                ops[name].register_gradient(ops[grad])
        module = types.SimpleNamespace(**ops, __file__=str(source), library=key, ops=list(ops))
        _loaded[key] = module
        return module
