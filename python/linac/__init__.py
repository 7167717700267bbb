"""linac's linear-attention kernels as PyTorch ops, with fla's names and signatures.

    from linac.ops.gla import chunk_gla          # instead of: from fla.ops.gla import chunk_gla
    o, final_state = chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True)

CUDA tensors run on torch's current stream, with scratch memory from torch's caching allocator; CPU
tensors run on linac's CPU interpreter (slow: for tests). Gradients come from linac's backward kernels.
The ops are also registered as torch.ops.linac.* custom ops (fake implementations, autograd), so
torch.compile(model, fullgraph=True) traces through them. See docs/python.md.
"""

from ._api import (chunk_delta_rule, chunk_gated_delta_rule, chunk_gla, chunk_linear_attn, chunk_simple_gla,
                   fused_recurrent_delta_rule, fused_recurrent_gated_delta_rule, fused_recurrent_gla,
                   fused_recurrent_linear_attn, fused_recurrent_simple_gla, poly)
from ._errors import (InternalError, InvalidCallError, LibraryNotFoundError, LinacError, NoGpuError,
                      UnsupportedError)
from ._lib import describe, gpu_available, library_path, output_shape, version
from ._load import load
from . import ops

__version__ = "0.1.0"

__all__ = [
    "chunk_simple_gla", "fused_recurrent_simple_gla", "chunk_linear_attn", "fused_recurrent_linear_attn",
    "chunk_gla", "fused_recurrent_gla", "chunk_delta_rule", "fused_recurrent_delta_rule",
    "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "poly",
    "LinacError", "InvalidCallError", "UnsupportedError", "NoGpuError", "InternalError", "LibraryNotFoundError",
    "describe", "gpu_available", "library_path", "output_shape", "version", "ops", "load",
]
