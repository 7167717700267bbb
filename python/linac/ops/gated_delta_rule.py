"""As fla.ops.gated_delta_rule."""

from .._api import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]
