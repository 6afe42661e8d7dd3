"""The widened stream's operators: schemas, fake implementations and device implementations.

    addnorm::stream_read(x, h_pre) -> h
    addnorm::stream_read_backward(dh, x, h_pre) -> (dx, dh_pre)
    addnorm::stream_write(x, y, h_post, h_res) -> (x2, q)
    addnorm::stream_write_backward(dx2?, dq?, x, y, x2, h_post, h_res) -> (dx, dy, dh_post, dh_res)

See ``formulas``. CPU: the C kernels (``kernels.cpu.stream``) where they take the call (a kernel
dtype shared by the activations, n <= 8), else the formulas; CUDA: the Triton kernels where Triton is
installed, else the formulas; other devices: the formulas. Autograd: ``autograd``.
"""

from __future__ import annotations

import torch

from ...kernels.cpu import stream as _cpu
from ...kernels.triton import stream as _triton
from ..last import declined
from ..norm.schema import LIB
from . import formulas as stream_formulas

LIB.define("stream_read(Tensor x, Tensor h_pre) -> Tensor")
LIB.define("stream_read_backward(Tensor dh, Tensor x, Tensor h_pre) -> (Tensor, Tensor)")
LIB.define("stream_write(Tensor x, Tensor y, Tensor h_post, Tensor h_res) -> (Tensor, Tensor)")
LIB.define("stream_write_backward(Tensor? dx2, Tensor? dq, Tensor x, Tensor y, Tensor x2, Tensor h_post, "
           "Tensor h_res) -> (Tensor, Tensor, Tensor, Tensor)")


def _read_formulas(x, h_pre):
    return stream_formulas.read(x, h_pre).contiguous()


def _read_backward_formulas(dh, x, h_pre):
    dx, d = stream_formulas.read_backward(dh, x, h_pre)
    return dx.contiguous(), d.contiguous()


def _write_formulas(x, y, h_post, h_res):
    x2, q = stream_formulas.write(x, y, h_post, h_res)
    return x2.contiguous(), q.contiguous()


def _write_backward_formulas(dx2, dq, x, y, x2, h_post, h_res):
    return tuple(t.contiguous() for t in stream_formulas.write_backward(dx2, dq, x, y, x2, h_post, h_res))


def _kernel_coeff(t):
    return t.dtype in (torch.float32, torch.float16, torch.bfloat16)


def _impls(k):
    def read(x, h_pre):
        if not (k.applies(x) and _kernel_coeff(h_pre)):
            declined()
            return _read_formulas(x, h_pre)
        return k.stream_read(x, h_pre)

    def read_backward(dh, x, h_pre):
        if not (k.applies(x, dh) and _kernel_coeff(h_pre)):
            return _read_backward_formulas(dh, x, h_pre)
        dx, d = k.stream_read_backward(dh, x, h_pre)
        return dx, d.to(h_pre.dtype)

    def write(x, y, h_post, h_res):
        if not (k.applies(x, y) and _kernel_coeff(h_post) and _kernel_coeff(h_res)):
            declined()
            return _write_formulas(x, y, h_post, h_res)
        return k.stream_write(x, y, h_post, h_res, True)

    def write_backward(dx2, dq, x, y, x2, h_post, h_res):
        if dx2 is None or not (k.applies(x, y, dx2) and _kernel_coeff(h_post) and _kernel_coeff(h_res)):
            return _write_backward_formulas(dx2, dq, x, y, x2, h_post, h_res)
        dx, dy, dp, dr = k.stream_write_backward(dx2, dq, x, y, x2, h_post, h_res)
        return dx, dy, dp.to(h_post.dtype), dr.to(h_res.dtype)

    return read, read_backward, write, write_backward


CPU = _impls(_cpu)
TRITON = _impls(_triton)
for name, cpu_impl, triton_impl, formula in zip(
        ("stream_read", "stream_read_backward", "stream_write", "stream_write_backward"), CPU, TRITON,
        (_read_formulas, _read_backward_formulas, _write_formulas, _write_backward_formulas), strict=True):
    LIB.impl(name, cpu_impl, "CPU")
    LIB.impl(name, triton_impl, "CUDA")
    LIB.impl(name, formula, "CompositeExplicitAutograd")


def _q_dtype(*ts):
    return stream_formulas.compute_dtype(*ts)


@torch.library.register_fake("addnorm::stream_read", lib=LIB)
def _read_fake(x, h_pre):
    return x.new_empty(x.shape[:-2] + x.shape[-1:])


@torch.library.register_fake("addnorm::stream_read_backward", lib=LIB)
def _read_backward_fake(dh, x, h_pre):
    return x.new_empty(x.shape), h_pre.new_empty(h_pre.shape)


@torch.library.register_fake("addnorm::stream_write", lib=LIB)
def _write_fake(x, y, h_post, h_res):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-2], dtype=_q_dtype(x, y, h_post, h_res))


@torch.library.register_fake("addnorm::stream_write_backward", lib=LIB)
def _write_backward_fake(dx2, dq, x, y, x2, h_post, h_res):
    return x.new_empty(x.shape), y.new_empty(y.shape), h_post.new_empty(h_post.shape), h_res.new_empty(h_res.shape)
