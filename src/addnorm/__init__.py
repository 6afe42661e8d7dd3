"""addnorm: residual connections and normalization layers for transformers -- exact, fast, measured."""

from . import _moved, functional, nn
from .functional import (
    add_derf,
    add_dyt,
    add_layer_norm,
    add_rms_norm,
    last_backend,
    layer_norm,
    layer_norm_add,
    mhc_pre,
    parallel_add_layer_norm,
    parallel_add_rms_norm,
    rms_norm,
    rms_norm_add,
    stream_read,
    stream_write,
    tutorial_layer_norm,
    use_backend,
)
from .kernels.cpu import availability as cpu_kernel_availability
from .kernels.cpu.output_pool import POOL as output_pool  # large outputs from recycled memory: .set_limit, .release

__version__ = "0.1.0"

_moved.install()  # old module paths keep importing (addnorm/_moved.py)

__all__ = [
    "functional",
    "nn",
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "tutorial_layer_norm",
    "layer_norm_add",
    "rms_norm_add",
    "parallel_add_layer_norm",
    "parallel_add_rms_norm",
    "add_dyt",
    "add_derf",
    "stream_read",
    "stream_write",
    "mhc_pre",
    "use_backend",
    "last_backend",
    "cpu_kernel_availability",
    "output_pool",
]
