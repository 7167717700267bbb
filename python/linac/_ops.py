"""linac's ops as torch.library custom ops (torch.ops.linac.*), with fake implementations and autograd
through linac's backward kernels.

One forward op and one backward op per family, with fixed schemas: optional inputs are `Tensor?`, and an
output that a call does not produce (final_state without output_final_state, dg without a gate, ...)
is an empty tensor. The backward saves the inputs (q, k, v, gates, betas, initial state, cu_seqlens:
O(T*D)) and, where the forward saved them, its tables (`save`, below), and runs linac's backward (options
backward=1), never PyTorch autodiff of the forward.

  linear_attn(q, k, v, g?, initial_state?, cu_seqlens?, cu_seqlens_cpu?, scale, output_final_state,
              normalize, recurrent, config) -> (o, final_state)
  gla(q, k, v, g, initial_state?, ...)                         -> (o, final_state)
  delta_rule(q, k, v, beta, initial_state?, ..., l2norm_qk, recurrent, config) -> (o, final_state)
  gated_delta_rule(q, k, v, g, beta, initial_state?, ...)      -> (o, final_state)
  poly(q, k, v, cu_seqlens?, cu_seqlens_cpu?, coefficients?, scale, a, b, c, normalize, config, save)
      -> (o, saved_states, saved_zstates, saved_den, coefficients used)
  <op>_bwd(the forward's inputs, do, dfinal_state?, ...)       -> (dq, dk, dv, [dg,] [dbeta,] dinitial_state)
  poly_bwd(q, k, v, cu_seqlens?, cu_seqlens_cpu?, do, o?, saved_*?, coefficients?, scale, a, b, c, normalize,
           config, coefficient_grads)                          -> (dq, dk, dv, (da, db, dc))

poly's `coefficients` ([3]: a, b, c, for learned ones) replaces the floats a, b, c with its values, read on
the host; the forward returns them as a host tensor, which its backward takes. `save` (delta rules,
poly): the forward also returns the tables its backward takes (the training pair), else empty tensors.

`config` is extra "key=value,..." options for the forward (chunk_size=C, tuning parameters); poly's
backward takes the forward's `segment` (the saved tables' shapes depend on it).

Eager calls from the public functions (linac.chunk_gla, ...) skip the dispatcher: the custom op's own
implementation runs directly, under a torch.autograd.Function when gradients are needed (the same
setup and backward functions as the registered autograd), because the dispatcher and its Python
autograd wrapper cost tens of microseconds per call. A call that needs no gradient skips even that: the
public function runs the Direct of its call signature (its prepared linac_call and outputs' shapes,
made by make_direct below). Under torch.compile, and for tensor subclasses (fake, functional, meta...),
the calls go through torch.ops.linac.*.
"""

import threading
from operator import itemgetter
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _lib
from ._errors import InvalidCallError

_F32 = torch.float32

try:
    _is_compiling = torch.compiler.is_compiling
except AttributeError:  # pragma: no cover
    _is_compiling = torch._dynamo.is_compiling

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_data_ptr = torch.Tensor.data_ptr


def eager(t):
    """True when a call on `t` may bypass the dispatcher (a plain tensor, not under torch.compile)."""
    return type(t) in _PLAIN and not _is_compiling()


# --- calling the C ABI ------------------------------------------------------------------------------------

_options_cache = {}


def _options_text(pairs, config=""):
    """b"k=v,..." for (key, value) pairs (None/False dropped, True -> 1) plus `config`."""
    parts = [f"{k}={1 if v is True else v!r}" for k, v in pairs if v is not None and v is not False]
    if config:
        parts.append(config)
    return ",".join(parts).encode()


def _options(pairs, config=""):
    """_options_text, cached (for options a program repeats; not for learned coefficients' values)."""
    key = (pairs, config)
    s = _options_cache.get(key)
    if s is None:
        s = _options_cache[key] = _options_text(pairs, config)
    return s


# Each forward op's options, shared by its implementation and its Direct calls (linac._api).
def linear_attn_options(scale, normalize, recurrent, config):
    return _options((("scale", scale), ("normalize", normalize), ("recurrent", recurrent)), config)


def gla_options(scale, recurrent, config):
    return _options((("scale", scale), ("recurrent", recurrent)), config)


def delta_options(scale, l2norm_qk, recurrent, config):
    return _options((("scale", scale), ("l2norm_qk", l2norm_qk), ("recurrent", recurrent)), config)


def poly_options(scale, a, b, c, normalize, config):
    return _options((("scale", scale), ("a", a), ("b", b), ("c", c), ("no_normalize", not normalize)), config)


def _poly_coefficients(coefficients, a, b, c):
    """(a, b, c, cached): the floats, or the values of `coefficients` ([3]: a, b, c; learned ones) read on
    the host (a sync when it is on the GPU). Their options are then not cached: every step of training
    has new values. A learned c of 0 runs as 1e-300, 0 in the kernels' arithmetic: the op compiles the
    degree-2 blocks out at c = 0, and the saved tables' shapes may not depend on a tensor's value."""
    if coefficients is None:
        return a, b, c, True
    if coefficients.numel() != 3:
        raise InvalidCallError(f"poly: coefficients must hold a, b, c (3 values); got shape "
                               f"{tuple(coefficients.shape)}")
    a, b, c = coefficients.detach().to("cpu", torch.float64).tolist()
    return a, b, (c if c != 0 else 1e-300), False


def _inputs(q, k, v, named, initial_state, cu_seqlens, cu_seqlens_cpu):
    """Names and contiguous tensors of a call's inputs (absent optionals left out)."""
    names = ["q", "k", "v"]
    tensors = [q.contiguous(), k.contiguous(), v.contiguous()]
    for name, t in named:
        if t is not None:
            names.append(name)
            tensors.append(t.contiguous())
    if initial_state is not None:
        names.append("initial_state")
        tensors.append(initial_state.contiguous())
    if cu_seqlens is not None:
        names.append("cu_seqlens")
        tensors.append(cu_seqlens.contiguous())
        # The host copy spares linac a device->host read of the offsets (and a wait) on every call.
        if cu_seqlens_cpu is not None and cu_seqlens.get_device() >= 0:
            names.append("cu_seqlens_cpu")
            tensors.append(cu_seqlens_cpu.contiguous())
    return names, tensors


def _num_seqs(q, cu_seqlens):
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _state_like(q, v, cu_seqlens):
    N, H, K, V = _num_seqs(q, cu_seqlens), q.shape[2], q.shape[3], v.shape[3]
    return q.new_empty(N, H, K, V, dtype=_F32)  # sizes as ints: see Direct


# Set while an eager call without autograd runs an op's implementation directly (_Eager): its results go
# straight back to the caller's function, which drops the placeholders, so one cached empty tensor per
# device serves them all. Every other call (the dispatcher, autograd) makes fresh ones.
_direct = threading.local()
_placeholders = {}


def _none_tensor(q):
    """The empty tensor that stands for an output a call does not produce."""
    if getattr(_direct, "active", False):
        dev = q.get_device()  # eager calls have host or CUDA tensors: the ordinal names the device
        t = _placeholders.get(dev)
        if t is None:
            t = _placeholders[dev] = q.new_empty(0, dtype=_F32)
        return t
    return q.new_empty(0, dtype=_F32)


def _forward(op, options, q, k, v, named, initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state):
    names, tensors = _inputs(q, k, v, named, initial_state, cu_seqlens, cu_seqlens_cpu)
    o = q.new_empty(*q.shape[:3], v.shape[3])
    if output_final_state:
        ht = _state_like(q, v, cu_seqlens)
        _lib.run(op, options, tuple(names), tuple(tensors), ("o", "final_state"), (o, ht))
    else:
        ht = _none_tensor(q)
        _lib.run(op, options, tuple(names), tuple(tensors), ("o",), (o,))
    return o, ht


class Direct:
    """An eager forward call that needs no autograd, at one call signature that linac._api has checked
    (op, options, and each input's shape, dtype, device and contiguity): its outputs' shapes and its
    prepared linac_call are fixed, so a call is the outputs' allocations, the inputs' addresses and
    linac_call_run. Its results are _forward's: (o, final_state), final_state None when not asked for."""

    __slots__ = ("prepared", "dev", "present", "o_shape", "h_shape")

    def __init__(self, prepared, dev, present, o_shape, h_shape):
        self.prepared, self.dev, self.o_shape, self.h_shape = prepared, dev, o_shape, h_shape
        self.present = itemgetter(*present)  # the inputs that are not None, in order

    def __call__(self, q, inputs):
        """`inputs`: q, k, v and the op's other inputs in its order, None where absent (as at make)."""
        # Sizes as separate ints: torch parses a tuple of sizes about 0.45 us slower (2026-11-25).
        o = q.new_empty(*self.o_shape)
        ptrs = [*map(_data_ptr, self.present(inputs)), o.data_ptr()]
        ht = None
        if self.h_shape is not None:
            ht = q.new_empty(*self.h_shape, dtype=_F32)
            ptrs.append(ht.data_ptr())
        dev = self.dev
        if dev >= 0 and dev != _lib._current_device():
            with torch.cuda.device(dev):
                self.prepared.run(ptrs, dev, q)
        else:
            self.prepared.run(ptrs, dev, q)
        return o, ht


def make_direct(op, options, names, inputs, output_final_state):
    """The Direct of this call (its linac_call prepared now), or None where a call has none: an input
    that is not contiguous (the general path copies it). `names` and `inputs`: q, k, v and the op's
    other inputs in its order, None where absent; the Direct is called with inputs laid out alike."""
    if not all(t is None or t.is_contiguous() for t in inputs):
        return None
    present = [i for i, t in enumerate(inputs) if t is not None]
    q, v = inputs[0], inputs[2]
    o_shape = (*q.shape[:3], v.shape[3])
    h_shape = (q.shape[0], q.shape[2], q.shape[3], v.shape[3]) if output_final_state else None
    outs = (q.new_empty(o_shape),) + ((q.new_empty(h_shape, dtype=_F32),) if h_shape else ())
    prepared = _lib.prepared(op, options, tuple(names[i] for i in present), tuple(inputs[i] for i in present),
                             ("o", "final_state")[:len(outs)], outs)
    return Direct(prepared, q.get_device(), present, o_shape, h_shape)


def _backward(op, options, q, k, v, named, initial_state, cu_seqlens, cu_seqlens_cpu, do, dfinal_state,
              grads):
    """Runs `op` with backward=1. `grads`: (output name, input it differentiates or None) for the
    gradients besides dq, dk, dv; an absent input gives an empty tensor. Returns dq, dk, dv, *those."""
    names, tensors = _inputs(q, k, v, named, initial_state, cu_seqlens, cu_seqlens_cpu)
    names.append("do")
    tensors.append(do.contiguous())
    if dfinal_state is not None:
        names.append("dfinal_state")
        tensors.append(dfinal_state.contiguous())
    outs = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v)]
    out_names, result = ["dq", "dk", "dv"], list(outs)
    for name, x in grads:
        if x is None:
            result.append(_none_tensor(q))
        else:
            t = x.new_empty(x.shape, dtype=_F32)
            out_names.append(name)
            outs.append(t)
            result.append(t)
    _lib.run(op, options, tuple(names), tuple(tensors), tuple(out_names), tuple(outs))
    return tuple(result)


_IMPLS = {}


def _custom_op(name, impl):
    """Registers `impl` as torch.ops.linac.<name> (schema from its annotations)."""
    op = torch.library.custom_op(f"linac::{name}", impl, mutates_args=())
    _IMPLS[op] = impl
    return op


# --- forward ops ------------------------------------------------------------------------------------------

def _linear_attn(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], initial_state: Optional[Tensor],
                cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], scale: float,
                output_final_state: bool, normalize: bool, recurrent: bool, config: str) -> Tuple[Tensor, Tensor]:
    opts = linear_attn_options(scale, normalize, recurrent, config)
    return _forward(b"linear_attn", opts, q, k, v, (("g", g),), initial_state, cu_seqlens, cu_seqlens_cpu,
                    output_final_state)


def _gla(q: Tensor, k: Tensor, v: Tensor, g: Tensor, initial_state: Optional[Tensor], cu_seqlens: Optional[Tensor],
        cu_seqlens_cpu: Optional[Tensor], scale: float, output_final_state: bool, recurrent: bool,
        config: str) -> Tuple[Tensor, Tensor]:
    opts = gla_options(scale, recurrent, config)
    return _forward(b"gla", opts, q, k, v, (("g", g),), initial_state, cu_seqlens, cu_seqlens_cpu,
                    output_final_state)


_SAVED = ("saved_w", "saved_t", "saved_h", "saved_v_new")
_saved_specs_cache = {}


def _saved_specs(op, q, v, gated, h0, options):
    """(shape, dtype) of the delta rules' saved tables for a call of these shapes. linac_op_output_shape
    is asked once per head dims, dtype and options, at B = T = 1, for the tables' chunk and dtypes; the
    shapes follow from B and T (which may be symbolic under torch.compile):
      saved_w [B,T,H,K], saved_t [B,T,H,C], saved_h [B*ceil(T/C),H,K,V], saved_v_new [B,T,H,V]."""
    B, T, H, K = q.shape
    V = v.shape[3]
    key = (op, int(H), int(K), int(V), q.dtype, gated, h0 is not None, options)
    template = _saved_specs_cache.get(key)
    if template is None:
        one = torch.empty((1, 1, int(H), int(K)), dtype=q.dtype, device="meta")
        meta = {"q": one, "k": one, "v": torch.empty((1, 1, int(H), int(V)), dtype=q.dtype, device="meta"),
                "beta": torch.empty((1, 1, int(H)), device="meta")}
        if gated:
            meta["g"] = meta["beta"]
        if h0 is not None:
            meta["initial_state"] = torch.empty((1, int(H), int(K), int(V)), device="meta")
        template = _saved_specs_cache[key] = tuple(
            _lib.output_shape(op.decode(), name, meta, options.decode(), shapes_only=True) for name in _SAVED)
    (_, w_dtype), ((_, _, _, C), t_dtype), (_, h_dtype), (_, v_dtype) = template
    return (((B, T, H, K), w_dtype), ((B, T, H, C), t_dtype), ((B * ((T + C - 1) // C), H, K, V), h_dtype),
            ((B, T, H, V), v_dtype))


def _delta_forward(op, opts, q, k, v, named, initial_state, output_final_state, save):
    """The delta rules' forward without varlen when `save`: o, the final state and the tables the backward
    takes (the training pair: the backward then skips recomputing them)."""
    names, tensors = _inputs(q, k, v, named, initial_state, None, None)
    o = q.new_empty(*q.shape[:3], v.shape[3])
    out_names, outs = ["o"], [o]
    ht = _none_tensor(q)
    if output_final_state:
        ht = _state_like(q, v, None)
        out_names.append("final_state")
        outs.append(ht)
    specs = _saved_specs(op, q, v, len(named) == 2, initial_state, opts)
    saved = [q.new_empty(shape, dtype=dtype) for shape, dtype in specs]
    _lib.run(op, opts, tuple(names), tuple(tensors), tuple(out_names) + _SAVED, tuple(outs) + tuple(saved))
    return (o, ht, *saved)


def _no_saved(q):
    if getattr(_direct, "active", False):
        return (_none_tensor(q),) * len(_SAVED)
    # Distinct tensors outside eager calls: a custom op's outputs may not alias each other.
    return tuple(_none_tensor(q) for _ in _SAVED)


def _delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, initial_state: Optional[Tensor],
               cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], scale: float,
               output_final_state: bool, l2norm_qk: bool, recurrent: bool, config: str,
               save: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    opts = delta_options(scale, l2norm_qk, recurrent, config)
    if save:
        return _delta_forward(b"delta_rule", opts, q, k, v, (("beta", beta),), initial_state, output_final_state,
                              save)
    return (*_forward(b"delta_rule", opts, q, k, v, (("beta", beta),), initial_state, cu_seqlens, cu_seqlens_cpu,
                      output_final_state), *_no_saved(q))


def _gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Optional[Tensor],
                     cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], scale: float,
                     output_final_state: bool, l2norm_qk: bool, recurrent: bool, config: str,
                     save: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    opts = delta_options(scale, l2norm_qk, recurrent, config)
    if save:
        return _delta_forward(b"gated_delta_rule", opts, q, k, v, (("g", g), ("beta", beta)), initial_state,
                              output_final_state, save)
    return (*_forward(b"gated_delta_rule", opts, q, k, v, (("g", g), ("beta", beta)), initial_state, cu_seqlens,
                      cu_seqlens_cpu, output_final_state), *_no_saved(q))


_POLY_SAVED = ("saved_states", "saved_zstates", "saved_den")
_poly_layout_cache = {}
_LONGEST_SEGMENT = 8192  # the op's largest --config segment (rows)


def _poly_layout(q, v, normalize, quadratic, config):
    """What poly's saved tables look like at these head dims, dtype and options, from
    linac_op_output_shape (asked once per key, on meta tensors): (L, the segment's rows; saved_states'
    shape past its segments axis and dtype; saved_zstates' likewise; saved_den's dtype). The tables
    have one row per segment of L tokens of every sequence (B * ceil(T / L) without varlen), which the
    callers count: T may be symbolic under torch.compile. L comes from the count at T = 8192 (segments
    are powers of two up to 8192 rows). The coefficients asked with are any positive f: the shapes
    depend on c != 0 only."""
    H, K, V = int(q.shape[2]), int(q.shape[3]), int(v.shape[3])
    key = (H, K, V, q.dtype, normalize, quadratic, config)
    layout = _poly_layout_cache.get(key)
    if layout is None:
        opts = _options_text((("a", 1.0), ("b", 0.0), ("c", 0.5 if quadratic else 0.0),
                              ("no_normalize", not normalize)), config).decode()

        def ask(T, name):
            qk = torch.empty((1, T, H, K), dtype=q.dtype, device="meta")
            meta = {"q": qk, "k": qk, "v": torch.empty((1, T, H, V), dtype=q.dtype, device="meta")}
            return _lib.output_shape("poly", name, meta, opts, shapes_only=True)

        (states, states_dtype), (longest, _) = ask(1, "saved_states"), ask(_LONGEST_SEGMENT, "saved_states")
        z_tail = z_dtype = den_dtype = None
        if normalize:
            zstates, z_dtype = ask(1, "saved_zstates")
            z_tail, den_dtype = zstates[1:], ask(1, "saved_den")[1]
        layout = _poly_layout_cache[key] = (_LONGEST_SEGMENT // longest[0], states[1:], states_dtype, z_tail,
                                            z_dtype, den_dtype)
    return layout


def _poly_saved_like(q, segments, layout):
    """Empty saved tables for `segments` segments (None for those the form does not save)."""
    _, states, states_dtype, zstates, z_dtype, den_dtype = layout
    return (q.new_empty((segments, *states), dtype=states_dtype),
            None if zstates is None else q.new_empty((segments, *zstates), dtype=z_dtype),
            None if den_dtype is None else q.new_empty(q.shape[:3], dtype=den_dtype))


def _no_poly_saved(q):
    if getattr(_direct, "active", False):
        return (_none_tensor(q),) * len(_POLY_SAVED)
    return tuple(_none_tensor(q) for _ in _POLY_SAVED)  # custom op outputs may not alias each other


def _poly(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
         coefficients: Optional[Tensor], scale: float, a: float, b: float, c: float, normalize: bool, config: str,
         save: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    a, b, c, cached = _poly_coefficients(coefficients, a, b, c)
    pairs = (("scale", scale), ("a", a), ("b", b), ("c", c), ("no_normalize", not normalize))
    opts = _options(pairs, config) if cached else _options_text(pairs, config)
    # The values used, on the host, for the backward (which then reads no device memory to get them).
    used = _none_tensor(q) if coefficients is None else torch.tensor((a, b, c), dtype=torch.float64)
    if not save:
        o = _forward(b"poly", opts, q, k, v, (), None, cu_seqlens, cu_seqlens_cpu, False)[0]
        return (o, *_no_poly_saved(q), used)
    # The training pair: the forward also writes its per-segment states (and, normalized, their
    # normalizer and its denominator), which the backward then does not recompute.
    layout = _poly_layout(q, v, normalize, coefficients is not None or c != 0, config)
    L = layout[0]
    if cu_seqlens is None:
        segments = q.shape[0] * ((q.shape[1] + L - 1) // L)
    else:
        host = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens.cpu()
        segments = int(((host[1:] - host[:-1] + L - 1) // L).sum())
        cu_seqlens_cpu = host  # spares linac its own read of the offsets
    saved = _poly_saved_like(q, segments, layout)
    names, tensors = _inputs(q, k, v, (), None, cu_seqlens, cu_seqlens_cpu)
    o = q.new_empty(*q.shape[:3], v.shape[3])
    out_names = ("o",) + tuple(n for n, t in zip(_POLY_SAVED, saved) if t is not None)
    _lib.run(b"poly", opts, tuple(names), tuple(tensors), out_names, (o, *(t for t in saved if t is not None)))
    return (o, *(_none_tensor(q) if t is None else t for t in saved), used)


linear_attn = _custom_op("linear_attn", _linear_attn)
gla = _custom_op("gla", _gla)
delta_rule = _custom_op("delta_rule", _delta_rule)
gated_delta_rule = _custom_op("gated_delta_rule", _gated_delta_rule)
poly = _custom_op("poly", _poly)


def _fake_forward(q, v, cu_seqlens, output_final_state):
    o = q.new_empty(*q.shape[:3], v.shape[3])
    return o, (_state_like(q, v, cu_seqlens) if output_final_state else _none_tensor(q))


@linear_attn.register_fake
def _(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, normalize, recurrent,
      config):
    return _fake_forward(q, v, cu_seqlens, output_final_state)


@gla.register_fake
def _(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, recurrent, config):
    return _fake_forward(q, v, cu_seqlens, output_final_state)


def _fake_delta(op, q, k, v, named, initial_state, cu_seqlens, scale, output_final_state, l2norm_qk, recurrent,
                config, save):
    o, ht = _fake_forward(q, v, cu_seqlens, output_final_state)
    if not save:
        return (o, ht, *(_none_tensor(q) for _ in _SAVED))
    opts = delta_options(scale, l2norm_qk, recurrent, config)
    specs = _saved_specs(op, q, v, len(named) == 2, initial_state, opts)
    return (o, ht, *(q.new_empty(shape, dtype=dtype) for shape, dtype in specs))


@delta_rule.register_fake
def _(q, k, v, beta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, l2norm_qk, recurrent,
      config, save):
    return _fake_delta(b"delta_rule", q, k, v, (beta,), initial_state, cu_seqlens, scale, output_final_state,
                       l2norm_qk, recurrent, config, save)


@gated_delta_rule.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, l2norm_qk,
      recurrent, config, save):
    return _fake_delta(b"gated_delta_rule", q, k, v, (g, beta), initial_state, cu_seqlens, scale,
                       output_final_state, l2norm_qk, recurrent, config, save)


@poly.register_fake
def _(q, k, v, cu_seqlens, cu_seqlens_cpu, coefficients, scale, a, b, c, normalize, config, save):
    o = q.new_empty((*q.shape[:3], v.shape[3]))
    used = _none_tensor(q) if coefficients is None else torch.empty(3, dtype=torch.float64, device="cpu")
    if not save:
        return (o, *_no_poly_saved(q), used)
    layout = _poly_layout(q, v, normalize, coefficients is not None or c != 0, config)
    if cu_seqlens is None:
        segments = q.shape[0] * ((q.shape[1] + layout[0] - 1) // layout[0])
    else:  # the count depends on the offsets' values
        segments = torch.library.get_ctx().new_dynamic_size()
    saved = _poly_saved_like(q, segments, layout)
    return (o, *(_none_tensor(q) if t is None else t for t in saved), used)


# --- backward ops -----------------------------------------------------------------------------------------

def _linear_attn_bwd(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], initial_state: Optional[Tensor],
                    cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], do: Tensor,
                    dfinal_state: Optional[Tensor], scale: float,
                    normalize: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    opts = _options((("backward", True), ("scale", scale), ("normalize", normalize)))
    return _backward(b"linear_attn", opts, q, k, v, (("g", g),), initial_state, cu_seqlens, cu_seqlens_cpu, do,
                     dfinal_state, (("dg", g), ("dinitial_state", initial_state)))


def _gla_bwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, initial_state: Optional[Tensor],
            cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], do: Tensor,
            dfinal_state: Optional[Tensor], scale: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    opts = _options((("backward", True), ("scale", scale)))
    return _backward(b"gla", opts, q, k, v, (("g", g),), initial_state, cu_seqlens, cu_seqlens_cpu, do,
                     dfinal_state, (("dg", g), ("dinitial_state", initial_state)))


def _saved_inputs(saved):
    """(name, tensor) of the forward's saved tables given to a backward (none when it recomputes them)."""
    return tuple(zip(_SAVED, saved)) if saved[0] is not None else ()


def _delta_rule_bwd(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, initial_state: Optional[Tensor],
                   cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], do: Tensor,
                   dfinal_state: Optional[Tensor], scale: float, l2norm_qk: bool, saved_w: Optional[Tensor],
                   saved_t: Optional[Tensor], saved_h: Optional[Tensor],
                   saved_v_new: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    opts = _options((("backward", True), ("scale", scale), ("l2norm_qk", l2norm_qk)))
    saved = _saved_inputs((saved_w, saved_t, saved_h, saved_v_new))
    return _backward(b"delta_rule", opts, q, k, v, (("beta", beta), *saved), initial_state, cu_seqlens,
                     cu_seqlens_cpu, do, dfinal_state, (("dbeta", beta), ("dinitial_state", initial_state)))


def _gated_delta_rule_bwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Optional[Tensor],
                         cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor], do: Tensor,
                         dfinal_state: Optional[Tensor], scale: float, l2norm_qk: bool,
                         saved_w: Optional[Tensor], saved_t: Optional[Tensor], saved_h: Optional[Tensor],
                         saved_v_new: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    opts = _options((("backward", True), ("scale", scale), ("l2norm_qk", l2norm_qk)))
    saved = _saved_inputs((saved_w, saved_t, saved_h, saved_v_new))
    return _backward(b"gated_delta_rule", opts, q, k, v, (("g", g), ("beta", beta), *saved), initial_state,
                     cu_seqlens, cu_seqlens_cpu, do, dfinal_state,
                     (("dg", g), ("dbeta", beta), ("dinitial_state", initial_state)))


def _poly_bwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Optional[Tensor], cu_seqlens_cpu: Optional[Tensor],
             do: Tensor, o: Optional[Tensor], saved_states: Optional[Tensor], saved_zstates: Optional[Tensor],
             saved_den: Optional[Tensor], coefficients: Optional[Tensor], scale: float, a: float, b: float, c: float,
             normalize: bool, config: str, coefficient_grads: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv and, with coefficient_grads, (da, db, dc) fp32 [3] (else an empty tensor). Given the
    forward's saved tables (and its o when normalized), the backward skips recomputing them."""
    a, b, c, cached = _poly_coefficients(coefficients, a, b, c)
    pairs = (("backward", True), ("scale", scale), ("a", a), ("b", b), ("c", c), ("no_normalize", not normalize))
    opts = _options(pairs, config) if cached else _options_text(pairs, config)
    saved = (("o", o), ("saved_states", saved_states), ("saved_zstates", saved_zstates), ("saved_den", saved_den))
    names, tensors = _inputs(q, k, v, saved if saved_states is not None else (), None, cu_seqlens, cu_seqlens_cpu)
    names.append("do")
    tensors.append(do.contiguous())
    outs = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v)]
    out_names = ["dq", "dk", "dv"]
    if coefficient_grads:
        out_names += ["da", "db", "dc"]
        outs += [q.new_empty(1, dtype=_F32) for _ in range(3)]
    _lib.run(b"poly", opts, tuple(names), tuple(tensors), tuple(out_names), tuple(outs))
    return (*outs[:3], torch.cat(outs[3:]) if coefficient_grads else _none_tensor(q))


linear_attn_bwd = _custom_op("linear_attn_bwd", _linear_attn_bwd)
gla_bwd = _custom_op("gla_bwd", _gla_bwd)
delta_rule_bwd = _custom_op("delta_rule_bwd", _delta_rule_bwd)
gated_delta_rule_bwd = _custom_op("gated_delta_rule_bwd", _gated_delta_rule_bwd)
poly_bwd = _custom_op("poly_bwd", _poly_bwd)


def _fake_grads(q, k, v, xs):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            *(_none_tensor(q) if x is None else x.new_empty(x.shape, dtype=_F32) for x in xs))


@linear_attn_bwd.register_fake
def _(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_cpu, do, dfinal_state, scale, normalize):
    return _fake_grads(q, k, v, (g, initial_state))


@gla_bwd.register_fake
def _(q, k, v, g, initial_state, cu_seqlens, cu_seqlens_cpu, do, dfinal_state, scale):
    return _fake_grads(q, k, v, (g, initial_state))


@delta_rule_bwd.register_fake
def _(q, k, v, beta, initial_state, cu_seqlens, cu_seqlens_cpu, do, dfinal_state, scale, l2norm_qk, saved_w,
      saved_t, saved_h, saved_v_new):
    return _fake_grads(q, k, v, (beta, initial_state))


@gated_delta_rule_bwd.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, do, dfinal_state, scale, l2norm_qk, saved_w,
      saved_t, saved_h, saved_v_new):
    return _fake_grads(q, k, v, (g, beta, initial_state))


@poly_bwd.register_fake
def _(q, k, v, cu_seqlens, cu_seqlens_cpu, do, o, saved_states, saved_zstates, saved_den, coefficients, scale, a, b, c,
      normalize, config, coefficient_grads):
    return (*_fake_grads(q, k, v, ()), q.new_empty(3, dtype=_F32) if coefficient_grads else _none_tensor(q))


# --- autograd ---------------------------------------------------------------------------------------------
# setup_context and backward are shared by the registered autograd (torch.ops.linac.*) and the eager
# autograd.Functions below. A backward calls the custom backward op under tracing, its implementation
# directly in eager mode.

def _bwd_op(op, t):
    return _IMPLS[op] if eager(t) else op


def _do(ctx, do, o_shape_from):
    """do, or zeros when only the final state was used (grads are not materialized)."""
    if do is not None:
        return do
    q, v = o_shape_from
    return q.new_zeros((*q.shape[:3], v.shape[3]))


def _dfinal(ctx, dht):
    if not ctx.output_final_state or dht is None or dht.numel() == 0:
        return None
    return dht


def _cast(grad, like):
    return None if like is None else grad.to(like.dtype)


def _setup_linear_attn(ctx, inputs, output):
    q, k, v, g, h0, cu, cu_cpu, scale, output_final_state, normalize, recurrent, config = inputs
    ctx.save_for_backward(q, k, v, g, h0, cu, cu_cpu)
    ctx.scale, ctx.output_final_state, ctx.normalize = scale, output_final_state, normalize
    ctx.set_materialize_grads(False)


def _backward_linear_attn(ctx, do, dht):
    q, k, v, g, h0, cu, cu_cpu = ctx.saved_tensors
    dq, dk, dv, dg, dh0 = _bwd_op(linear_attn_bwd, q)(q, k, v, g, h0, cu, cu_cpu, _do(ctx, do, (q, v)),
                                                      _dfinal(ctx, dht), ctx.scale, ctx.normalize)
    return dq, dk, dv, _cast(dg, g), (None if h0 is None else dh0), None, None, None, None, None, None, None


def _setup_gla(ctx, inputs, output):
    q, k, v, g, h0, cu, cu_cpu, scale, output_final_state, recurrent, config = inputs
    ctx.save_for_backward(q, k, v, g, h0, cu, cu_cpu)
    ctx.scale, ctx.output_final_state = scale, output_final_state
    ctx.set_materialize_grads(False)


def _backward_gla(ctx, do, dht):
    q, k, v, g, h0, cu, cu_cpu = ctx.saved_tensors
    # The recurrent form's gradients are the chunked form's (same function): linac's backward is chunked.
    dq, dk, dv, dg, dh0 = _bwd_op(gla_bwd, q)(q, k, v, g, h0, cu, cu_cpu, _do(ctx, do, (q, v)), _dfinal(ctx, dht),
                                              ctx.scale)
    return dq, dk, dv, _cast(dg, g), (None if h0 is None else dh0), None, None, None, None, None, None


def _setup_delta(ctx, inputs, output):
    gated = len(inputs) == 14
    if gated:
        q, k, v, g, beta, h0, cu, cu_cpu, scale, output_final_state, l2norm_qk, recurrent, config, save = inputs
    else:
        q, k, v, beta, h0, cu, cu_cpu, scale, output_final_state, l2norm_qk, recurrent, config, save = inputs
        g = None
    # The training pair: the forward's tables when it saved them (O(T*D) each but the per-chunk states,
    # O(T/C * K*V)), else the backward recomputes them.
    saved = tuple(output[2:]) if save else (None,) * len(_SAVED)
    ctx.save_for_backward(q, k, v, g, beta, h0, cu, cu_cpu, *saved)
    ctx.gated, ctx.scale, ctx.output_final_state, ctx.l2norm_qk = gated, scale, output_final_state, l2norm_qk
    ctx.set_materialize_grads(False)


def _backward_delta(ctx, do, dht, *_saved_grads):
    q, k, v, g, beta, h0, cu, cu_cpu, *saved = ctx.saved_tensors
    do = _do(ctx, do, (q, v))
    # With l2norm_qk, linac's backward normalizes q and k itself and returns the raw inputs' gradients.
    if ctx.gated:
        dq, dk, dv, dg, dbeta, dh0 = _bwd_op(gated_delta_rule_bwd, q)(q, k, v, g, beta, h0, cu, cu_cpu, do,
                                                                      _dfinal(ctx, dht), ctx.scale, ctx.l2norm_qk,
                                                                      *saved)
    else:
        dq, dk, dv, dbeta, dh0 = _bwd_op(delta_rule_bwd, q)(q, k, v, beta, h0, cu, cu_cpu, do, _dfinal(ctx, dht),
                                                            ctx.scale, ctx.l2norm_qk, *saved)
        dg = None
    rest = (None if h0 is None else dh0, None, None, None, None, None, None, None, None)
    if ctx.gated:
        return (dq, dk, dv, _cast(dg, g), _cast(dbeta, beta), *rest)
    return (dq, dk, dv, _cast(dbeta, beta), *rest)


def _poly_bwd_config(config):
    """The forward's `segment` for the backward (the saved tables' shapes depend on it); not its chunk or
    tuning keys: the backward's per-chunk kernels have defaults of their own."""
    return ",".join(item for item in config.split(",") if item.startswith("segment="))


def _setup_poly(ctx, inputs, output):
    q, k, v, cu, cu_cpu, coefficients, scale, a, b, c, normalize, config, save = inputs
    o, states, zstates, den, used = output
    # The training pair: the per-segment states (O(T/L * K^2 V)) and, normalized, their normalizer, the
    # denominator [B, T, H] and o, else the backward recomputes them. `used`: the coefficients' values
    # the forward ran with, on the host.
    saved = (None,) * 4
    if save:
        saved = (o, states, zstates, den) if normalize else (None, states, None, None)
    ctx.save_for_backward(q, k, v, cu, cu_cpu, *saved, None if coefficients is None else used)
    ctx.params = (scale, a, b, c, normalize, _poly_bwd_config(config))
    ctx.coefficients = None if coefficients is None else (coefficients.dtype, coefficients.device)
    ctx.set_materialize_grads(False)


def _backward_poly(ctx, do, *_saved_grads):
    q, k, v, cu, cu_cpu, o, states, zstates, den, used = ctx.saved_tensors
    coefficient_grads = ctx.coefficients is not None and ctx.needs_input_grad[5]
    dq, dk, dv, dcoef = _bwd_op(poly_bwd, q)(q, k, v, cu, cu_cpu, _do(ctx, do, (q, v)), o, states, zstates, den,
                                             used, *ctx.params, coefficient_grads)
    if coefficient_grads:
        dtype, device = ctx.coefficients
        dcoef = dcoef.to(device=device, dtype=dtype)
    else:
        dcoef = None
    return dq, dk, dv, None, None, dcoef, None, None, None, None, None, None, None


linear_attn.register_autograd(_backward_linear_attn, setup_context=_setup_linear_attn)
gla.register_autograd(_backward_gla, setup_context=_setup_gla)
delta_rule.register_autograd(_backward_delta, setup_context=_setup_delta)
gated_delta_rule.register_autograd(_backward_delta, setup_context=_setup_delta)
poly.register_autograd(_backward_poly, setup_context=_setup_poly)


def _eager_function(name, impl, setup, backward):
    """A torch.autograd.Function running `impl` with the registered op's setup and backward."""

    def forward(ctx, *inputs):
        output = impl(*inputs)
        setup(ctx, inputs, output)
        return output

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                    "backward": staticmethod(backward)})


class _Eager:
    """Per op: `call(*args)` runs it without the dispatcher (eager, plain tensors)."""

    def __init__(self, name, op, setup, backward, differentiable):
        self.op = op
        self.impl = _IMPLS[op]
        self.fn = _eager_function(name, self.impl, setup, backward)
        self.differentiable = differentiable  # positions of the tensor arguments gradients flow to

    def __call__(self, *args):
        if not eager(args[0]):
            return self.op(*args)
        if torch.is_grad_enabled():
            for i in self.differentiable:
                t = args[i]
                if t is not None and t.requires_grad:
                    return self.fn.apply(*args)
        _direct.active = True
        try:
            return self.impl(*args)
        finally:
            _direct.active = False


call_linear_attn = _Eager("LinearAttnFunction", linear_attn, _setup_linear_attn, _backward_linear_attn,
                          (0, 1, 2, 3, 4))
call_gla = _Eager("GlaFunction", gla, _setup_gla, _backward_gla, (0, 1, 2, 3, 4))
call_delta_rule = _Eager("DeltaRuleFunction", delta_rule, _setup_delta, _backward_delta, (0, 1, 2, 3, 4))
call_gated_delta_rule = _Eager("GatedDeltaRuleFunction", gated_delta_rule, _setup_delta, _backward_delta,
                               (0, 1, 2, 3, 4, 5))
call_poly = _Eager("PolyFunction", poly, _setup_poly, _backward_poly, (0, 1, 2, 5))

FORWARD_OPS = {"linear_attn": linear_attn, "gla": gla, "delta_rule": delta_rule,
               "gated_delta_rule": gated_delta_rule, "poly": poly}
BACKWARD_OPS = {"linear_attn": linear_attn_bwd, "gla": gla_bwd, "delta_rule": delta_rule_bwd,
                "gated_delta_rule": gated_delta_rule_bwd, "poly": poly_bwd}
