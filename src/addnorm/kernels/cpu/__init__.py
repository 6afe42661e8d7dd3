"""The fused CPU kernels: a small C library (plain C ABI) driven through ctypes."""

from .library import availability
from .ops import SUPPORTED_DTYPES, FusedAddNorm

__all__ = ["availability", "FusedAddNorm", "SUPPORTED_DTYPES"]
