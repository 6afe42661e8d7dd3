"""The recorder: hooks on blocks, sub-layers and norms; tidy records out."""

from __future__ import annotations

import csv
import functools
import json
import weakref
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from .blocks import find_blocks, is_norm
from .mixing import composite_gains
from .quantities import check_quantity
from .stats import per_stream_rms, tensor_stats


def depth_profile(records: Iterable[dict], quantity: str, sites: tuple[str, ...] | None = None,
                  step: int = 0, n_blocks: int | None = None) -> list[float]:
    """One value per block, in block order: the first record of ``quantity`` at ``step`` whose site is
    one of ``sites`` (any site when None); NaN for a block with none (a frozen block has no gradient), so that
    position k is always block k. ``n_blocks``: the length at least (the blocks after the last record). An unknown
    ``quantity`` raises ``ValueError`` naming the known ones."""
    check_quantity(quantity)
    out: dict[int, float] = {}
    for r in records:
        if r["quantity"] == quantity and r["step"] == step and (sites is None or r["site"] in sites):
            out.setdefault(r["block"], r["value"])
    n = max(max(out, default=-1) + 1, n_blocks or 0)
    return [out.get(k, float("nan")) for k in range(n)]


class Recorder:
    """Holds the hooks and the records. Use ``record(model)`` rather than constructing it."""

    def __init__(self, model: nn.Module, blocks: Iterable[nn.Module] | None = None, *, activations: bool = True,
                 norms: bool = True, gradients: bool = True, mixing: bool = True):
        self.model = model
        self.blocks = list(blocks) if blocks is not None else find_blocks(model)
        self.activations, self.norms, self.gradients, self.mixing = activations, norms, gradients, mixing
        self.records: list[dict] = []
        self._h_res: dict[int, tuple[int, str, torch.Tensor]] = {}  # sub-layer k -> (block, site, H_res)
        self.step = 0
        self._handles: list = []  # empty while detached
        # a module at several block positions (shared, ALBERT-style) is hooked once; its k-th call in a forward
        # is its k-th position (counted per module, reset when the model's forward starts)
        self._positions: dict[int, list[int]] = {}
        self._calls: dict[int, int] = {}
        self._current: dict[int, int] = {}
        self._grads_seen: dict[int, tuple] = {}  # parameter -> (a weak reference to its .grad, that grad's version)

    # ---- records
    def _add(self, block: int, site: str, quantity: str, value: float) -> None:
        self.records.append({"step": self.step, "block": block, "site": site, "quantity": quantity, "value": value})

    def next_step(self) -> None:
        """Mark the end of a training step: later records carry step + 1."""
        self.collect_parameter_gradients()
        self.collect_mixing()
        self.step += 1

    def _mixing_hook(self, k: int, block_idx: int, site: str):
        def hook(module, args, h_res):
            if k == 0:
                self._h_res.clear()  # a new forward
            self._h_res[k] = (block_idx, site, h_res.detach())
        return hook

    def collect_mixing(self) -> None:
        """For a widened stream, from the H_res of the last forward: each sub-layer's Amax gain magnitude
        (mHC section 3.1: forward = max |row sum|, backward = max |column sum|) and the composite gain of
        the products H_res_l ... H_res_1 (what reaches sub-layer l from the embedding: forward) and
        H_res_L ... H_res_l (what reaches sub-layer l from the top: backward), each token's matrices
        multiplied, then averaged over tokens (as the paper's figures average over a sequence)."""
        if not self._h_res:
            return
        ks = sorted(self._h_res)
        for k, gains in zip(ks, composite_gains([self._h_res[k][2] for k in ks])):
            block_idx, site, _ = self._h_res[k]
            for q, v in gains.items():
                self._add(block_idx, site, q, v)
        self._h_res.clear()

    # ---- hooks
    def _watch_stream(self, block_idx: int, site: str, s: torch.Tensor, widened: bool = False) -> None:
        if self.activations:
            for q, v in tensor_stats(s).items():
                self._add(block_idx, site, f"stream_{q}", v)
            if widened:  # (B, T, n, C): each of the n streams' RMS
                for i, v in enumerate(per_stream_rms(s)):
                    self._add(block_idx, site, f"stream{i}_rms", v)
        if self.gradients and s.requires_grad:
            def on_grad(g, block_idx=block_idx, site=site):
                if not self._handles:  # a backward after the recording: its parameter gradients are not taken
                    return
                self._add(block_idx, site, "grad_norm", g.detach().float().norm().item())
                self._add(block_idx, site, "grad_rms", g.detach().float().pow(2).mean().sqrt().item())
            s.register_hook(on_grad)

    def _block_index(self, block: nn.Module) -> int:
        """The position of the block's call now running: its only one, or (shared) the one _enter_block set."""
        return self._current.get(id(block), self._positions[id(block)][0])

    def _enter_block(self, block: nn.Module):
        """A pre-hook on each distinct block: which position this call is."""
        def hook(module, args, kwargs):
            pos = self._positions[id(block)]
            k = self._calls.get(id(block), 0)
            self._calls[id(block)] = k + 1
            self._current[id(block)] = pos[k % len(pos)]
            return None
        return hook

    def _new_forward(self, module, args, kwargs):
        self._calls.clear()
        return None

    def _stream_pre_hook(self, block_idx, site: str, addnorm_sublayer: bool, widened: bool = False):
        """``block_idx()``: the position of the call being hooked (see ``_block_index``)."""
        def hook(module, args, kwargs):
            i = block_idx()
            if not args and isinstance(kwargs.get("hidden_states"), torch.Tensor):  # HF calls by keyword
                s = kwargs["hidden_states"].view_as(kwargs["hidden_states"])
                self._watch_stream(i, site, s)
                return args, dict(kwargs, hidden_states=s)
            if not args or not isinstance(args[0], torch.Tensor) or not torch.is_floating_point(args[0]):
                return None
            x, rest = args[0], args[1:]
            if addnorm_sublayer and rest and rest[0] is not None:
                # addnorm passes (stream, pending): materialize stream = x + pending so that its value and
                # gradient are the residual stream's; the sum is the same one the fused kernel computes
                x, rest = x + rest[0], (None,) + rest[1:]
            s = x.view_as(x)  # a fresh node: its gradient is exactly what flows into this block
            self._watch_stream(i, site, s, widened)
            return (s,) + tuple(rest), kwargs
        return hook

    def _norm_hook(self, block_idx, name: str):
        def hook(module, args, output):
            i = block_idx()
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and len(args) > 1 and isinstance(args[1], torch.Tensor):
                x = x + args[1]  # addnorm's Add & Norm modules: the input is the sum
            y = output[0] if isinstance(output, tuple) else output
            if isinstance(x, torch.Tensor):
                for q, v in tensor_stats(x).items():
                    self._add(i, name, f"norm_in_{q}", v)
            if isinstance(y, torch.Tensor):
                for q, v in tensor_stats(y).items():
                    self._add(i, name, f"norm_out_{q}", v)
        return hook

    def attach(self) -> Recorder:
        from ..model.block import TransformerBlock
        from ..model.sublayer import ResidualSubLayer

        k = 0  # sub-layer index: the order of the widened streams' H_res
        self._positions.clear()
        for i, block in enumerate(self.blocks):
            self._positions.setdefault(id(block), []).append(i)
        self._handles.append(self.model.register_forward_pre_hook(self._new_forward, with_kwargs=True))
        self._snapshot_grads()
        seen: set[int] = set()
        for block in self.blocks:
            if id(block) in seen:
                continue
            seen.add(id(block))
            if len(self._positions[id(block)]) > 1:
                self._handles.append(block.register_forward_pre_hook(self._enter_block(block), with_kwargs=True))
            i = functools.partial(self._block_index, block)
            if isinstance(block, TransformerBlock):  # addnorm: per sub-layer, through the fused stream
                for site, sub in (("attn", block.attn), ("mlp", block.mlp)):
                    widened = getattr(sub, "streams", None) is not None
                    self._handles.append(sub.register_forward_pre_hook(self._stream_pre_hook(i, site, True, widened),
                                                                       with_kwargs=True))
                    if widened and self.mixing:
                        self._handles.append(sub.streams.h_res_tap.register_forward_hook(
                            self._mixing_hook(k, self._positions[id(block)][0], site)))
                    k += 1
            elif isinstance(block, ResidualSubLayer):
                self._handles.append(block.register_forward_pre_hook(self._stream_pre_hook(i, "block", True),
                                                                     with_kwargs=True))
            else:
                self._handles.append(block.register_forward_pre_hook(self._stream_pre_hook(i, "block", False),
                                                                     with_kwargs=True))
            if self.norms:
                for name, m in block.named_modules():
                    if name and is_norm(m):
                        self._handles.append(m.register_forward_hook(self._norm_hook(i, name)))
        if self.norms:  # norms outside the blocks (the final norm)
            inside = {id(m) for b in self.blocks for m in b.modules()}
            for name, m in self.model.named_modules():
                if name and is_norm(m) and id(m) not in inside:
                    self._handles.append(m.register_forward_hook(self._norm_hook(lambda: len(self.blocks), name)))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _snapshot_grads(self) -> None:
        # a weak reference, not id(): a gradient freed (zero_grad's set_to_none) and a new one allocated may share
        # an id, and holding the old one would keep every gradient alive twice
        self._grads_seen = {id(p): (weakref.ref(p.grad), p.grad._version) for p in self.model.parameters()
                            if p.grad is not None}

    def _fresh(self, p: nn.Parameter) -> bool:
        """Whether p's gradient was written since the last snapshot (a new tensor, or the same one updated)."""
        if p.grad is None:
            return False
        seen = self._grads_seen.get(id(p))
        return seen is None or seen[0]() is not p.grad or seen[1] != p.grad._version

    def collect_parameter_gradients(self) -> None:
        """Record each block's parameter-gradient norm (and per sub-layer for addnorm blocks): the gradients a
        backward wrote since the recording started (or since the last collect), not ones left from before."""
        if not self.gradients:
            return
        fresh = {id(p) for p in self.model.parameters() if self._fresh(p)}
        done: set[int] = set()
        for i, block in enumerate(self.blocks):
            if id(block) in done:  # a shared block: its parameters' one gradient, at its first position
                continue
            done.add(id(block))
            groups = {"block": list(block.parameters())}
            for site in ("attn", "mlp"):
                sub = getattr(block, site, None)
                if isinstance(sub, nn.Module):
                    groups[site] = list(sub.parameters())
            for site, params in groups.items():
                grads = [p.grad.detach().float().reshape(-1) for p in params if id(p) in fresh]
                if grads:
                    self._add(i, site, "param_grad_norm", torch.cat(grads).norm().item())
        self._snapshot_grads()

    # ---- export
    def sites(self) -> list[str]:
        """Where records are taken: each block's sub-layers ("attn", "mlp" in addnorm's blocks), the whole block
        ("block", and its parameters), and each norm by its module name (inside a block, relative to it)."""
        names = {"attn", "mlp", "block"}
        inside = {id(m) for b in self.blocks for m in b.modules()}
        for b in self.blocks:
            names.update(name for name, m in b.named_modules() if name and is_norm(m))
        names.update(name for name, m in self.model.named_modules() if name and is_norm(m) and id(m) not in inside)
        return sorted(names)

    def _check(self, quantity, site, step) -> None:
        """A quantity, site or step the recording cannot hold is refused by name: it read as no records (NaN)."""
        if quantity is not None:
            check_quantity(quantity)
        if site is not None and site not in self.sites():
            raise ValueError(f"unknown site {site!r}; this model's: {', '.join(self.sites())}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= self.step):
            raise ValueError(f"step must be an integer from 0 to {self.step} (the steps recorded so far: "
                             f"next_step() starts the next), got {step!r}")

    def frame(self, quantity: str | None = None, site: str | None = None, step: int | None = None) -> list[dict]:
        """The records, filtered. An unknown quantity or site, or a step not recorded, raises ``ValueError``
        naming what there is."""
        self._check(quantity, site, step)
        return [r for r in self.records if (quantity is None or r["quantity"] == quantity)
                and (site is None or r["site"] == site) and (step is None or r["step"] == step)]

    def by_block(self, quantity: str, site: str | None = None, step: int = 0) -> list[float]:
        """One value per block (the first site matching, in block order; NaN where none was recorded): a depth
        profile. An unknown quantity or site, or a step not recorded, raises ``ValueError`` naming what there is."""
        self._check(quantity, site, step)
        return depth_profile(self.records, quantity, None if site is None else (site,), step, len(self.blocks))

    def to_csv(self, path) -> Path:
        path = Path(path)
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["step", "block", "site", "quantity", "value"])
            w.writeheader()
            w.writerows(self.records)
        return path

    def to_json(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.records))
        return path


@contextmanager
def record(model: nn.Module, blocks: Iterable[nn.Module] | None = None, **options):
    """Attach the recorder for the duration of the block; parameter gradients are collected on exit."""
    rec = Recorder(model, blocks, **options).attach()
    try:
        yield rec
    finally:
        rec.detach()
        rec.collect_parameter_gradients()
        rec.collect_mixing()
