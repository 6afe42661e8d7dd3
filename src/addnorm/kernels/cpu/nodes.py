"""The eager fast path's autograd nodes in C++ (``autograd_nodes.cpp``): build, load, say why not.

A Python ``torch.autograd.Function`` costs more per training step than the whole of eager PyTorch's C++
nodes at small sizes (64 x 768: a decode step), so the eager fast path's three nodes -- Add & Norm,
norm-then-add, the parallel residual -- also exist in C++, calling the same C kernels. Unlike the kernels
(plain C, no torch headers), these are built against torch's C++ ABI, so they are built on the machine
that runs them, for the torch installed there:

    python -m addnorm.kernels.cpu.build_nodes     # make setup runs this; ~30 s

Where they are not built, or were built for another torch, the Python nodes run instead (the same kernels,
the same results) and ``status()`` says why.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from .library import availability, library

NAME = "_addnorm_nodes"
SOURCE = Path(__file__).with_name("autograd_nodes.cpp")
TARGET = Path(__file__).with_name(NAME + ".so")

ABI = 12  # autograd_nodes.cpp's `abi`: raised with every change to the functions this file and its callers use
_MODULE = None  # the loaded module, or the reason it is not
_FALLBACK = None


def _torch_release() -> str:
    return torch.__version__.split("+")[0]


def load(fallback, max_numel: int, pool_empty=None, pool_min_bytes: int = 0):
    """The initialised module, or a string saying why there is none. ``fallback(op, saved, grads, needs, meta)``
    is the Python nodes' backward, which the C++ nodes hand every case but the plain one; the norm forms' fast entries
    take calls of fewer than ``max_numel`` elements; the widened stream's take every size, their outputs of
    ``pool_min_bytes`` or more from ``pool_empty(shape, dtype code)`` (the output pool; None: torch's)."""
    global _MODULE, _FALLBACK
    _FALLBACK = fallback
    if os.environ.get("ADDNORM_CPP_NODES", "1") == "0":
        _MODULE = "turned off by ADDNORM_CPP_NODES=0"
        return _MODULE
    if not availability().available:
        _MODULE = "the CPU kernels are unavailable"
        return _MODULE
    if not TARGET.exists():
        _MODULE = f"not built ({TARGET.name} is missing): run `python -m addnorm.kernels.cpu.build_nodes`"
        return _MODULE
    try:
        from . import _addnorm_nodes as mod
    except ImportError as e:
        _MODULE = f"{TARGET.name} does not load ({e}); rebuild it with `python -m addnorm.kernels.cpu.build_nodes`"
        return _MODULE
    if getattr(mod, "abi", None) != ABI:
        _MODULE = (f"{TARGET.name} is from another version of addnorm (interface {getattr(mod, 'abi', None)}, this "
                   f"one needs {ABI}): rebuild it with `python -m addnorm.kernels.cpu.build_nodes`")
        return _MODULE
    if mod.torch_version != _torch_release():
        _MODULE = (f"{TARGET.name} was built for torch {mod.torch_version}, this is {_torch_release()}: rebuild it "
                   "with `python -m addnorm.kernels.cpu.build_nodes`")
        return _MODULE
    so = ctypes.CDLL(library().path)  # the already-loaded kernel library: its C entry points
    addr = [ctypes.cast(getattr(so, f), ctypes.c_void_p).value for f in (
        "addnorm_forward", "addnorm_backward", "addnorm_fused_forward", "addnorm_fused_backward",
        "addnorm_pointwise_forward", "addnorm_pointwise_backward", "addnorm_mhc",
        "addnorm_hyper", "addnorm_stream")]
    try:
        mod.init(*addr, fallback, int(max_numel), pool_empty, int(pool_min_bytes))
    except Exception as e:  # a build that does not fit this code must never break `import addnorm`
        _MODULE = f"{TARGET.name} does not initialise ({type(e).__name__}: {e}); rebuild it"
        return _MODULE
    _MODULE = mod
    return mod


def status() -> str:
    """"loaded (file name)", or why the C++ nodes were not loaded."""
    if _MODULE is None:
        return "not loaded yet"
    return _MODULE if isinstance(_MODULE, str) else f"loaded ({TARGET.name})"
