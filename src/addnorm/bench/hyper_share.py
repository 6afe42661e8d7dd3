"""What share of a model's time its hyper-connections take, measured the same way in HF's model and in the one
``patch_hf_model`` patched, so that the two shares compare.

The hyper-connection path is two kinds of code, both counted:

- its modules: every module that names itself a hyper-connection (``interop.hyper.looks_like_hyper``: HF's
  ``*HyperConnection`` and ``*HyperHead``, Qwen4-exp's ``*_hyper_connection`` and ``hyper_connection_mixer``) --
  in HF its read (the RMS of the stream, the coefficients, Sinkhorn-Knopp, the collapse), in the patched model the
  same module with its read on addnorm's operators, or only the pick-up of the read a write handed over;
- the writes: in a decoder layer, the code from the return of the sub-layer that follows a hyper-connection (its
  attention, its MLP) to the call of the next hyper-connection or the layer's return. In HF that is the inline write,
  ``X' = H_post^T y + H_res X`` however the layer spells it; in the patched model the rewritten call in its place (one
  ``stream_write`` / ``hyper_write`` and, where it is handed over, the next read). Whatever else the layer's code does
  there is counted too; in these three families it is only the write.

Forward: the wall-clock time between the module hooks' calls (global hooks, ``register_module_forward_pre_hook``,
which a patched hyper-connection does not see: a pre-hook of its own would turn off the hand-off). Backward: the
autograd nodes the forward created inside those intervals -- told apart by their sequence numbers, read at each
interval's ends from a probe node -- timed by the profiler (``autograd::engine::evaluate_function`` events, the node
with whatever its hooks and checks add; not the accumulation of parameters' gradients into ``.grad``). Each share
is of the time of the same instrumented pass (the hooks' and, in backward, the profiler's few microseconds per call
are in both terms alike).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ..interop.hyper import looks_like_hyper

_BACKWARD_EVENT = "autograd::engine::evaluate_function: "


@dataclass
class PassShare:
    """Seconds of one pass (forward, backward, or decoding steps) and of its hyper-connection code in it."""

    total_s: float = 0.0
    modules_s: float = 0.0  # the hyper-connection modules
    writes_s: float = 0.0  # the writes of the stream between them

    @property
    def hyper_s(self) -> float:
        return self.modules_s + self.writes_s

    @property
    def share(self) -> float:
        return self.hyper_s / self.total_s if self.total_s > 0 else 0.0

    def add(self, other: "PassShare") -> None:
        self.total_s += other.total_s
        self.modules_s += other.modules_s
        self.writes_s += other.writes_s

    def as_dict(self) -> dict:
        return {"total_ms": 1e3 * self.total_s, "modules_ms": 1e3 * self.modules_s, "writes_ms": 1e3 * self.writes_s,
                "hyper_ms": 1e3 * self.hyper_s, "share": self.share}


def hyper_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The outermost modules of ``model`` that name themselves hyper-connections, by name."""
    found: dict[str, nn.Module] = {}
    for name, m in model.named_modules():
        if name and looks_like_hyper(name, m) and not any(name.startswith(p + ".") for p in found):
            found[name] = m
    return found


def decoder_layers(model: nn.Module, hypers: dict[str, nn.Module]) -> list[nn.Module]:
    """The layers that call hyper-connections and write the stream: the parents, held in a ModuleList, of the
    hyper-connection modules (the final collapse's parent, the model, writes nothing)."""
    modules = dict(model.named_modules())
    layers: dict[int, nn.Module] = {}
    for name in hypers:
        parent = name.rpartition(".")[0]
        if parent and isinstance(modules.get(parent.rpartition(".")[0]), nn.ModuleList):
            layers[id(modules[parent])] = modules[parent]
    return list(layers.values())


@dataclass
class _Intervals:
    """The hyper-connection intervals of one forward: (kind, start s, end s, first seq nr, last seq nr)."""

    spans: list = field(default_factory=list)

    def share(self, total_s: float) -> PassShare:
        s = PassShare(total_s=total_s)
        for kind, t0, t1, _, _ in self.spans:
            if kind == "module":
                s.modules_s += t1 - t0
            else:
                s.writes_s += t1 - t0
        return s

    def kind_of(self, seq: int) -> str | None:
        for kind, _, _, lo, hi in self.spans:
            if lo is not None and lo < seq < hi:
                return kind
        return None


class HyperShare:
    """Hooks on a model that time its hyper-connection code (see the module's docstring). Use as a context
    manager; ``forward`` and ``backward`` run one pass each and return its ``PassShare``."""

    def __init__(self, model: nn.Module):
        self.model = model
        hypers = hyper_modules(model)
        if not hypers:
            raise ValueError(f"{type(model).__name__} has no hyper-connection module (a module named as one: "
                             f"interop.hyper.looks_like_hyper), so there is no hyper-connection share to measure")
        self._hyper = {id(m) for m in hypers.values()}
        self._layers = {id(m) for m in decoder_layers(model, hypers)}
        self._children = {id(c): id(layer) for layer in decoder_layers(model, hypers) for c in layer.children()}
        self._leaf = torch.zeros((), requires_grad=True)
        self._handles: list = []
        self._active: _Intervals | None = None
        self._open: dict[int, tuple] = {}  # a hyper-connection module called now: its start
        self._layer: dict[int, dict] = {}  # per layer called now: has it called a hyper-connection, last exit

    def __enter__(self):
        self._handles = [nn.modules.module.register_module_forward_pre_hook(self._pre),
                         nn.modules.module.register_module_forward_hook(self._post)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []

    def _seq(self) -> int | None:
        """The autograd sequence number now (a probe node takes one), or None where no graph is recorded."""
        if not torch.is_grad_enabled():
            return None
        return (self._leaf * 1).grad_fn._sequence_nr()

    def _pre(self, module, args):
        if self._active is None:
            return
        key, now = id(module), time.perf_counter()
        if key in self._layers:
            self._layer[key] = {"hyper": False, "exit": None}
        layer = self._layer.get(self._children.get(key))
        if layer is not None:
            if key in self._hyper and layer["hyper"] and layer["exit"] is not None:
                self._active.spans.append(("write", layer["exit"][0], now, layer["exit"][1], self._seq()))
            layer["exit"] = None
            layer["hyper"] = layer["hyper"] or key in self._hyper
        if key in self._hyper:
            self._open[key] = (time.perf_counter(), self._seq())

    def _post(self, module, args, output):
        if self._active is None:
            return
        key, now = id(module), time.perf_counter()
        if key in self._hyper and key in self._open:
            t0, s0 = self._open.pop(key)
            self._active.spans.append(("module", t0, now, s0, self._seq()))
        layer = self._layer.get(self._children.get(key))
        if layer is not None:
            layer["exit"] = (time.perf_counter(), self._seq())
        if key in self._layers:
            layer = self._layer.pop(key)
            if layer["hyper"] and layer["exit"] is not None:
                self._active.spans.append(("write", layer["exit"][0], now, layer["exit"][1], self._seq()))

    def forward(self, fn):
        """Run ``fn()`` (a forward of the model) under the hooks: (its output, the forward's PassShare, the
        intervals, for ``backward``)."""
        if not self._handles:
            raise RuntimeError("HyperShare.forward runs inside `with HyperShare(model) as share:`")
        self._active, self._open, self._layer = _Intervals(), {}, {}
        try:
            t0 = time.perf_counter()
            out = fn()
            total = time.perf_counter() - t0
        finally:
            intervals, self._active = self._active, None
        return out, intervals.share(total), intervals

    @staticmethod
    def backward(intervals: _Intervals, fn) -> PassShare:
        """Run ``fn()`` (the backward of the forward that recorded ``intervals``) under the profiler: its
        PassShare, the nodes created in those intervals counted as theirs."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            fn()
            total = time.perf_counter() - t0
        s = PassShare(total_s=total)
        for e in prof.events():
            if not e.name.startswith(_BACKWARD_EVENT) or e.sequence_nr < 0:
                continue
            kind = intervals.kind_of(e.sequence_nr)
            if kind == "module":
                s.modules_s += e.time_range.elapsed_us() * 1e-6
            elif kind == "write":
                s.writes_s += e.time_range.elapsed_us() * 1e-6
        return s
