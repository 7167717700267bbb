"""fla's public op functions, on linac's kernels: same names, argument order, defaults and return values,
so that a model switches by changing an import (`from fla.ops.gla import chunk_gla` ->
`from linac.ops.gla import chunk_gla`).

Every function takes q, k [B, T, H, K], v [B, T, H, V] (float32, float16 or bfloat16), `scale` (default
K^-1/2), `initial_state` [N, H, K, V], `output_final_state`, `cu_seqlens` [N+1] (packed sequences, B = 1)
and returns (o [B, T, H, V], final_state [N, H, K, V] fp32 or None). Arguments of fla's signatures
that linac does not implement raise UnsupportedError when set; none is ignored. Non-contiguous inputs
are copied (.contiguous()) before the kernels read them.
"""

import torch

from . import _lib, _ops
from ._errors import InvalidCallError, UnsupportedError

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_INTS = (torch.int32, torch.int64)


# --- call signatures: the checks run once per signature -------------------------------------------------
#
# An eager call on plain tensors has a signature: the public function, its options, and each tensor's
# shape, dtype, device and contiguity; everything the checks below read is in it. The checks run on the
# first call of a signature and the signature is remembered only when they pass, so a call whose
# signature is new (another dtype, shape or device) is checked in full and a bad one raises as before.
# A remembered signature also keeps the call's Direct (linac._ops): when no gradient is needed, a call
# goes from here to linac_call_run without the dispatcher, autograd or a second key. Under
# torch.compile, for tensor subclasses, with cu_seqlens (varlen calls are not prepared: their plan
# depends on the offsets' values) and for a `scale` that is not a Python number, calls have no signature
# and are checked every time.

_signatures = {}
_MAX_SIGNATURES = 4096
_NUMBERS = (float, int, type(None))
_PLAIN = _ops._PLAIN
_is_compiling = _ops._is_compiling
_grad_enabled = torch.is_grad_enabled


class _Signature:
    """A checked call signature; `direct`: its Direct once made, False where it has none."""

    __slots__ = ("direct",)

    def __init__(self):
        self.direct = None


def _remember(key):
    if len(_signatures) >= _MAX_SIGNATURES:
        _signatures.clear()
    entry = _signatures[key] = _Signature()
    return entry


_lib._on_forget.append(_signatures.clear)  # a Direct holds a prepared call

# A Direct's inputs, in the ops' order (None where absent).
_QKVG = ("q", "k", "v", "g", "initial_state")
_QKVGB = ("q", "k", "v", "g", "beta", "initial_state")


def _t(t):
    """An optional tensor's part of a signature."""
    return None if t is None else (t.shape, t.dtype, t.device, t.is_contiguous())


# --- argument checks (cheap, in Python, so that they also run while torch.compile traces) ---------------

def _fail(fn, msg):
    raise InvalidCallError(f"{fn}: {msg}")


def _same_device(a, b, d):
    """a is on b's device, whose ordinal is d (b.get_device()). Ordinals first: making a torch.device per
    tensor costs a microsecond of every call. Host and meta tensors both have ordinal -1."""
    return a.get_device() == d and (d >= 0 or a.device == b.device)


def _check(fn, q, k, v, cu_seqlens=None, cu_seqlens_cpu=None, initial_state=None, gates=()):
    """q, k, v, cu_seqlens, initial_state and every (name, tensor, expected shape) in `gates`."""
    if q.dim() != 4:
        _fail(fn, f"q must be [B, T, H, K]; got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        _fail(fn, f"k must have q's shape {tuple(q.shape)}; got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        if v.dim() == 4 and v.shape[:2] == q.shape[:2] and v.shape[2] != q.shape[2]:
            raise UnsupportedError(f"{fn}: v has {v.shape[2]} heads and q {q.shape[2]}: linac has no grouped "
                                   f"value heads (GVA); repeat q and k to v's heads")
        _fail(fn, f"v must be [B, T, H, V] with q's B, T, H {tuple(q.shape[:3])}; got {tuple(v.shape)}")
    if q.dtype not in _FLOATS:
        _fail(fn, f"q must be float32, float16 or bfloat16; got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        _fail(fn, f"q, k and v must have one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    d = q.get_device()
    if not (_same_device(k, q, d) and _same_device(v, q, d)):
        _fail(fn, f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}")
    for name, t, shape in gates:
        if not _same_device(t, q, d):
            _fail(fn, f"{name} is on {t.device}, q on {q.device}; every tensor must be on q's device")
        if t.dtype != torch.float32 and t.dtype != q.dtype:
            _fail(fn, f"{name} must be float32 or q's dtype {q.dtype}; got {t.dtype}")
        if t.shape != shape:
            _fail(fn, f"{name} must have shape {tuple(shape)}; got {tuple(t.shape)}")
    N = q.shape[0]
    if cu_seqlens is not None:
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in _INTS or cu_seqlens.shape[0] < 2:
            _fail(fn, f"cu_seqlens must be a 1-D int32/int64 tensor of N+1 offsets; got {cu_seqlens.dtype} "
                      f"of shape {tuple(cu_seqlens.shape)}")
        if not _same_device(cu_seqlens, q, d):
            _fail(fn, f"cu_seqlens is on {cu_seqlens.device}, q on {q.device}; pass it on q's device "
                      f"(and a host copy as cu_seqlens_cpu)")
        if q.shape[0] != 1:
            _fail(fn, f"the batch size must be 1 with cu_seqlens (flatten the sequences into one row); "
                      f"got {q.shape[0]}")
        N = cu_seqlens.shape[0] - 1
        if cu_seqlens_cpu is not None:
            if cu_seqlens_cpu.device.type != "cpu":
                _fail(fn, f"cu_seqlens_cpu must be a host tensor; got one on {cu_seqlens_cpu.device}")
            if cu_seqlens_cpu.shape != cu_seqlens.shape or cu_seqlens_cpu.dtype not in _INTS:
                _fail(fn, "cu_seqlens_cpu must be a host copy of cu_seqlens (same length, int32/int64)")
    elif cu_seqlens_cpu is not None:
        _fail(fn, "cu_seqlens_cpu without cu_seqlens")
    if initial_state is not None:
        shape = (N, q.shape[2], q.shape[3], v.shape[3])
        if not _same_device(initial_state, q, d):
            _fail(fn, f"initial_state is on {initial_state.device}, q on {q.device}")
        if initial_state.shape != shape:
            n = "len(cu_seqlens) - 1" if cu_seqlens is not None else "B"
            _fail(fn, f"initial_state must be [N, H, K, V] = {shape} (N = {n}); got {tuple(initial_state.shape)}")


def _scale(q, scale):
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def _state_in(initial_state, state_v_first):
    """fp32, [N, H, K, V] (fla's state_v_first layout [N, H, V, K] transposed: a copy)."""
    if initial_state is None:
        return None
    if state_v_first:
        initial_state = initial_state.transpose(-1, -2)
    return initial_state if initial_state.dtype == torch.float32 else initial_state.float()


def _state_out(final_state, output_final_state, state_v_first):
    if not output_final_state:
        return None
    return final_state.transpose(-1, -2).contiguous() if state_v_first else final_state


def _config(fn, kwargs, allowed=()):
    """fla's **kwargs: chunk_size -> linac's chunk_size option; flags linac lacks raise when set."""
    config = ""
    for key, value in kwargs.items():
        if key == "chunk_size":
            if value is not None:
                config = f"chunk_size={int(value)}"
        elif key == "head_first":
            if value:
                raise UnsupportedError(f"{fn}: head_first=True was removed from fla; inputs are [B, T, H, D]")
        elif key in allowed:
            if value is not None and value is not False:
                raise UnsupportedError(f"{fn}: linac does not implement {key}={value!r}")
        else:
            raise TypeError(f"{fn}() got an unexpected keyword argument '{key}'")
    return config


def _any_set(*values):
    """Whether an fla argument linac lacks is set (not None or False): then _unsupported says which. Spares
    every call the keyword dict of _unsupported."""
    for value in values:
        if value is not None and value is not False:
            return True
    return False


def _unsupported(fn, **args):
    for key, value in args.items():
        if value is not None and value is not False:
            raise UnsupportedError(f"{fn}: linac does not implement {key}" +
                                   ("" if isinstance(value, torch.Tensor) else f"={value!r}"))


def _gate_shape(q):
    return q.shape[:3]


# --- linear attention and simple GLA (linac's linear_attn) ------------------------------------------------

def _linear_attn(fn, q, k, v, g, scale, initial_state, output_final_state, normalize, recurrent, state_v_first,
                 cu_seqlens, cu_seqlens_cpu, config):
    h0 = _state_in(initial_state, state_v_first)
    output_final_state, normalize = bool(output_final_state), bool(normalize)
    recurrent = recurrent and not normalize
    key = entry = None
    if (cu_seqlens is None and cu_seqlens_cpu is None and not _is_compiling() and type(q) in _PLAIN and
            type(scale) in _NUMBERS):
        try:
            key = (fn, config, scale, output_final_state, normalize, recurrent, state_v_first,
                   q.shape, q.dtype, q.device, q.is_contiguous(), k.shape, k.dtype, k.device, k.is_contiguous(),
                   v.shape, v.dtype, v.device, v.is_contiguous(), _t(g), _t(h0))
            entry = _signatures.get(key)
        except (AttributeError, TypeError):  # not tensors: the checks say what is wrong
            key = None
    if entry is None:
        _check(fn, q, k, v, cu_seqlens, cu_seqlens_cpu, h0, () if g is None else (("g", g, _gate_shape(q)),))
        if normalize and (h0 is not None or output_final_state):
            raise UnsupportedError(f"{fn}: linac's normalized linear attention keeps no state (fla's (kv, z) "
                                   f"pair): pass normalize=False, or no initial_state and output_final_state=False")
        if key is not None:
            entry = _remember(key)
    if entry is not None and not (
            _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                 (g is not None and g.requires_grad) or (h0 is not None and h0.requires_grad))):
        d = entry.direct
        if d is None:
            d = entry.direct = _ops.make_direct(
                b"linear_attn", _ops.linear_attn_options(_scale(q, scale), normalize, recurrent, config), _QKVG,
                (q, k, v, g, h0), output_final_state) or False
        if d:
            o, ht = d(q, (q, k, v, g, h0))
            return o, _state_out(ht, output_final_state, state_v_first)
    o, ht = _ops.call_linear_attn(q, k, v, g, h0, cu_seqlens, cu_seqlens_cpu, _scale(q, scale), output_final_state,
                                  normalize, recurrent, config)
    return o, _state_out(ht, output_final_state, state_v_first)


def _g_from_gamma(fn, q, g, g_gamma):
    """fla's g_gamma [H] (a per-head constant log-decay) as linac's g [B, T, H] (materialized, fp32)."""
    if g_gamma is None:
        return g
    if g is not None:
        _fail(fn, "pass g or g_gamma, not both")
    if g_gamma.shape != q.shape[2:3]:
        _fail(fn, f"g_gamma must be [H] = [{q.shape[2]}]; got {tuple(g_gamma.shape)}")
    return g_gamma.float().expand(q.shape[:3]).contiguous()


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """fla.ops.simple_gla.chunk_simple_gla: linear attention with a per-head scalar log-decay g [B, T, H]
    (or g_gamma [H]); no gate when both are None."""
    fn = "chunk_simple_gla"
    config = _config(fn, kwargs) if kwargs else ""
    g = _g_from_gamma(fn, q, g, g_gamma)
    return _linear_attn(fn, q, k, v, g, scale, initial_state, output_final_state, False, False, state_v_first,
                        cu_seqlens, cu_seqlens_cpu, config)


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, reverse=False, state_v_first=False, cu_seqlens=None,
                               **kwargs):
    """fla.ops.simple_gla.fused_recurrent_simple_gla: the token-by-token form of chunk_simple_gla."""
    fn = "fused_recurrent_simple_gla"
    cu_seqlens_cpu = kwargs.pop("cu_seqlens_cpu", None)
    config = _config(fn, kwargs) if kwargs else ""
    if _any_set(reverse):
        _unsupported(fn, reverse=reverse)
    g = _g_from_gamma(fn, q, g, g_gamma)
    return _linear_attn(fn, q, k, v, g, scale, initial_state, output_final_state, False, True, state_v_first,
                        cu_seqlens, cu_seqlens_cpu, config)


def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=True,
                      cu_seqlens=None, **kwargs):
    """fla.ops.linear_attn.chunk_linear_attn. normalize=True (fla's default) divides by
    scale * q . cumsum(k) + 1e-6 (fla adds 1e-10) and takes no states."""
    fn = "chunk_linear_attn"
    cu_seqlens_cpu = kwargs.pop("cu_seqlens_cpu", None)
    config = _config(fn, kwargs) if kwargs else ""
    return _linear_attn(fn, q, k, v, None, scale, initial_state, output_final_state, normalize, False, False,
                        cu_seqlens, cu_seqlens_cpu, config)


def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, reverse=False,
                                normalize=False, cu_seqlens=None, **kwargs):
    """fla.ops.linear_attn.fused_recurrent_linear_attn (normalize=True runs the chunked normalized form:
    linac has no token-by-token one; the function is the same)."""
    fn = "fused_recurrent_linear_attn"
    cu_seqlens_cpu = kwargs.pop("cu_seqlens_cpu", None)
    config = _config(fn, kwargs) if kwargs else ""
    if _any_set(reverse):
        _unsupported(fn, reverse=reverse)
    return _linear_attn(fn, q, k, v, None, scale, initial_state, output_final_state, normalize, True, False,
                        cu_seqlens, cu_seqlens_cpu, config)


# --- GLA ----------------------------------------------------------------------------------------------------

def _gla(fn, q, k, v, g, scale, initial_state, output_final_state, recurrent, state_v_first, cu_seqlens,
         cu_seqlens_cpu, config):
    h0 = _state_in(initial_state, state_v_first)
    output_final_state = bool(output_final_state)
    key = entry = None
    if (cu_seqlens is None and cu_seqlens_cpu is None and not _is_compiling() and type(q) in _PLAIN and
            type(scale) in _NUMBERS):
        try:
            key = (fn, config, scale, output_final_state, recurrent, state_v_first,
                   q.shape, q.dtype, q.device, q.is_contiguous(), k.shape, k.dtype, k.device, k.is_contiguous(),
                   v.shape, v.dtype, v.device, v.is_contiguous(), g.shape, g.dtype, g.device, g.is_contiguous(),
                   _t(h0))
            entry = _signatures.get(key)
        except (AttributeError, TypeError):  # not tensors: the checks say what is wrong
            key = None
    if entry is None:
        _check(fn, q, k, v, cu_seqlens, cu_seqlens_cpu, h0, (("g", g, q.shape),))
        if key is not None:
            entry = _remember(key)
    if entry is not None and not (
            _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or g.requires_grad or
                                 (h0 is not None and h0.requires_grad))):
        d = entry.direct
        if d is None:
            d = entry.direct = _ops.make_direct(b"gla", _ops.gla_options(_scale(q, scale), recurrent, config), _QKVG,
                                                (q, k, v, g, h0), output_final_state) or False
        if d:
            o, ht = d(q, (q, k, v, g, h0))
            return o, _state_out(ht, output_final_state, state_v_first)
    o, ht = _ops.call_gla(q, k, v, g, h0, cu_seqlens, cu_seqlens_cpu, _scale(q, scale), output_final_state,
                          recurrent, config)
    return o, _state_out(ht, output_final_state, state_v_first)


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
              cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """fla.ops.gla.chunk_gla: gated linear attention, log-decay g [B, T, H, K] per key channel."""
    fn = "chunk_gla"
    return _gla(fn, q, k, v, g, scale, initial_state, output_final_state, False, state_v_first, cu_seqlens,
                cu_seqlens_cpu, _config(fn, kwargs) if kwargs else "")


def fused_recurrent_gla(q, k, v, gk=None, gv=None, scale=None, initial_state=None, output_final_state=False,
                        reverse=False, state_v_first=False, cu_seqlens=None, **kwargs):
    """fla.ops.gla.fused_recurrent_gla: the token-by-token form (gk: log-decay [B, T, H, K]; gv, the
    value-side gate, is not implemented; without gk: plain linear attention)."""
    fn = "fused_recurrent_gla"
    cu_seqlens_cpu = kwargs.pop("cu_seqlens_cpu", None)
    config = _config(fn, kwargs) if kwargs else ""
    if _any_set(gv, reverse):
        _unsupported(fn, gv=gv, reverse=reverse)
    if gk is None:
        return _linear_attn(fn, q, k, v, None, scale, initial_state, output_final_state, False, True,
                            state_v_first, cu_seqlens, cu_seqlens_cpu, config)
    return _gla(fn, q, k, v, gk, scale, initial_state, output_final_state, True, state_v_first, cu_seqlens,
                cu_seqlens_cpu, config)


# --- DeltaNet and Gated DeltaNet ------------------------------------------------------------------------

def _delta(fn, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm_qk, recurrent, state_v_first,
           cu_seqlens, cu_seqlens_cpu, config):
    h0 = _state_in(initial_state, state_v_first)
    if beta is None:
        beta = q.new_ones(q.shape[:3])  # fla's fused_recurrent default
    output_final_state, l2norm_qk = bool(output_final_state), bool(l2norm_qk)
    key = entry = None
    if (cu_seqlens is None and cu_seqlens_cpu is None and not _is_compiling() and type(q) in _PLAIN and
            type(scale) in _NUMBERS):
        try:
            key = (fn, config, scale, output_final_state, l2norm_qk, recurrent, state_v_first,
                   q.shape, q.dtype, q.device, q.is_contiguous(), k.shape, k.dtype, k.device, k.is_contiguous(),
                   v.shape, v.dtype, v.device, v.is_contiguous(), beta.shape, beta.dtype, beta.device,
                   beta.is_contiguous(), _t(g), _t(h0))
            entry = _signatures.get(key)
        except (AttributeError, TypeError):  # not tensors: the checks say what is wrong
            key = None
    if entry is None:
        if beta.dim() == 4:
            raise UnsupportedError(f"{fn}: beta per value channel [B, T, H, V] is not implemented (linac takes "
                                   f"beta [B, T, H])")
        gates = (("beta", beta, _gate_shape(q)),) if g is None else (("g", g, _gate_shape(q)),
                                                                    ("beta", beta, _gate_shape(q)))
        _check(fn, q, k, v, cu_seqlens, cu_seqlens_cpu, h0, gates)
        if key is not None:
            entry = _remember(key)
    if entry is not None and not (
            _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or beta.requires_grad or
                                 (g is not None and g.requires_grad) or (h0 is not None and h0.requires_grad))):
        d = entry.direct
        if d is None:
            d = entry.direct = _ops.make_direct(
                b"delta_rule" if g is None else b"gated_delta_rule",
                _ops.delta_options(_scale(q, scale), l2norm_qk, recurrent, config), _QKVGB, (q, k, v, g, beta, h0),
                output_final_state) or False
        if d:
            o, ht = d(q, (q, k, v, g, beta, h0))
            return o, _state_out(ht, output_final_state, state_v_first)
    s = _scale(q, scale)
    # The forward saves the tables its backward takes (the training pair) when gradients will be needed
    # and the chunked form runs at its own chunk: not with l2norm_qk (normalized q, k are not kept), the
    # token-by-token form, a chunk_size of the caller's, or varlen (the tables' length would depend on
    # cu_seqlens' values, which a traced graph cannot know).
    save = (torch.is_grad_enabled() and not l2norm_qk and not recurrent and not config and cu_seqlens is None and
            any(t is not None and t.requires_grad for t in (q, k, v, g, beta, h0)))
    if g is None:
        o, ht = _ops.call_delta_rule(q, k, v, beta, h0, cu_seqlens, cu_seqlens_cpu, s, output_final_state,
                                     l2norm_qk, recurrent, config, save)[:2]
    else:
        o, ht = _ops.call_gated_delta_rule(q, k, v, g, beta, h0, cu_seqlens, cu_seqlens_cpu, s, output_final_state,
                                           l2norm_qk, recurrent, config, save)[:2]
    return o, _state_out(ht, output_final_state, state_v_first)


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """fla.ops.delta_rule.chunk_delta_rule: DeltaNet, beta [B, T, H]; keys L2-normalized (or pass
    use_qk_l2norm_in_kernel=True). fp32 inputs are accepted (fla refuses them)."""
    fn = "chunk_delta_rule"
    return _delta(fn, q, k, v, None, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                  False, False, cu_seqlens, cu_seqlens_cpu, _config(fn, kwargs) if kwargs else "")


def fused_recurrent_delta_rule(q, k, v, beta=None, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """fla.ops.delta_rule.fused_recurrent_delta_rule: the token-by-token form (beta defaults to ones)."""
    fn = "fused_recurrent_delta_rule"
    cu_seqlens_cpu = kwargs.pop("cu_seqlens_cpu", None)
    return _delta(fn, q, k, v, None, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                  True, False, cu_seqlens, cu_seqlens_cpu, _config(fn, kwargs) if kwargs else "")


_GDN_UNSUPPORTED = ("use_gate_in_kernel", "A_log", "dt_bias")


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """fla.ops.gated_delta_rule.chunk_gated_delta_rule: Gated DeltaNet, g [B, T, H] log-decay, beta
    [B, T, H]. chunk_indices (fla's precomputed chunk table) is not needed and not read."""
    fn = "chunk_gated_delta_rule"
    config = _config(fn, kwargs, allowed=_GDN_UNSUPPORTED) if kwargs else ""
    if _any_set(use_beta_sigmoid_in_kernel, allow_neg_eigval, cp_context):
        _unsupported(fn, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                     cp_context=cp_context)
    return _delta(fn, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, False,
                  state_v_first, cu_seqlens, cu_seqlens_cpu, config)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False,
                                     use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, **kwargs):
    """fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule: the token-by-token form (g [B, T, H];
    without g: DeltaNet; gk, gv and the in-kernel gate/beta activations are not implemented)."""
    fn = "fused_recurrent_gated_delta_rule"
    cu_seqlens_cpu = kwargs.pop("cu_seqlens_cpu", None)
    config = _config(fn, kwargs) if kwargs else ""
    if _any_set(gk, gv, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval):
        _unsupported(fn, gk=gk, gv=gv, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval)
    return _delta(fn, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, True,
                  state_v_first, cu_seqlens, cu_seqlens_cpu, config)


# --- poly (linac's own) --------------------------------------------------------------------------------

def _coefficients(fn, a, b, c):
    """None when a, b, c are Python numbers; else [3] float64 (a, b, c) on the device of the tensors given,
    differentiable: its gradient reaches each tensor in that tensor's shape and dtype."""
    tensors = [x for x in (a, b, c) if isinstance(x, torch.Tensor)]
    if not tensors:
        return None
    device = tensors[0].device
    parts = []
    for name, x in zip("abc", (a, b, c)):
        if isinstance(x, torch.Tensor):
            if not x.is_floating_point() or x.numel() != 1:
                _fail(fn, f"{name} must be a Python number or a float tensor of one element; got {x.dtype} of "
                          f"shape {tuple(x.shape)}")
            parts.append(x.reshape(()).to(device=device, dtype=torch.float64))
        else:
            parts.append(torch.full((), float(x), dtype=torch.float64, device=device))
    return torch.stack(parts)


def poly(q, k, v, a=1.0, b=1.0, c=0.5, scale=None, normalize=True, cu_seqlens=None, cu_seqlens_cpu=None,
         chunk_size=None):
    """Polynomial-kernel attention (docs/ops/poly.md): o_t = sum_{s<=t} f(x_ts) v_s / (sum_s f(x_ts) + 1e-6)
    with x_ts = scale q_t . k_s and f(x) = a + b x + c x^2 (no denominator when normalize=False).
    Returns o [B, T, H, V] (the op keeps no state).

    a, b, c: Python numbers, or float tensors of one element (learned coefficients: gradients flow to
    those that require grad). A tensor's value is read on the host at every forward (a device-to-host
    copy and a wait for the stream when it is on the GPU), and each new value prepares a new call; with
    normalize=True, f must stay positive (c > 0 and b^2 < 4ac, or b = c = 0 < a), else InvalidCallError."""
    fn = "poly"
    key = entry = None
    if (cu_seqlens is None and cu_seqlens_cpu is None and not _is_compiling() and type(q) in _PLAIN and
            type(scale) in _NUMBERS and type(a) in _NUMBERS and type(b) in _NUMBERS and type(c) in _NUMBERS and
            type(chunk_size) in _NUMBERS and type(normalize) is bool):
        try:
            key = (fn, scale, a, b, c, normalize, chunk_size,
                   q.shape, q.dtype, q.device, q.is_contiguous(), k.shape, k.dtype, k.device, k.is_contiguous(),
                   v.shape, v.dtype, v.device, v.is_contiguous())
            entry = _signatures.get(key)
        except (AttributeError, TypeError):  # not tensors: the checks say what is wrong
            key = None
    coefficients = None
    if entry is None:
        _check(fn, q, k, v, cu_seqlens, cu_seqlens_cpu)
        coefficients = _coefficients(fn, a, b, c)
    elif entry.direct and not (_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return entry.direct(q, (q, k, v))[0]  # before the options below: a Direct has its own
    config = "" if chunk_size is None else f"chunk_size={int(chunk_size)}"
    scale, normalize = _scale(q, scale), bool(normalize)
    # With learned coefficients the op reads the values from `coefficients`; these floats are unused.
    a, b, c = (float(a), float(b), float(c)) if coefficients is None else (0.0, 0.0, 0.0)
    grad = _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                (coefficients is not None and coefficients.requires_grad))
    if entry is None and key is not None:
        entry = _remember(key)
    if entry is not None and entry.direct is None and not grad:
        d = entry.direct = _ops.make_direct(b"poly", _ops.poly_options(scale, a, b, c, normalize, config),
                                            ("q", "k", "v"), (q, k, v), False) or False
        if d:
            return d(q, (q, k, v))[0]
    # When gradients will be needed the forward saves what its backward takes (the training pair,
    # docs/python.md), varlen too: under torch.compile the tables' length, which depends on the offsets'
    # values, is then an unbacked size in the graph.
    return _ops.call_poly(q, k, v, cu_seqlens, cu_seqlens_cpu, coefficients, scale, a, b, c, normalize, config,
                          grad)[0]
