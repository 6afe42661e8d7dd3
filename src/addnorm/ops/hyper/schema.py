"""The operators of hyper-connections without a mixing matrix:

    addnorm::hyper_read(x, weight, scale, base, eps, pre_eps, post_scale, post_eps) -> (h, h_pre, h_post)
    addnorm::hyper_write(x, y, h_post, rounding) -> x2
    addnorm::hyper_stream_norm(x, weight, eps, weight_offset) -> normed
    addnorm::hyper_stream_norm_backward(dn, x, weight, eps, weight_offset) -> (dx, dweight)
    addnorm::hyper_write_norm(x, y, h_post, weight, eps, weight_offset, rounding) -> (x2, normed)
    addnorm::hyper_write_norm_backward(dx2?, dn?, x2, y, h_post, weight, eps, weight_offset)
        -> (dx, dy, dh_post, dweight)
    addnorm::hyper_gated_collapse(x, gates, rounding) -> h
    addnorm::hyper_sigmoid_gated_collapse(x, logits, rounding) -> h
    addnorm::hyper_sigmoid_gated_collapse_backward(dh, x, logits, rounding) -> (dx, dlogits)

See ``formulas``; the conventions' numbers (``convention``) are the float arguments. ``hyper_read`` is mHC's pre step
without the comb matrix: a composite of ``mhc_pre`` with the convention's numbers and groups 2 (or 1 for a head,
weight (n, nC)) (``mhc_args``), so it runs where mhc_pre runs -- the C kernels on the CPU, the formulas elsewhere --
and its backward, fake tensors and what torch.compile traces are mhc_pre's. Qwen4-exp's gated read -- the stream
norm, the write with the norm after it, the sigmoid-gated collapse from the gates' logits -- runs on the C kernels
(``kernels.cpu.hyper``: one walk over the stream each way) where they take the call (one kernel dtype for the
activations, parameters no wider than float32), else on its formulas; elsewhere on the formulas. Their autograd is
``autograd``. ``hyper_write`` and ``hyper_gated_collapse`` are composites of their formulas
(CompositeImplicitAutograd). (The stream family's C and Triton write kernels mix by a full H_res; given an identity
they would spread one stream's inf or NaN into the others, 0 * inf, which HF's X + H_post y never does -- so the
write without a mixing matrix is its own: ``ops.mhc.write`` computes it fused with HY-V4's read after it, and
``hyper_write_norm`` with Qwen4-exp's norm.)
"""

from __future__ import annotations

import torch

from ...kernels.cpu import hyper as _cpu
from ..last import declined
from ..norm.schema import LIB
from . import formulas

LIB.define("hyper_read(Tensor x, Tensor weight, Tensor scale, Tensor base, float eps, float pre_eps, "
           "float post_scale, float post_eps) -> (Tensor, Tensor, Tensor)")
LIB.define("hyper_write(Tensor x, Tensor y, Tensor h_post, str rounding) -> Tensor")
LIB.define("hyper_stream_norm(Tensor x, Tensor weight, float eps, float weight_offset) -> Tensor")
LIB.define("hyper_stream_norm_backward(Tensor dn, Tensor x, Tensor weight, float eps, float weight_offset) "
           "-> (Tensor, Tensor)")
LIB.define("hyper_write_norm(Tensor x, Tensor y, Tensor h_post, Tensor weight, float eps, float weight_offset, "
           "str rounding) -> (Tensor, Tensor)")
LIB.define("hyper_write_norm_backward(Tensor? dx2, Tensor? dn, Tensor x2, Tensor y, Tensor h_post, Tensor weight, "
           "float eps, float weight_offset) -> (Tensor, Tensor, Tensor, Tensor)")
LIB.define("hyper_gated_collapse(Tensor x, Tensor gates, str rounding) -> Tensor")
LIB.define("hyper_sigmoid_gated_collapse(Tensor x, Tensor logits, str rounding) -> Tensor")
LIB.define("hyper_sigmoid_gated_collapse_backward(Tensor dh, Tensor x, Tensor logits, str rounding) "
           "-> (Tensor, Tensor)")


def mhc_args(x, weight, scale, base, eps, pre_eps, post_scale, post_eps) -> tuple:
    """``addnorm::mhc_pre``'s arguments for a hyper read: phi = weight^T, (a_pre, a_post) = scale, (b_pre, b_post)
    = base, no H_res (groups 2: a_res zero, b_res empty), or for a head (weight (n, nC)) no H_post either
    (groups 1); eps and the gates' numbers as the convention (``convention.ProjectedGates``) gives them."""
    n = x.size(-2)
    groups = weight.size(0) // n
    s = scale.reshape(-1)
    zero = s.new_zeros(())
    return (x, weight.t(), s[0], s[-1] if groups == 2 else zero, zero, base[:n], base[n:], base.new_zeros(0), None,
            float(eps), 0, float(pre_eps), 0.0, False, float(post_scale), float(post_eps), groups)


def _read(x, weight, scale, base, eps, pre_eps, post_scale, post_eps):
    return tuple(torch.ops.addnorm.mhc_pre(*mhc_args(x, weight, scale, base, eps, pre_eps, post_scale, post_eps))[:3])


LIB.impl("hyper_read", _read, "CompositeImplicitAutograd")
LIB.impl("hyper_write", formulas.write, "CompositeImplicitAutograd")
LIB.impl("hyper_gated_collapse", formulas.gated_collapse, "CompositeImplicitAutograd")

_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # parameters the kernels read as float32, exactly


def _contiguous(outs):
    return tuple(t.contiguous() for t in outs)


def norm_formulas(x, weight, eps, weight_offset):
    return formulas.stream_norm(x, weight, eps, weight_offset).contiguous()


def norm_backward_formulas(dn, x, weight, eps, weight_offset):
    return _contiguous(formulas.stream_norm_backward(dn, x, weight, eps, weight_offset))


def write_norm_formulas(x, y, h_post, weight, eps, weight_offset, rounding):
    return _contiguous(formulas.write_norm(x, y, h_post, weight, eps, weight_offset, rounding))


def write_norm_backward_formulas(dx2, dn, x2, y, h_post, weight, eps, weight_offset):
    return _contiguous(formulas.write_norm_backward(dx2, dn, x2, y, h_post, weight, eps, weight_offset))


def gate_formulas(x, logits, rounding):
    return formulas.sigmoid_gated_collapse(x, logits, rounding).contiguous()


def gate_backward_formulas(dh, x, logits, rounding):
    return _contiguous(formulas.sigmoid_gated_collapse_backward(dh, x, logits, rounding))


def write_products(x, y, h_post, rounding) -> bool:
    """What the kernel's ``products`` must be for the formulas' X': they round H_post y to the product's own dtype,
    which is X's (the kernel's rounding) only when H_post is no wider than y; a wider one's product is not rounded."""
    return rounding == "products" and torch.promote_types(h_post.dtype, y.dtype) == x.dtype


def norm_impl(x, weight, eps, weight_offset):
    if not (_cpu.applies(x) and weight.dtype in _PARAM_DTYPES):
        declined()
        return norm_formulas(x, weight, eps, weight_offset)
    return _cpu.stream_norm(x, weight, eps, weight_offset)


def norm_backward_impl(dn, x, weight, eps, weight_offset):
    if not (_cpu.applies(x, dn) and weight.dtype in _PARAM_DTYPES):
        return norm_backward_formulas(dn, x, weight, eps, weight_offset)
    dx, dw = _cpu.stream_norm_backward(dn, x, weight, eps, weight_offset)
    return dx, dw.to(weight.dtype)


def write_norm_impl(x, y, h_post, weight, eps, weight_offset, rounding):
    if not (_cpu.applies(x, y) and h_post.dtype in _PARAM_DTYPES and weight.dtype in _PARAM_DTYPES):
        declined()
        return write_norm_formulas(x, y, h_post, weight, eps, weight_offset, rounding)
    return _cpu.write_norm(x, y, h_post, weight, eps, weight_offset, write_products(x, y, h_post, rounding))


def write_norm_backward_impl(dx2, dn, x2, y, h_post, weight, eps, weight_offset):
    if dn is None or not (_cpu.applies(x2, y, dn, dx2) and h_post.dtype in _PARAM_DTYPES
                          and weight.dtype in _PARAM_DTYPES):
        return write_norm_backward_formulas(dx2, dn, x2, y, h_post, weight, eps, weight_offset)
    dx, dy, dpost, dw = _cpu.write_norm_backward(dx2, dn, x2, y, h_post, weight, eps, weight_offset)
    return dx, dy, dpost.to(h_post.dtype), dw.to(weight.dtype)


def gate_impl(x, logits, rounding):
    if not _cpu.applies(x, logits):
        declined()
        return gate_formulas(x, logits, rounding)
    return _cpu.sigmoid_collapse(x, logits, rounding == "products")


def gate_backward_impl(dh, x, logits, rounding):
    if not _cpu.applies(x, logits, dh):
        return gate_backward_formulas(dh, x, logits, rounding)
    return _cpu.sigmoid_collapse_backward(dh, x, logits, rounding == "products")


def _formulas_declined(formula):
    def run(*args):
        declined()
        return formula(*args)

    return run


# CPU: the C kernels where they take the call; CUDA: the formulas, said so (no Triton kernel yet); elsewhere the
# formulas (CompositeExplicitAutograd)
for name, cpu_impl, formula in (("hyper_stream_norm", norm_impl, norm_formulas),
                                ("hyper_stream_norm_backward", norm_backward_impl, norm_backward_formulas),
                                ("hyper_write_norm", write_norm_impl, write_norm_formulas),
                                ("hyper_write_norm_backward", write_norm_backward_impl, write_norm_backward_formulas),
                                ("hyper_sigmoid_gated_collapse", gate_impl, gate_formulas),
                                ("hyper_sigmoid_gated_collapse_backward", gate_backward_impl, gate_backward_formulas)):
    LIB.impl(name, cpu_impl, "CPU")
    LIB.impl(name, _formulas_declined(formula) if "backward" not in name else formula, "CUDA")
    LIB.impl(name, formula, "CompositeExplicitAutograd")


@torch.library.register_fake("addnorm::hyper_stream_norm", lib=LIB)
def _norm_fake(x, weight, eps, weight_offset):
    return x.new_empty(x.shape)


@torch.library.register_fake("addnorm::hyper_stream_norm_backward", lib=LIB)
def _norm_backward_fake(dn, x, weight, eps, weight_offset):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


@torch.library.register_fake("addnorm::hyper_write_norm", lib=LIB)
def _write_norm_fake(x, y, h_post, weight, eps, weight_offset, rounding):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.register_fake("addnorm::hyper_write_norm_backward", lib=LIB)
def _write_norm_backward_fake(dx2, dn, x2, y, h_post, weight, eps, weight_offset):
    return x2.new_empty(x2.shape), y.new_empty(y.shape), h_post.new_empty(h_post.shape), weight.new_empty(weight.shape)


@torch.library.register_fake("addnorm::hyper_sigmoid_gated_collapse", lib=LIB)
def _gate_fake(x, logits, rounding):
    return x.new_empty(x.shape[:-2] + x.shape[-1:])


@torch.library.register_fake("addnorm::hyper_sigmoid_gated_collapse_backward", lib=LIB)
def _gate_backward_fake(dh, x, logits, rounding):
    return x.new_empty(x.shape), logits.new_empty(logits.shape)
