"""Load the compiled kernel library and describe whether it is usable.

The library is built by the package's build (``setup.py``) as the extension ``_addnorm_cpu``. Its
kernels have a plain C ABI (``addnorm_forward`` / ``addnorm_backward``: no torch headers, no torch
C++ ABI, no compile at import); Python calls them through the module's two fast-call wrappers,
which cost far less per call than ctypes' argument marshalling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
KIND_CODES = {"layer": 0, "rms": 1}
ISA_NAMES = {0: "baseline", 1: "avx2+fma+f16c", 2: "avx512", 3: "avx512+bf16"}


@dataclass(frozen=True)
class KernelLibrary:
    forward: object  # the extension's forward(...) -> addnorm_forward
    backward: object  # the extension's backward(...) -> addnorm_backward
    fused_forward: object  # addnorm_fused_forward: norm-then-add and the parallel residual
    fused_backward: object  # addnorm_fused_backward
    stream: object  # addnorm_stream: the widened stream's read and write, forward and backward
    mhc: object  # addnorm_mhc: mHC's pre step (coefficients and the sub-layer input), forward and backward
    pointwise_forward: object  # addnorm_pointwise_forward: DyT / Derf fused with the add
    pointwise_backward: object
    attn_res: object  # addnorm_attn_res: Attention Residuals' depth mix, forward and backward
    hyper: object  # addnorm_hyper: Qwen4-exp's gated read (stream norm, sigmoid-gated collapse) and the write before it
    path: str
    isa: str


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str  # why not, or where it was loaded from
    isa: str | None


_LIB = None


def _load() -> KernelLibrary | str:
    global _LIB
    if _LIB is None:
        _LIB = _open()
    return _LIB


# the environment switches the library reads once, when it loads (docs/performance.md, "How to measure"): each
# value it accepts; a value outside them would be ignored there, so it is refused here, by name
SWITCHES = {
    "ADDNORM_CPU_ISA": ("native", "avx512", "avx2", "baseline"),  # caps the instruction set (native: no cap)
    "ADDNORM_CPU_PREFETCH": ("0", "1"),  # the row loops' own prefetch off / on (default: off on AMD's CPUs)
    "ADDNORM_CPU_NT_BYTES": None,  # outputs of at least this many bytes are streamed: a non-negative integer
}


def check_switches(env=None) -> None:
    """Raise ValueError naming the switch whose value the library would not understand."""
    env = os.environ if env is None else env
    for name, allowed in SWITCHES.items():
        value = env.get(name)
        if value is None:
            continue
        ok = value in allowed if allowed is not None else value.isascii() and value.isdigit()
        if not ok:
            want = ("one of " + ", ".join(repr(a) for a in allowed) if allowed is not None
                    else "a non-negative integer (bytes)")
            raise ValueError(f"{name} must be {want}, got {value!r}")


def _open() -> KernelLibrary | str:
    check_switches()
    try:
        from addnorm.kernels.cpu import _addnorm_cpu  # the built extension
    except ImportError as e:  # not built (e.g. a source checkout without `pip install`, or no C compiler)
        return f"the compiled kernel library is missing ({e}); reinstall addnorm with `pip install -e .`"
    return KernelLibrary(_addnorm_cpu.forward, _addnorm_cpu.backward, _addnorm_cpu.fused_forward,
                         _addnorm_cpu.fused_backward, _addnorm_cpu.stream, _addnorm_cpu.mhc,
                         _addnorm_cpu.pointwise_forward, _addnorm_cpu.pointwise_backward, _addnorm_cpu.attn_res,
                         _addnorm_cpu.hyper,
                         _addnorm_cpu.__file__,
                         ISA_NAMES.get(_addnorm_cpu.isa(), "unknown"))


def prefetch() -> bool | None:
    """Whether the row loops ask for the rows ahead themselves (off on AMD's CPUs, ``ADDNORM_CPU_PREFETCH``
    overrides); None where the library is not built."""
    lib = _load()
    if isinstance(lib, str):
        return None
    from addnorm.kernels.cpu import _addnorm_cpu

    return _addnorm_cpu.prefetch()


def library() -> KernelLibrary:
    lib = _load()
    if isinstance(lib, str):
        raise RuntimeError(f"addnorm's CPU kernels are unavailable: {lib}")
    return lib


_AVAILABILITY: Availability | None = None


def availability() -> Availability:
    """Whether the kernels can run (computed once; a plain global read afterwards, which torch.compile
    traces without a graph break)."""
    global _AVAILABILITY
    if _AVAILABILITY is None:
        lib = _load()
        _AVAILABILITY = (Availability(False, lib, None) if isinstance(lib, str)
                         else Availability(True, f"loaded from {lib.path}", lib.isa))
    return _AVAILABILITY


def _clear_availability() -> None:
    global _AVAILABILITY
    _AVAILABILITY = None


availability.cache_clear = _clear_availability  # tests swap the library out and back
