"""Triton kernels for fused Add & Norm: the CUDA implementation of addnorm's operators.

Optional (``pip install addnorm[gpu]``): without Triton, addnorm runs as before and CUDA tensors take
the torch-op formulas. With ``TRITON_INTERPRET=1`` set before the kernels are first used, Triton
interprets them on the CPU (slowly) -- how they are tested without a GPU, via ``backend="triton"``.
"""

from .availability import Availability, availability

__all__ = ["Availability", "availability"]
