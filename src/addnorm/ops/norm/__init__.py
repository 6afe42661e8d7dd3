"""Add & Norm's operators (``torch.ops.addnorm.add_norm`` and its backward): ``schema`` defines them with their
device and fake implementations, ``autograd`` their backward, double backward and jvp, ``formulas`` the math in
torch ops that the last two and the non-CPU devices use. Every other family's operators register on this
family's library (``schema.LIB``)."""

from . import autograd, formulas, schema  # noqa: F401  (schema defines the operators; autograd registers on them)
