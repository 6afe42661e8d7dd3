"""Attention Residuals' depth mix as an operator: schema, fake implementation and device implementations.

    addnorm::attn_res(sources[], query, weight, eps) -> (h, alpha, rstd)
    addnorm::attn_res_backward(dh, sources[], query, weight, alpha, rstd, eps) -> (dsources[], dquery, dweight)

``sources`` are S tensors of one shape (..., C) (their dtypes may differ: h takes the promoted one), ``query``
and ``weight`` (the key norm's; ones for none) are (C,); alpha and rstd are (..., S). See ``formulas`` for the
math. CPU: the C kernels (``kernels.cpu.attn_res``) where they take the call (every source of one kernel dtype,
S <= 64), else the formulas; other devices: the formulas. Autograd: ``autograd``.
"""

from __future__ import annotations

import torch

from ...kernels.cpu import attn_res as _cpu
from ..last import declined
from ..norm.schema import LIB
from . import formulas as af

LIB.define("attn_res(Tensor[] sources, Tensor query, Tensor weight, float eps) -> (Tensor, Tensor, Tensor)")
LIB.define("attn_res_backward(Tensor dh, Tensor[] sources, Tensor query, Tensor weight, Tensor alpha, Tensor rstd, "
           "float eps) -> (Tensor[], Tensor, Tensor)")


def _forward_formulas(sources, query, weight, eps):
    return tuple(t.contiguous() for t in af.forward(sources, query, weight, eps))


def _backward_formulas(dh, sources, query, weight, alpha, rstd, eps):
    dsources, dq, dw = af.backward(dh, sources, query, weight, eps)
    return [d.contiguous() for d in dsources], dq.contiguous(), dw.contiguous()


def _impls(k):
    def forward(sources, query, weight, eps):
        if not k.applies(sources, query, weight):
            declined()
            return _forward_formulas(sources, query, weight, eps)
        return k.attn_res(sources, query, weight, eps)

    def backward(dh, sources, query, weight, alpha, rstd, eps):
        if not (k.applies(sources, query, weight) and dh.dtype == sources[0].dtype and alpha.dtype == torch.float32):
            return _backward_formulas(dh, sources, query, weight, alpha, rstd, eps)
        dsources, du = k.attn_res_backward(dh, sources, query, weight, alpha, rstd, eps)
        return dsources, (du * weight.float()).to(query.dtype), (du * query.float()).to(weight.dtype)

    return forward, backward


def _formulas_declined(sources, query, weight, eps):
    declined()
    return _forward_formulas(sources, query, weight, eps)


CPU = _impls(_cpu)
LIB.impl("attn_res", CPU[0], "CPU")
LIB.impl("attn_res_backward", CPU[1], "CPU")
LIB.impl("attn_res", _formulas_declined, "CUDA")  # no Triton kernel yet: the formulas, said so
LIB.impl("attn_res_backward", _backward_formulas, "CUDA")
LIB.impl("attn_res", _forward_formulas, "CompositeExplicitAutograd")
LIB.impl("attn_res_backward", _backward_formulas, "CompositeExplicitAutograd")


@torch.library.register_fake("addnorm::attn_res", lib=LIB)
def _forward_fake(sources, query, weight, eps):
    v = sources[0]
    stat = dict(dtype=af.compute_dtype(*sources, query, weight))
    lead = v.shape[:-1] + (len(sources),)
    return v.new_empty(v.shape, dtype=af.out_dtype(sources)), v.new_empty(lead, **stat), v.new_empty(lead, **stat)


@torch.library.register_fake("addnorm::attn_res_backward", lib=LIB)
def _backward_fake(dh, sources, query, weight, alpha, rstd, eps):
    return [v.new_empty(v.shape) for v in sources], query.new_empty(query.shape), weight.new_empty(weight.shape)
