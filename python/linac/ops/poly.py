"""As fla.ops.poly."""

from .._api import poly

__all__ = ["poly"]
