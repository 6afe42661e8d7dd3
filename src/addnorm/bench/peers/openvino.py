"""OpenVINO's Add & Norm on the CPU: the graph an exported model holds, built in memory with OpenVINO's opset and
compiled by its CPU plugin, which fuses what it can.

OpenVINO has no skip-norm operation: the graph is ``s = x + r`` and then, for LayerNorm, ``MVN(s) * gamma + beta``
(MVN over the last axis, eps inside the square root, as LayerNorm), for RMSNorm
``s / sqrt(mean(s * s) + eps) * gamma``, the pattern its plugin turns into one RMS node. gamma and beta are
constants, as in an exported model (the plugin folds the scale into its RMS node and the scale and shift into one
pass only when they are). What 2026.4's plugin makes of it on this CPU: the add, then MVN and one element-wise pass
for LayerNorm, the add and one RMS node for RMSNorm (``compiled(...).get_runtime_model()`` shows it).

Inputs and outputs are the caller's tensors and tensors allocated once per cell, shared with OpenVINO
(no copies). The compiled model runs one stream with the cell's thread count, latency hint. Its inference
precision is the data's where this CPU computes in it, float32 otherwise: OpenVINO's CPU default on a CPU with
bfloat16 instructions is to compute float32 models in bfloat16, which would not be the float32 result the other
methods return, and float16 data on a CPU without float16 arithmetic would otherwise be computed in bfloat16.
"""

from __future__ import annotations

import functools

import torch

REQUIRES = ("openvino",)
DTYPES = ("float32", "float16", "bfloat16")
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}  # a numpy view of the bits: numpy has no bfloat16


def version() -> str:
    import openvino

    return openvino.get_version().split("-")[0]  # "2026.4.1", without the build's tag


@functools.lru_cache(maxsize=1)
def _core():
    import openvino

    return openvino.Core()


def _type(dtype: str):
    import openvino

    return {"float32": openvino.Type.f32, "float16": openvino.Type.f16, "bfloat16": openvino.Type.bf16}[dtype]


def shared(t: torch.Tensor):
    """An OpenVINO tensor over ``t``'s memory (no copy)."""
    import openvino

    bits = t.detach().view(_INT[t.element_size()]).numpy()
    return openvino.Tensor(bits, list(t.shape), _type(str(t.dtype).removeprefix("torch.")))


def precision(dtype: str) -> str:
    """The inference precision to ask for: the data's where the CPU computes in it, else float32."""
    caps = _core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    native = {"float32": True, "bfloat16": "BF16" in caps, "float16": "FP16" in caps}[dtype]
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype] if native else "f32"


def model(cell, weight: torch.Tensor, bias: torch.Tensor | None):
    """The OpenVINO model: parameters x and r; results y, then s."""
    import numpy as np
    import openvino
    import openvino.opset13 as ops

    t, n, d = _type(cell.dtype), cell.rows, cell.hidden
    x, r = ops.parameter([n, d], t, name="x"), ops.parameter([n, d], t, name="residual")
    s = ops.add(x, r)
    last = ops.constant(np.array([-1], np.int64))
    gamma = ops.constant(shared(weight), False)  # copied: the graph must not read the caller's tensor later
    if cell.kind == "layer":
        y = ops.multiply(ops.mvn(s, last, True, float(cell.eps), "inside_sqrt"), gamma)
        if bias is not None:
            y = ops.add(y, ops.constant(shared(bias), False))
    else:
        if bias is not None:
            raise ValueError("bias: RMSNorm has none")
        mean_sq = ops.reduce_mean(ops.multiply(s, s), last, True)
        y = ops.multiply(ops.divide(s, ops.sqrt(ops.add(mean_sq, ops.constant(float(cell.eps), t)))), gamma)
    return openvino.Model([y.output(0), s.output(0)], [x, r], f"add_{cell.kind}_norm")


def compiled(cell, weight: torch.Tensor, bias: torch.Tensor | None):
    config = {"INFERENCE_NUM_THREADS": cell.threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_PRECISION_HINT": precision(cell.dtype)}
    return _core().compile_model(model(cell, weight, bias), "CPU", config)


def build(cell, weight: torch.Tensor, bias: torch.Tensor | None):
    """``run(x, residual) -> (y, s)``, y and s the same two tensors on every call (allocated here, once)."""
    request = compiled(cell, weight, bias).create_infer_request()
    y = torch.empty(cell.rows, cell.hidden, dtype=getattr(torch, cell.dtype))
    s = torch.empty_like(y)
    request.set_output_tensor(0, shared(y))
    request.set_output_tensor(1, shared(s))
    bound = [None]

    def run(x: torch.Tensor, residual: torch.Tensor):
        ptrs = (x.data_ptr(), residual.data_ptr())
        if ptrs != bound[0]:  # wrap again only when the inputs moved: a benchmark passes the same ones
            request.set_input_tensor(0, shared(x))
            request.set_input_tensor(1, shared(residual))
            bound[0] = ptrs
        request.infer()
        return y, s

    return run
