"""The CPU engines' own fused Add & Norm, as methods of the Add & Norm benchmark (``addnorm bench --methods``).

Each peer is one module here with ``REQUIRES`` (the packages it imports), ``DTYPES`` (the dtypes it runs),
``version()`` and ``build(cell, weight, bias) -> run``, where ``run(x, residual)`` returns
``(norm(x + residual), x + residual)``: the contract of ``addnorm.add_layer_norm`` / ``add_rms_norm``.

The engines compile a graph for one shape, so a peer is built per benchmark cell (``PeerCell``). Its weights are
baked into that graph as constants, as in an exported model (the engines fold and fuse around constants, which
they cannot do around graph inputs); ``PeerMethod`` rebuilds it when it is called with other weights. They are
inference engines: the benchmark times them forward only.

The peers are optional (``pip install 'addnorm[peers]'``): nothing here imports an engine until a peer is built.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

import torch

# benchmark method name -> the module here that runs it
PEERS = {"onnxruntime": "onnxruntime", "openvino": "openvino"}
# method name -> (its name in tables, its short name in the terminal's)
LABELS = {"onnxruntime": ("ONNX Runtime", "ORT"), "openvino": ("OpenVINO", "OV")}
# the modes a peer is timed in: inference only (neither engine differentiates these ops)
MODES = ("fwd",)
INSTALL = "pip install 'addnorm[peers]'"


@dataclass(frozen=True)
class PeerCell:
    """What one compiled graph is for."""

    kind: str  # "layer" (LayerNorm) or "rms" (RMSNorm)
    rows: int
    hidden: int
    dtype: str  # "float32", "float16" or "bfloat16": inputs, outputs and weights
    eps: float
    threads: int  # the engine's intra-op threads: the benchmark's torch threads, so every method has as many

    def __post_init__(self):
        if self.kind not in ("layer", "rms"):
            raise ValueError(f"kind: expected 'layer' or 'rms', got {self.kind!r}")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype: expected float32, float16 or bfloat16, got {self.dtype!r}")
        for name in ("rows", "hidden", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {getattr(self, name)!r}")


def _module(name: str):
    if name not in PEERS:
        raise ValueError(f"peer: unknown {name!r}; known: {', '.join(PEERS)}")
    return importlib.import_module(f"{__name__}.{PEERS[name]}")


def missing(name: str) -> str | None:
    """Why peer ``name`` cannot run here, or None when its packages are installed."""
    absent = [m for m in _module(name).REQUIRES if importlib.util.find_spec(m) is None]
    if absent:
        return f"{name}: {', '.join(absent)} not installed ({INSTALL})"
    return None


def dtypes(name: str) -> tuple[str, ...]:
    return _module(name).DTYPES


def version(name: str) -> str:
    return _module(name).version()


def runs(name: str, mode: str, dtype: str) -> bool:
    """Whether the benchmark times peer ``name`` in a cell of this mode and dtype."""
    return mode in MODES and dtype in dtypes(name)


class PeerMethod:
    """A benchmark method ``f(x, residual, weight, bias) -> (y, s)`` over one peer in one cell: the graph is built
    on the first call (during the benchmark's warm-up) with that call's weights, and again when they change."""

    def __init__(self, name: str, cell: PeerCell):
        self._build = _module(name).build
        self.name, self.cell = name, cell
        self._key = None
        self._run = None

    def __call__(self, x, residual, weight, bias=None):
        c = self.cell
        dtype = getattr(torch, c.dtype)
        for arg, t, shape in (("x", x, (c.rows, c.hidden)), ("residual", residual, (c.rows, c.hidden)),
                              ("weight", weight, (c.hidden,)), ("bias", bias, (c.hidden,))):
            if t is None and arg == "bias":
                continue
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype or t.device.type != "cpu":
                got = f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{arg}: {self.name} was built for a contiguous CPU tensor of {shape} {c.dtype}, "
                                 f"got {got}")
            if not t.is_contiguous():
                raise ValueError(f"{arg}: {self.name} reads contiguous memory; call .contiguous() first")
        if c.kind == "rms" and bias is not None:
            raise ValueError("bias: RMSNorm has none")
        key = tuple((t.data_ptr(), t._version) for t in (weight, bias) if t is not None)
        if key != self._key:
            self._run = self._build(c, weight.detach(), None if bias is None else bias.detach())
            self._key = key
        return self._run(x, residual)


def method(name: str, cell: PeerCell) -> PeerMethod:
    reason = missing(name)
    if reason:
        raise RuntimeError(reason)
    if cell.dtype not in dtypes(name):
        raise ValueError(f"dtype: {name} runs {', '.join(dtypes(name))}, not {cell.dtype}")
    return PeerMethod(name, cell)
