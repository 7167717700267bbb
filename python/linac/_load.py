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
gradients ("d" + name) and gets the inputs' gradients ("d" + name).
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

from . import _lib
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


class _Op:
    """One user op as a function of torch tensors."""

    def __init__(self, desc, gradient=None):
        self.name = desc["name"]
        self.__doc__ = desc.get("summary", "")
        self.inputs = [a["name"] for a in desc["inputs"]]
        self.required = [a["name"] for a in desc["inputs"] if a["required"]]
        self.outputs = [a["name"] for a in desc["outputs"]]
        self.config = [c["name"] for c in desc["config"]]
        self.gradient = gradient  # the _Op computing this one's gradients
        self._specs = {}
        self._function = None

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
        return named, config

    def run(self, named, config):
        """The op's outputs for {name: tensor} inputs (no autograd)."""
        names = tuple(n for n in self.inputs if n in named)
        tensors = tuple(named[n].contiguous() for n in names)
        first = tensors[0]
        for n, t in zip(names, tensors):
            if t.device != first.device:
                raise InvalidCallError(f"{self.name}: '{n}' is on {t.device}, '{names[0]}' on {first.device}; "
                                       f"every tensor must be on one device")
        options = ",".join(f"{k}={v}" for k, v in sorted(config.items())).encode()
        key = (names, options, *[(t.shape, t.dtype) for t in tensors])
        specs = self._specs.get(key)
        if specs is None:
            meta = {n: t for n, t in zip(names, tensors)}
            specs = self._specs[key] = [_lib.output_shape(self.name, o, meta, options.decode(), shapes_only=True)
                                        for o in self.outputs]
        outs = tuple(torch.empty(shape, dtype=dtype, device=first.device) for shape, dtype in specs)
        _lib.run(self.name.encode(), options, names, tensors, tuple(self.outputs), outs)
        return outs

    def __call__(self, *args, **kwargs):
        named, config = self._bind(args, kwargs)
        needs_grad = (self.gradient is not None and torch.is_grad_enabled() and
                      any(t.requires_grad for t in named.values()))
        if needs_grad:
            outs = self._autograd()(config, *[named.get(n) for n in self.inputs])
        else:
            outs = self.run(named, config)
        return outs[0] if len(outs) == 1 else outs

    def _autograd(self):
        if self._function is None:
            op = self

            def forward(ctx, config, *inputs):
                named = {n: t for n, t in zip(op.inputs, inputs) if t is not None}
                ctx.save_for_backward(*inputs)
                ctx.config = config
                ctx.set_materialize_grads(False)
                return op.run(named, config)

            def backward(ctx, *grads):
                inputs = ctx.saved_tensors
                named = {n: t for n, t in zip(op.inputs, inputs) if t is not None}
                g = op.gradient
                for i, (name, grad) in enumerate(zip(op.outputs, grads)):
                    if f"d{name}" not in g.inputs:
                        continue
                    if grad is None:  # an output the loss does not use: a zero gradient
                        shape, dtype = op.run_shapes(named, ctx.config)[i]
                        grad = torch.zeros(shape, dtype=dtype, device=inputs[0].device)
                    named[f"d{name}"] = grad
                gin = {n: t for n, t in named.items() if n in g.inputs}
                results = dict(zip(g.outputs, g.run(gin, {})))
                return (None, *[results.get(f"d{n}") if t is not None and t.requires_grad else None
                                for n, t in zip(op.inputs, inputs)])

            self._function = type(f"{self.name}_function", (torch.autograd.Function,),
                                  {"forward": staticmethod(forward), "backward": staticmethod(backward)})
        return self._function.apply

    def run_shapes(self, named, config):
        names = tuple(n for n in self.inputs if n in named)
        options = ",".join(f"{k}={v}" for k, v in sorted(config.items()))
        meta = {n: named[n] for n in names}
        return [_lib.output_shape(self.name, o, meta, options, shapes_only=True) for o in self.outputs]


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
                ops[name].gradient = ops[grad]
        module = types.SimpleNamespace(**ops, __file__=str(source), library=key, ops=list(ops))
        _loaded[key] = module
        return module
