"""Whether the Triton kernels can run here, and how: compiled for a GPU, or interpreted on the CPU."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str  # why not, or which Triton
    interpreted: bool  # TRITON_INTERPRET was set when the kernels were defined: they run on CPU tensors


_CACHE: list[Availability] = []


def availability() -> Availability:
    """Imports Triton and the kernels once; later calls read the answer."""
    if not _CACHE:
        _CACHE.append(_probe())
    return _CACHE[0]


def _probe() -> Availability:
    try:
        import triton
        from triton.runtime.interpreter import InterpretedFunction

        from .jit import norm as kernels
    except Exception as e:  # noqa: BLE001  (not installed, or an install that cannot load: say which)
        return Availability(False, f"Triton cannot be imported ({type(e).__name__}: {e}); "
                                   "pip install 'addnorm[gpu]'", False)
    interpreted = isinstance(kernels.add_norm_fwd, InterpretedFunction)
    return Availability(True, f"triton {triton.__version__}" + (" (interpreter)" if interpreted else ""),
                        interpreted)
