"""The widened residual stream's read and write as operators (``stream_read``, ``stream_write``): schema,
autograd and torch formulas as for ``ops.norm``."""

from . import autograd, formulas, schema  # noqa: F401  (schema defines the operators; autograd registers on them)
