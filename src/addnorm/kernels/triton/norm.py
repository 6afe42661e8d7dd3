"""Host side of Add & Norm's Triton kernels (``jit.norm``): the operators' implementation on them, and the launch
configuration every family's host code shares (``config``, ``warps``, ``on_device``, ``program_count``,
``sum_partials``, ``OPTIONS``; the parameters ``LAUNCH_PARAMS`` names).

    add_norm(x, residual, weight, bias, kind, D, eps, ...)       -> (y, s or None, stats or None)
    add_norm_backward(dy, dres, s, stats, weight, bias, kind, D, ...) -> (ds, dx or None, dweight, dbias)

As ``kernels.cpu.norm``: tensors are read as (rows, D) with unit stride on D (``as_rows``: strided rows
are read in place, a layout without unit stride on D is copied first); statistics are float32, (2, N)
= (mean, rstd) for LayerNorm, (1, N) = (rstd,) for RMSNorm; every tensor has its own dtype (a float32
stream beside 16-bit x, an out dtype of its own).
"""

from __future__ import annotations

import contextlib
import os

import torch

from ..rows import as_rows, resolved
from .availability import availability

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_BLOCK = 16384  # elements of a row held at once; longer rows are walked in chunks of this many
_INTERPRETER_TILE = 16384  # the interpreter's cost is per operation, not per element: big tiles
# Launch parameters on a GPU, read at each launch (module attributes: benchmarks/tune_gpu.py sweeps them and
# docs/performance.md gives what it measured for each)
_GPU_TILE = 4096  # elements per program tile: short rows are taken several at a time
_ELEMS_PER_WARP = 256  # a tile of E elements runs on E / this many warps (at least 1, at most 16)
# Add & Norm's backward: fewer warps (more registers per thread) and fewer programs than the forward's rule. On
# an H200 the sweep put (1024, 2) at 0.88 of (256, 4)'s time (geometric mean of 12 cells), 0.45 at bf16
# LayerNorm 32768 x 2048 (docs/performance.md, "Launch parameters on a GPU")
_BACKWARD_ELEMS_PER_WARP = 1024
_BACKWARD_ROWS = 16  # at most this many rows per backward tile: a tile's column sums are plain float32 sums
# elements per backward tile (its rows: this over the row's width, at most _BACKWARD_ROWS). The forward's 4096
# until measured otherwise: at D = 4096 a backward program then takes one row at a time, which in bf16 keeps
# half the bytes in flight that float32 does (the H200's bf16 backward ran at 0.2-0.5 of the copy floor); the
# "bwd_tile" sweep of benchmarks/tune_gpu.py measures larger ones
_BACKWARD_TILE = 4096
_PROGRAMS_PER_SM = 2  # backward programs (each one row of weight-gradient partials) per multiprocessor
_REDUCE_BLOCK = 256  # columns of the partials per reduction program
_REDUCE_ROWS = 1  # partial rows the reduction loads at a time
LAUNCH_PARAMS = {"tile": "_GPU_TILE", "elems_per_warp": "_ELEMS_PER_WARP",
                 "backward_elems_per_warp": "_BACKWARD_ELEMS_PER_WARP", "backward_rows": "_BACKWARD_ROWS",
                 "backward_tile": "_BACKWARD_TILE",
                 "programs_per_sm": "_PROGRAMS_PER_SM", "reduce_block": "_REDUCE_BLOCK", "reduce_rows": "_REDUCE_ROWS"}


_LAUNCH_MAX = {"tile": 1 << 16, "elems_per_warp": 1 << 16, "backward_elems_per_warp": 1 << 16, "backward_tile": 1 << 16,
               "backward_rows": 1 << 10, "programs_per_sm": 64, "reduce_block": 1 << 12, "reduce_rows": 1 << 10}


def _checked(name: str, value) -> int:
    if name not in LAUNCH_PARAMS:
        raise ValueError(f"ADDNORM_TRITON_LAUNCH: unknown parameter {name!r}; valid: {', '.join(LAUNCH_PARAMS)}")
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"ADDNORM_TRITON_LAUNCH: {name} must be an integer, got {value!r}") from None
    if v < 1 or v & (v - 1) or v > _LAUNCH_MAX[name]:
        raise ValueError(f"ADDNORM_TRITON_LAUNCH: {name} must be a power of two from 1 to {_LAUNCH_MAX[name]}, "
                         f"got {v}")
    return v


def parse_launch(text: str) -> dict[str, int]:
    """``name=value,...`` of LAUNCH_PARAMS' names (ADDNORM_TRITON_LAUNCH's format) -> {name: value}: powers of two
    (the kernels' tiles are) up to a bound each, refused by name otherwise."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition("=")
        out[name] = _checked(name, value)
    return out


def set_launch(**params: int) -> dict[str, int]:
    """Set launch parameters (LAUNCH_PARAMS' names), all checked before any is set; returns the previous values,
    for restoring them."""
    new = {name: _checked(name, v) for name, v in params.items()}
    g = globals()
    old = {name: g[LAUNCH_PARAMS[name]] for name in new}
    for name, v in new.items():
        g[LAUNCH_PARAMS[name]] = v
    return old


def launch() -> dict[str, int]:
    """The launch parameters in force."""
    return {name: globals()[attr] for name, attr in LAUNCH_PARAMS.items()}


if os.environ.get("ADDNORM_TRITON_LAUNCH"):  # a user's tuning for their GPU (benchmarks/tune_gpu.py finds one)
    set_launch(**parse_launch(os.environ["ADDNORM_TRITON_LAUNCH"]))
# FMA contraction on, said explicitly (Triton 3.9 warns when it is left to its default): y = xhat * w + b
# rounds once
OPTIONS = {"enable_fp_fusion": True}
_INTERPRETER_PROGRAMS = 4  # backward programs under the interpreter (a fixed number: results depend on it)


def applies(x: torch.Tensor, residual, out_dtype, D: int) -> bool:
    """Whether the kernels take this call: their dtypes, a non-empty row, and a device they run on
    (CUDA, or any tensor under the interpreter)."""
    if not (x.dtype in SUPPORTED_DTYPES and (residual is None or residual.dtype in SUPPORTED_DTYPES)
            and (out_dtype is None or out_dtype in SUPPORTED_DTYPES) and D > 0):
        return False
    av = availability()
    return av.available and (x.is_cuda or av.interpreted)


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def tile() -> int:
    """Elements per program tile."""
    return _INTERPRETER_TILE if availability().interpreted else _GPU_TILE


def warps(elements: int, most: int = 16, per_warp: int | None = None) -> int:
    """num_warps for a tile of this many elements (``per_warp`` elements a warp; default the forward's rule)."""
    return min(max(elements // (per_warp or _ELEMS_PER_WARP), 1), most)


def backward_rows() -> int:
    return _BACKWARD_ROWS


def backward_tile() -> int:
    """Elements per backward program tile (the interpreter's tile under the interpreter, as the forward's)."""
    return _INTERPRETER_TILE if availability().interpreted else _BACKWARD_TILE


def config(N: int, D: int, max_rows: int | None = None, per_warp: int | None = None,
           tile_elems: int | None = None) -> tuple[int, int, int, int]:
    """(ROWS, BLOCK, CHUNKS, num_warps) for N rows of D elements: a tile is ROWS rows x BLOCK columns, of at most
    ``tile_elems`` elements (default the forward's ``tile()``) unless one row is longer."""
    block = min(next_pow2(D), MAX_BLOCK)
    t = tile_elems or tile()
    rows = min(max(t // block, 1), next_pow2(max(N, 1)), max_rows or t)
    return rows, block, -(-D // block), warps(rows * block, per_warp=per_warp)


def on_device(t: torch.Tensor):
    """Triton launches on the current CUDA device: make it t's."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _param(p: torch.Tensor | None, D: int) -> torch.Tensor | None:
    return None if p is None else p.detach().reshape(D).contiguous()


def _rows(t: torch.Tensor | None, D: int) -> torch.Tensor | None:
    return None if t is None else as_rows(t, D)


def _kernels():
    from .jit import norm as kernels

    return kernels


def tl_dtype(dt: torch.dtype):
    import triton.language as tl

    return {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dt]


def forward(kind, x, r, weight, bias, eps, weight_offset, cast_before_weight, out, res_out, stats, N, D):
    """One launch over N rows; x, r, out, res_out are (N, D) row views (r, res_out, stats may be None)."""
    x, r, weight, bias = resolved(x, r, weight, bias)
    k = _kernels()
    w, b = _param(weight, D), _param(bias, D)
    rows, block, chunks, nw = config(N, D)
    layer = kind == "layer"
    rstd = stats[-1] if stats is not None else x
    mean = stats[0] if stats is not None and layer else rstd
    with on_device(x):
        k.add_norm_fwd[(-(-N // rows),)](
            x, x if r is None else r, x if w is None else w, x if b is None else b, out,
            out if res_out is None else res_out, mean, rstd,
            x.stride(0), 0 if r is None else r.stride(0), out.stride(0), 0 if res_out is None else res_out.stride(0),
            N, D, float(eps), float(weight_offset),
            IS_LAYER=layer, HAS_R=r is not None, HAS_W=w is not None, HAS_B=b is not None,
            STORE_S=res_out is not None, STORE_STATS=stats is not None, CAST_BEFORE_W=bool(cast_before_weight),
            SDT=tl_dtype((x if res_out is None else res_out).dtype), ROWS=rows, BLOCK=block, CHUNKS=chunks,
            RNE=availability().interpreted, num_warps=nw, **OPTIONS)


def program_count(tiles: int, t: torch.Tensor) -> int:
    if t.is_cuda and not availability().interpreted:
        return min(tiles, _PROGRAMS_PER_SM * torch.cuda.get_device_properties(t.device).multi_processor_count)
    return min(tiles, _INTERPRETER_PROGRAMS)


def sum_partials(partials: torch.Tensor, D: int) -> torch.Tensor:
    """(programs, D) float32 partials -> (D,) float64, summed in a fixed order (see ``reduce_partials``)."""
    out = torch.empty(D, dtype=torch.float64, device=partials.device)
    with on_device(partials):
        _kernels().reduce_partials[(-(-D // _REDUCE_BLOCK),)](partials, out, partials.shape[0], D,
                                                              BLOCK=_REDUCE_BLOCK, ROWS=_REDUCE_ROWS)
    return out


def backward(kind, dy, dres, s, stats, weight, weight_offset, ds, dx, want_dweight, want_dbias, N, D):
    """One launch over N rows (row views as in ``forward``), then the deterministic reduction of the
    parameter gradients: returns (dweight, dbias) as (D,) float64, or None where not wanted."""
    dy, dres, s, weight = resolved(dy, dres, s, weight)
    k = _kernels()
    w = _param(weight, D)
    rows, block, chunks, nw = config(N, D, backward_rows(), _BACKWARD_ELEMS_PER_WARP, backward_tile())
    programs = program_count(-(-N // rows), s)
    per_program = -(-N // programs)
    programs = -(-N // per_program)
    make = torch.zeros if chunks > 1 else torch.empty  # chunked rows add into their partials
    dwp = make(programs, D, dtype=torch.float32, device=s.device) if want_dweight else s
    dbp = make(programs, D, dtype=torch.float32, device=s.device) if want_dbias else s
    layer = kind == "layer"
    with on_device(s):
        k.add_norm_bwd[(programs,)](
            dy, s if dres is None else dres, s, stats[0] if layer else stats[-1], stats[-1],
            s if w is None else w, ds, ds if dx is None else dx, dwp, dbp,
            dy.stride(0), 0 if dres is None else dres.stride(0), s.stride(0), ds.stride(0),
            0 if dx is None else dx.stride(0), N, D, per_program, float(weight_offset),
            IS_LAYER=layer, HAS_DRES=dres is not None, HAS_W=w is not None, WANT_DW=want_dweight,
            WANT_DB=want_dbias, STORE_DX=dx is not None, ROWS=rows, BLOCK=block, CHUNKS=chunks,
            RNE=availability().interpreted, num_warps=nw, **OPTIONS)
    return (sum_partials(dwp, D) if want_dweight else None), (sum_partials(dbp, D) if want_dbias else None)


# ---------------------------------------------------------------- the operators' implementation


def add_norm(x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight, out_dtype, sum_dtype,
             want_stats=True, out=None, residual_out=None):
    """Forward: y (x's shape, out_dtype), s (x's shape, sum_dtype; None when sum_dtype is None), stats
    (float32; None unless wanted). ``out``/``residual_out``: the caller's buffers (checked by
    ``addnorm.functional.buffers``), written in place of new ones."""
    N = x.numel() // D
    y = out if out is not None else torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    s = residual_out
    if s is None and sum_dtype is not None:
        s = torch.empty(x.shape, dtype=sum_dtype, device=x.device)
    stats = torch.empty(2 if kind == "layer" else 1, N, dtype=torch.float32, device=x.device) if want_stats else None
    if N:
        forward(kind, as_rows(x, D), _rows(residual, D), weight, bias, eps, weight_offset, cast_before_weight,
                y.view(-1, D), None if s is None else s.view(-1, D), stats, N, D)
    return y, s, stats


def add_norm_backward(dy, dres, s, stats, weight, bias, kind, D, weight_offset, x_dtype, want_w, want_b):
    """Backward: ds in s's dtype, dx in x_dtype when that differs (else None), dweight and dbias in their
    parameters' shapes and dtypes (None unless wanted)."""
    N = s.numel() // D
    want_w, want_b = want_w and weight is not None, want_b and bias is not None
    ds = torch.empty(s.shape, dtype=s.dtype, device=s.device)
    dx = None if x_dtype == s.dtype else torch.empty(s.shape, dtype=x_dtype, device=s.device)
    if N:
        dw, db = backward(kind, as_rows(dy, D), _rows(dres, D), as_rows(s, D), stats, weight, weight_offset,
                          ds.view(-1, D), None if dx is None else dx.view(-1, D), want_w, want_b, N, D)
    else:
        dw = torch.zeros(D, dtype=torch.float64, device=s.device) if want_w else None
        db = torch.zeros(D, dtype=torch.float64, device=s.device) if want_b else None
    dw = None if dw is None else dw.to(weight.dtype).view(weight.shape)
    db = None if db is None else db.to(bias.dtype).view(bias.shape)
    return ds, dx, dw, db
