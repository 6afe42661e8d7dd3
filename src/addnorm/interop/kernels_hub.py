"""addnorm's RMSNorm and LayerNorm as HuggingFace ``kernels`` hub layers, from a local repository.

HF's ``kernels`` package swaps the forward of every layer class marked with
``use_kernel_forward_from_hub("RMSNorm")`` (or ``"LayerNorm"``) when ``kernelize()`` runs, choosing the
replacement from a kernel mapping. This module offers addnorm as that replacement, without a download:

    from kernels import Mode, kernelize, use_kernel_mapping
    from addnorm.interop.kernels_hub import kernel_mapping

    with use_kernel_mapping(kernel_mapping()):
        model = kernelize(model, mode=Mode.TRAINING, device="cpu")

``kernel_mapping()`` points both layer names at ``LocalLayerRepository`` objects on the kernel repository
shipped inside this package (``kernels_repo/build/torch-universal``: a ``metadata.json`` and a small
Python package whose ``layers`` module re-exports the classes below); ``kernels`` imports it from disk.

The layers follow the ``kernels`` layer rules (``kernels.layer.layer._validate_layer``): no ``__init__``,
no members beyond ``forward``, ``has_backward`` and ``can_torch_compile``, and the forward signature of the
layer they replace. They hold no state: the forward reads the replaced module's own attributes.

- ``RMSNorm`` reads ``weight`` and ``variance_epsilon`` (``eps`` where that is absent), and computes HF
  Llama's convention: statistics in float32, the normalized value cast to the input dtype, then times the
  weight (an output in the promoted dtype where the weight's is wider, as HF's). Of the transformers
  classes marked "RMSNorm", a few (GPT-OSS, OLMo-Hybrid, DeepSeek-V4, Nemotron-H, ...) instead multiply in
  float32 and cast once: for them the result is the same in float32 and may differ by the last bf16/fp16
  rounding in half precision. ``patch_hf_model`` reads each norm's convention by probing it and is exact
  there too.
- ``LayerNorm`` reads ``normalized_shape``, ``weight``, ``bias`` and ``eps`` (``torch.nn.LayerNorm``'s).

``kernelize`` swaps norms only; ``patch_hf_model`` also fuses the residual add into the norm after it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .. import functional as AF

__all__ = ["RMSNorm", "LayerNorm", "LAYER_NAMES", "DEFAULT_DEVICES", "repository_path", "layer_repository",
           "kernel_mapping"]

LAYER_NAMES = ("RMSNorm", "LayerNorm")
# kernels keys a mapping by device type; addnorm runs on every device (C kernels on CPU, Triton on CUDA,
# the exact torch composite elsewhere), so these are only the defaults
DEFAULT_DEVICES = ("cpu", "cuda")


def _rms_eps(module: nn.Module):
    eps = getattr(module, "variance_epsilon", None)
    return module.eps if eps is None else eps


def _wider_weight(x: torch.Tensor, weight) -> bool:
    # HF multiplies by the weight after the cast to x's dtype, so a wider weight (float32 beside a bf16 x)
    # widens the output: the normalized value is rounded to x's dtype first, then multiplied in the wider one
    return weight is not None and weight.dtype != x.dtype and torch.promote_types(x.dtype, weight.dtype) != x.dtype


class RMSNorm(nn.Module):
    """addnorm's RMSNorm for modules marked ``use_kernel_forward_from_hub("RMSNorm")`` (HF's LlamaRMSNorm
    and its copies): reads ``weight`` and ``variance_epsilon``; Llama's cast order."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        w = self.weight
        D = hidden_states.shape[-1]
        if _wider_weight(hidden_states, w):
            return w * AF.rms_norm(hidden_states, D, None, _rms_eps(self))
        return AF.rms_norm(hidden_states, D, w, _rms_eps(self), cast_before_weight=True)


class LayerNorm(nn.Module):
    """addnorm's LayerNorm for modules marked ``use_kernel_forward_from_hub("LayerNorm")`` (``nn.LayerNorm``
    and its subclasses): reads ``normalized_shape``, ``weight``, ``bias`` and ``eps``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 -- nn.LayerNorm.forward's name
        shape = tuple(self.normalized_shape)
        return AF.layer_norm(input, shape[0] if len(shape) == 1 else shape, self.weight, self.bias, self.eps)


def repository_path() -> Path:
    """The kernel repository shipped with addnorm (``build/torch-universal/`` inside), for
    ``kernels.LocalLayerRepository`` or ``kernels.get_local_kernel``."""
    return Path(__file__).resolve().parent / "kernels_repo"


def layer_repository(layer_name: str):
    """A ``kernels.LocalLayerRepository`` for ``layer_name`` ("RMSNorm" or "LayerNorm") on addnorm's
    repository: loaded from disk, never downloaded."""
    if layer_name not in LAYER_NAMES:
        raise ValueError(f"layer_name must be one of {LAYER_NAMES}, got {layer_name!r}")
    from kernels import LocalLayerRepository

    return LocalLayerRepository(repo_path=repository_path(), layer_name=layer_name)


def kernel_mapping(devices=DEFAULT_DEVICES, *, layers=LAYER_NAMES, mode=None) -> dict:
    """The mapping for ``kernels.use_kernel_mapping`` / ``register_kernel_mapping`` that sends each layer name
    in ``layers`` to addnorm on each device type in ``devices`` ("cpu", "cuda", "rocm", "mps", "xpu", ...).

    ``mode=None`` registers addnorm for every mode (kernels' ``Mode.FALLBACK``: it supports training and
    torch.compile alike); a ``kernels.Mode`` registers it for that mode only.
    """
    if isinstance(devices, str):
        devices = (devices,)
    if isinstance(layers, str):
        layers = (layers,)
    out = {}
    for name in layers:
        repo = layer_repository(name)
        out[name] = {dev: (repo if mode is None else {mode: repo}) for dev in devices}
    return out
