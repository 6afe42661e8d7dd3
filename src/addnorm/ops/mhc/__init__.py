"""mHC's pre step as one operator (``mhc_pre``: the stream's RMS, the coefficients and the sub-layer input in one
pass): schema, autograd and torch formulas as for ``ops.norm``."""

from . import autograd, formulas, schema  # noqa: F401  (schema defines the operators; autograd registers on them)
