"""The fused CPU kernels: a small C library (plain C ABI) with fast-call Python entry points."""

from .library import availability
from .norm import SUPPORTED_DTYPES

__all__ = ["availability", "SUPPORTED_DTYPES"]
