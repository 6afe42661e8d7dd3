"""Open the compiled C kernel library with ctypes and describe whether it is usable.

The library is built by the package's build (``setup.py``) as ``_addnorm_cpu*.so``; it has a plain
C ABI, so it does not depend on torch's C++ ABI and costs no compile at import.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

_i64, _i32, _f32, _p = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p

DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
KIND_CODES = {"layer": 0, "rms": 1}
ISA_NAMES = {0: "baseline", 1: "avx2+fma+f16c", 2: "avx512"}


@dataclass(frozen=True)
class KernelLibrary:
    forward: object  # ctypes function addnorm_forward
    backward: object  # ctypes function addnorm_backward
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


def _open() -> KernelLibrary | str:
    try:
        from addnorm.kernels.cpu import _addnorm_cpu  # the built extension; opened below as a C library
    except ImportError as e:  # not built (e.g. a source checkout without `pip install`)
        return f"the compiled kernel library is missing ({e}); reinstall addnorm with `pip install -e .`"
    path = _addnorm_cpu.__file__
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        return f"could not open {path}: {e}"
    fwd = lib.addnorm_forward
    fwd.restype = _i32
    fwd.argtypes = [_i32, _i32, _i64, _i64, _p, _i64, _p, _i64, _p, _p, _f32, _f32, _i32,
                    _p, _i64, _p, _i64, _p, _p, _i32]
    bwd = lib.addnorm_backward
    bwd.restype = _i32
    bwd.argtypes = [_i32, _i32, _i64, _i64, _p, _i64, _p, _i64, _p, _p, _p, _f32,
                    _p, _i64, _p, _i64, _p, _p, _i32]
    lib.addnorm_isa.restype = _i32
    return KernelLibrary(fwd, bwd, path, ISA_NAMES.get(lib.addnorm_isa(), "unknown"))


def library() -> KernelLibrary:
    lib = _load()
    if isinstance(lib, str):
        raise RuntimeError(f"addnorm's CPU kernels are unavailable: {lib}")
    return lib


@functools.lru_cache(maxsize=1)
def availability() -> Availability:
    lib = _load()
    if isinstance(lib, str):
        return Availability(False, lib, None)
    return Availability(True, f"loaded from {lib.path}", lib.isa)
