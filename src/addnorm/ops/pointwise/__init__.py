"""DyT and Derf fused with the residual add as operators (``add_pointwise_norm``): schema, autograd and torch
formulas as for ``ops.norm``."""

from . import autograd, formulas, schema  # noqa: F401  (schema defines the operators; autograd registers on them)
