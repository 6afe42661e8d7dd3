"""ONNX Runtime's fused Add & Norm on the CPU: the com.microsoft contrib ops SkipLayerNormalization (LayerNorm)
and SkipSimplifiedLayerNormalization (RMSNorm), one node in an ONNX graph built in memory.

The node's inputs are (input, skip, gamma[, beta]) and its outputs (output, mean, inv_std_var,
input_skip_bias_sum); the graph asks for the first and the last, ``norm(x + r)`` and ``x + r``, so the sum is
written by the same kernel, as addnorm's is. gamma and beta are initializers (constants), as in an exported model.
ONNX Runtime 1.32's CPU provider has kernels for float32, float16 and bfloat16 (checked by the tests: no Cast is
inserted around the node).

Run through I/O binding: the inputs are read where the caller's tensors are, and the outputs are written into
tensors allocated once per cell, so the timing counts the kernel and ONNX Runtime's per-run overhead, not its
allocator. ``intra_op_num_threads`` is the cell's thread count; the thread pool's other settings (spinning
included) are ONNX Runtime's defaults, as deployed.
"""

from __future__ import annotations

import torch

REQUIRES = ("onnxruntime", "onnx")
DTYPES = ("float32", "float16", "bfloat16")
OPS = {"layer": "SkipLayerNormalization", "rms": "SkipSimplifiedLayerNormalization"}


def version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def _elem_type(dtype: str) -> int:
    from onnx import TensorProto

    return {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype]


def _initializer(name: str, t: torch.Tensor, elem_type: int):
    from onnx import helper

    raw = t.contiguous().view(torch.uint8).numpy().tobytes()  # the bits as they are, bfloat16 included
    return helper.make_tensor(name, elem_type, list(t.shape), raw, raw=True)


def graph(cell, weight: torch.Tensor, bias: torch.Tensor | None):
    """The ONNX model: one skip-norm node, inputs ``input`` and ``skip``, outputs ``output`` and ``sum``."""
    from onnx import helper

    et, n, d = _elem_type(cell.dtype), cell.rows, cell.hidden
    inits = [_initializer("gamma", weight, et)]
    names = ["input", "skip", "gamma"]
    if bias is not None:
        if cell.kind != "layer":
            raise ValueError("bias: SkipSimplifiedLayerNormalization has no beta")
        inits.append(_initializer("beta", bias, et))
        names.append("beta")
    node = helper.make_node(OPS[cell.kind], names, ["output", "", "", "sum"], domain="com.microsoft",
                            epsilon=float(cell.eps))
    io = [helper.make_tensor_value_info(k, et, [n, d]) for k in ("input", "skip", "output", "sum")]
    g = helper.make_graph([node], f"add_{cell.kind}_norm", io[:2], io[2:], initializer=inits)
    # opset 17 for the default domain (unused but required), version 1 of Microsoft's contrib domain
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def session(cell, model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = cell.threads
    so.inter_op_num_threads = 1  # one node: nothing to run in parallel between nodes
    so.log_severity_level = 3  # errors only
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def build(cell, weight: torch.Tensor, bias: torch.Tensor | None):
    """``run(x, residual) -> (y, s)``, y and s the same two tensors on every call (allocated here, once)."""
    sess = session(cell, graph(cell, weight, bias))
    et, shape = _elem_type(cell.dtype), [cell.rows, cell.hidden]
    y = torch.empty(shape, dtype=getattr(torch, cell.dtype))
    s = torch.empty_like(y)
    binding = sess.io_binding()
    binding.bind_output("output", "cpu", 0, et, shape, y.data_ptr())
    binding.bind_output("sum", "cpu", 0, et, shape, s.data_ptr())
    bound = [None]

    def run(x: torch.Tensor, residual: torch.Tensor):
        ptrs = (x.data_ptr(), residual.data_ptr())
        if ptrs != bound[0]:  # bind again only when the inputs moved: a benchmark passes the same ones
            binding.bind_input("input", "cpu", 0, et, shape, ptrs[0])
            binding.bind_input("skip", "cpu", 0, et, shape, ptrs[1])
            bound[0] = ptrs
        sess.run_with_iobinding(binding)
        return y, s

    return run
