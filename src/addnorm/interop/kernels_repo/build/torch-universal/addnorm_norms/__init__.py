"""addnorm's norms as a `kernels` hub kernel: ``kernels`` imports this package and reads ``layers``."""

from . import layers

__all__ = ["layers"]
