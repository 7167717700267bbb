"""fla-like modules: `from linac.ops.gla import chunk_gla` where a model had `from fla.ops.gla import ...`."""

from .._api import (chunk_delta_rule, chunk_gated_delta_rule, chunk_gla, chunk_linear_attn, chunk_simple_gla,
                    fused_recurrent_delta_rule, fused_recurrent_gated_delta_rule, fused_recurrent_gla,
                    fused_recurrent_linear_attn, fused_recurrent_simple_gla, poly)
