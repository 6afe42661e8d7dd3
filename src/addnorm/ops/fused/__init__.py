"""The fused forms beyond Add & Norm as operators: norm-then-add (``norm_add``) and the parallel block's
two norms of one sum (``parallel_add_norm``); schema, autograd and torch formulas as for ``ops.norm``."""

from . import autograd, formulas, schema  # noqa: F401  (schema defines the operators; autograd registers on them)
