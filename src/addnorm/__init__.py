"""addnorm: residual connections and normalization layers for transformers -- exact, fast, measured."""

from . import functional, nn
from .functional import (
    add_layer_norm,
    add_rms_norm,
    last_backend,
    layer_norm,
    rms_norm,
    tutorial_layer_norm,
    use_backend,
)
from .kernels.cpu import availability as cpu_kernel_availability
from .kernels.cpu.output_pool import POOL as output_pool  # large outputs from recycled memory: .set_limit, .release

__version__ = "0.1.0"

__all__ = [
    "functional",
    "nn",
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "tutorial_layer_norm",
    "use_backend",
    "last_backend",
    "cpu_kernel_availability",
    "output_pool",
]
