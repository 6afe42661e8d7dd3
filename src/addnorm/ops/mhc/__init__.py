"""mHC's pre step as one operator (``mhc_pre``: the stream's RMS, the coefficients and the sub-layer input in one
pass), and the write of the stream before it in the same pass (``mhc_write_pre``, ``write``): schema, autograd and
torch formulas as for ``ops.norm``."""

from . import autograd, formulas, schema, write  # noqa: F401  (schema and write define the operators)
