"""As fla.ops.gla."""

from .._api import chunk_gla, fused_recurrent_gla

__all__ = ["chunk_gla", "fused_recurrent_gla"]
