"""As fla.ops.simple_gla."""

from .._api import chunk_simple_gla, fused_recurrent_simple_gla

__all__ = ["chunk_simple_gla", "fused_recurrent_simple_gla"]
