"""A write of the widened stream and mHC's pre step on its result as one operator: what a sub-layer leaves pending
(its output y and the coefficients that write it) finished in the same pass that computes the next read.

    addnorm::mhc_write_pre(x, y, w_post, w_res?, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms?,
                           eps, iters, pre_eps=0, res_eps=0, res_transposed=False, post_scale=2, post_eps=0,
                           groups=3)
        -> (x2, h, h_pre, h_post, h_res, p, rstd)
    addnorm::mhc_write_pre_backward(dx2?, dh?, dh_pre?, dh_post?, dh_res?, x, y, w_post, w_res?, products, x2, phi,
                                    a_pre, ..., b_res, perms?, p, rstd, eps, iters, *convention)
        -> (dx, dy, dw_post, dw_res, dphi, da_pre, da_post, da_res, db_pre, db_post, db_res)   (dw_res (0,) without
                                                                                                w_res)

x2 = X' = H_res X + H_post^T y (w_res (..., n, n): the stream family's write, DeepSeek-V4's post y + comb^T X) or
X + H_post^T y (w_res None: no mixing matrix, each stream its own -- HY-V4's; ``products``: each H_post[i] y rounded
to the inputs' dtype first, as eager 16-bit code does); the rest is ``mhc_pre(x2, ...)`` (``schema``) without its
state: this operator keeps no Sinkhorn-Knopp rounds, and every backward here recomputes them from p. (The eager
fast path's C++ node, ``MhcWritePreNode`` in ``kernels/cpu/autograd_nodes.cpp``, keeps them: the same bits.)

CPU: one C kernel (``kernels.cpu.mhc.mhc_write_pre``: each token's X' is written and read while its rows are in
cache) where mhc_pre's kernels take the read and the write's tensors are kernel dtypes, y X's; else the write's
formulas, then mhc_pre's CPU implementation. CUDA: the write's formulas, then mhc_pre's Triton implementation.

Backward (``MhcWritePre``, ``mhc_write_pre_backward``): the read's backward on the saved X', then the write's from
g = dX' + the read's dX' (dX = g or H_res^T g, dy = sum_i H_post[i] g_i, dH_post[i] = <g_i, y>, dH_res[i, j] =
<g_i, X_j>). Both are per token, so on the CPU they are one C pass, the read's dX' kept in float32 (not rounded to
X's dtype before the sum, as two operators would); elsewhere two (``mhc_pre_backward``'s implementation, then
``stream_write_backward`` or the write's formulas). Double backward and forward-mode AD: the formulas of both.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from ...kernels.cpu import mhc as _cpu
from ..hyper import formulas as hyper_formulas
from ..last import declined
from ..norm.autograd import differentiable_backward, direct_subclass, primal
from ..norm.schema import LIB
from ..stream import formulas as stream_formulas
from . import formulas as mf
from .schema import CPU as PRE_CPU
from .schema import TRITON as PRE_TRITON
from .schema import pre_backward_formulas
from .schema import kernel_index, pre_fake, scal_bias

LIB.define("mhc_write_pre(Tensor x, Tensor y, Tensor w_post, Tensor? w_res, bool products, Tensor phi, Tensor a_pre, "
           "Tensor a_post, Tensor a_res, Tensor b_pre, Tensor b_post, Tensor b_res, Tensor? perms, float eps, int iters, "
           "float pre_eps=0., float res_eps=0., bool res_transposed=False, float post_scale=2., float post_eps=0., "
           "int groups=3) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
LIB.define("mhc_write_pre_backward(Tensor? dx2, Tensor? dh, Tensor? dh_pre, Tensor? dh_post, Tensor? dh_res, Tensor x, "
           "Tensor y, Tensor w_post, Tensor? w_res, bool products, Tensor x2, Tensor phi, Tensor a_pre, Tensor a_post, "
           "Tensor a_res, Tensor b_pre, Tensor b_post, Tensor b_res, Tensor? perms, Tensor p, Tensor rstd, float eps, "
           "int iters, float pre_eps=0., float res_eps=0., bool res_transposed=False, float post_scale=2., "
           "float post_eps=0., int groups=3) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, "
           "Tensor, Tensor, Tensor)")

_KERNEL_COEFF = (torch.float32, torch.bfloat16, torch.float16)


def write_formulas(x, y, w_post, w_res, products):
    """X' in X's dtype: the stream family's write (w_res given) or the hyper write without a mixing matrix."""
    if w_res is None:
        return hyper_formulas.write(x, y, w_post, "products" if products else "once")
    return stream_formulas.write(x, y, w_post, w_res)[0]


def write_backward(g, x, y, w_post, w_res):
    """(dx, dy, dw_post, dw_res) of the write from g = dX', in torch ops (differentiable again); dw_res None
    without a mixing matrix. Rounding each product first has no gradient of its own: the same as rounding once."""
    if w_res is not None:
        return stream_formulas.write_backward(g, None, x, y, None, w_post, w_res)
    ct = mf.compute_dtype(x, y, w_post)
    gf = g.to(ct)
    dy = (w_post.to(ct).unsqueeze(-1) * gf).sum(-2).to(y.dtype)
    return g.to(x.dtype), dy, (gf * y.to(ct).unsqueeze(-2)).sum(-1).to(w_post.dtype), None


def write_jvp(x, y, w_post, w_res, tx, ty, tpost, tres):
    """The tangent of X' (in X's dtype) along the write's input tangents (None: zero)."""
    ct = mf.compute_dtype(x, y, w_post, w_res)
    t = torch.zeros(x.shape, dtype=ct, device=x.device)
    if tx is not None:
        t = t + (tx.to(ct) if w_res is None else torch.matmul(w_res.to(ct), tx.to(ct)))
    if tres is not None and w_res is not None:
        t = t + torch.matmul(tres.to(ct), x.to(ct))
    if tpost is not None:
        t = t + tpost.to(ct).unsqueeze(-1) * y.to(ct).unsqueeze(-2)
    if ty is not None:
        t = t + w_post.to(ct).unsqueeze(-1) * ty.to(ct).unsqueeze(-2)
    return t.to(x.dtype)


def _formulas(x, y, w_post, w_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters,
              *convention):
    x2 = write_formulas(x, y, w_post, w_res, products)
    outs = mf.pre(x2, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, *convention)
    return tuple(t.contiguous() for t in (x2, *outs))


def _kernel_products(x, y, w_post, w_res, products):
    """What the C kernel's ``products`` must be for the formulas' result, or None where it cannot compute it: the
    formulas round H_post y to the product's own dtype, which is X's only when H_post is no wider than y."""
    if y.dtype != x.dtype or y.device != x.device or w_post.dtype not in _KERNEL_COEFF:
        return None
    if w_res is not None:
        return False if not products and w_res.dtype in _KERNEL_COEFF else None
    return bool(products) and torch.promote_types(w_post.dtype, y.dtype) == x.dtype


def _impl(kernel, pre_impl):
    """mhc_write_pre on one device: ``kernel``'s fused pass (None: no such kernel) where it takes the call, else the
    write's formulas and ``pre_impl`` (mhc_pre's implementation on that device)."""

    def write_pre(x, y, w_post, w_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters,
                  pre_eps=0.0, res_eps=0.0, res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
        coeffs = (a_pre, a_post, a_res, b_pre, b_post, b_res)
        conv = (pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)
        if kernel is not None:
            prods = _kernel_products(x, y, w_post, w_res, products)
            idx = False if prods is None else kernel_index(kernel, x, phi, coeffs, perms, iters, conv)
            if idx is not False:
                return kernel.mhc_write_pre(x, y, w_post, w_res, prods, phi, *scal_bias(*coeffs), idx, eps, iters,
                                            *conv)
            declined()
        x2 = write_formulas(x, y, w_post, w_res, products).contiguous()
        return (x2, *pre_impl(x2, phi, *coeffs, perms, eps, iters, *conv)[:6])  # the read's state: not kept

    return write_pre


def _write_grads(write, w_post, w_res):
    """(dx, dy, dw_post, dw_res) as the operator returns them: dw_res (0,) without a mixing matrix."""
    dx, dy, dpost, dres = write
    return dx.contiguous(), dy.contiguous(), dpost.contiguous(), w_post.new_empty(0) if w_res is None else dres


def _no_state(p):
    """The read's state as this operator hands it to mhc_pre's backward: empty (the fused forward keeps no rounds,
    so the backward recomputes them from p)."""
    return p.new_empty(p.shape[:-1] + (0,))


def _two_passes(pre_backward_impl, dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, x2, phi, coeffs, perms, p,
                rstd, eps, iters, conv):
    """The read's backward (``pre_backward_impl``: mhc_pre_backward's on a device), then the write's."""
    read = pre_backward_impl(dh, dh_pre, dh_post, dh_res, x2, phi, *coeffs, perms, p, rstd, _no_state(p), eps, iters,
                             *conv)
    g = read[0] if dx2 is None else dx2 + read[0]
    if w_res is None:
        write = write_backward(g, x, y, w_post, None)
    else:
        write = _stream_write_backward(g, None, x, y, x2, w_post, w_res)
    return (*_write_grads(write, w_post, w_res), *read[1:])


def _backward_formulas(dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, products, x2, phi, a_pre, a_post, a_res,
                       b_pre, b_post, b_res, perms, p, rstd, eps, iters, *convention):
    coeffs = (a_pre, a_post, a_res, b_pre, b_post, b_res)
    read = pre_backward_formulas(dh, dh_pre, dh_post, dh_res, x2, phi, *coeffs, perms, p, rstd, _no_state(p), eps,
                                 iters, *convention)
    g = read[0] if dx2 is None else dx2 + read[0]
    return (*_write_grads(write_backward(g, x, y, w_post, w_res), w_post, w_res), *read[1:])


def _backward_impl(kernel, pre_backward_impl):
    """mhc_write_pre_backward on one device: ``kernel``'s one pass where it takes the call, else two."""

    def write_pre_backward(dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, products, x2, phi, a_pre, a_post,
                           a_res, b_pre, b_post, b_res, perms, p, rstd, eps, iters, pre_eps=0.0, res_eps=0.0,
                           res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
        coeffs = (a_pre, a_post, a_res, b_pre, b_post, b_res)
        conv = (pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)
        same = all(g is None or g.dtype == x2.dtype for g in (dx2, dh)) and x.dtype == x2.dtype
        if kernel is not None and same and p.dtype == torch.float32 and (
                _kernel_products(x, y, w_post, w_res, products) is not None):
            idx = kernel_index(kernel, x2, phi, coeffs, perms, iters, conv)
            if idx is not False:
                dx, dy, dpost, dres, dlogits, dphi, dcoef = kernel.mhc_write_pre_backward(
                    dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, x2, phi, *scal_bias(*coeffs), idx, p, rstd,
                    iters, *conv)
                dres = w_post.new_empty(0) if w_res is None else dres.to(w_res.dtype)
                return (dx, dy, dpost.to(w_post.dtype), dres, dphi.to(phi.dtype),
                        *mf.coefficient_grads_from_sums(dcoef, x2.shape[-2], coeffs))
        return _two_passes(pre_backward_impl, dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, x2, phi, coeffs,
                           perms, p, rstd, eps, iters, conv)

    return write_pre_backward


_stream_write_backward = torch.ops.addnorm.stream_write_backward.default
CPU = _impl(_cpu, PRE_CPU[0])
TRITON = _impl(None, PRE_TRITON[0])
CPU_BACKWARD = _backward_impl(_cpu, PRE_CPU[1])
TRITON_BACKWARD = _backward_impl(None, PRE_TRITON[1])
LIB.impl("mhc_write_pre", CPU, "CPU")
LIB.impl("mhc_write_pre", TRITON, "CUDA")
LIB.impl("mhc_write_pre", _formulas, "CompositeExplicitAutograd")
LIB.impl("mhc_write_pre_backward", CPU_BACKWARD, "CPU")
LIB.impl("mhc_write_pre_backward", TRITON_BACKWARD, "CUDA")
LIB.impl("mhc_write_pre_backward", _backward_formulas, "CompositeExplicitAutograd")


@torch.library.register_fake("addnorm::mhc_write_pre", lib=LIB)
def _fake(x, y, w_post, w_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters,
          *convention):
    return (x.new_empty(x.shape), *pre_fake(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters,
                                            *convention)[:6])


@torch.library.register_fake("addnorm::mhc_write_pre_backward", lib=LIB)
def _backward_fake(dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, products, x2, phi, *rest):
    coeffs = rest[:6]
    dres = w_post.new_empty(0) if w_res is None else w_res.new_empty(w_res.shape)
    return (x.new_empty(x.shape), y.new_empty(y.shape), w_post.new_empty(w_post.shape), dres,
            phi.new_empty(phi.shape), *(t.new_empty(t.shape) for t in coeffs))


_op = torch.ops.addnorm.mhc_write_pre.default
_backward = torch.ops.addnorm.mhc_write_pre_backward.default
N_IN = 12  # x, y, w_post, w_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res
N_ARGS = 9  # perms, eps, iters and the convention


class MhcWritePre(torch.autograd.Function):
    """(x, y, w_post, w_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters,
    *convention) -> (x2, h, H_pre, H_post, H_res, p, rstd); p and rstd are not differentiable."""

    @staticmethod
    def forward(x, y, w_post, w_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters,
                pre_eps, res_eps, res_transposed, post_scale, post_eps, groups):
        with torch._C._AutoDispatchBelowAutograd():
            return _op(x, y, w_post, w_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps,
                       iters, pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y, w_post, w_res, products, phi, *coeffs = inputs[:N_IN]
        perms, eps, iters, *convention = inputs[N_IN:]
        ctx.save_for_backward(x, y, w_post, w_res, phi, *coeffs, output[0], output[5], output[6])
        ctx.products, ctx.perms, ctx.eps, ctx.iters = products, perms, eps, iters
        ctx.convention = tuple(convention)
        ctx.mark_non_differentiable(output[5], output[6])
        ctx.set_materialize_grads(False)
        ctx.direct = None
        if _fwad._current_level >= 0:  # jvp cannot read saved tensors
            ctx.primals = tuple(primal(t) for t in (x, y, w_post, w_res, phi, *coeffs, output[0]))

    @staticmethod
    def backward(ctx, dx2, dh, dh_pre, dh_post, dh_res, _dp, _drstd):
        if dx2 is None and dh is None and dh_pre is None and dh_post is None and dh_res is None:
            return (None,) * (N_IN + N_ARGS)
        x, y, w_post, w_res, phi, *rest = ctx.saved_tensors
        coeffs, (x2, p, rstd) = rest[:6], rest[6:]
        if differentiable_backward(dx2, dh, dh_pre, dh_post, dh_res):  # double backward, or tangents: the formulas
            read = (None,) * 8
            if not (dh is None and dh_pre is None and dh_post is None and dh_res is None):
                read = mf.pre_backward(dh, dh_pre, dh_post, dh_res, x2, phi, *coeffs, ctx.perms, ctx.eps, ctx.iters,
                                       *ctx.convention)
                dx2 = read[0] if dx2 is None else dx2 + read[0]
            write = write_backward(dx2, x, y, w_post, w_res) if dx2 is not None else (None,) * 4
            gs = (*write, None, *read[1:])
        else:
            dx, dy, dpost, dres, *read = _backward(dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res,
                                                   ctx.products, x2, phi, *coeffs, ctx.perms, p, rstd, ctx.eps,
                                                   ctx.iters, *ctx.convention)
            gs = (dx, dy, dpost, None if w_res is None else dres, None, *read)
        return (*(g if ctx.needs_input_grad[i] else None for i, g in enumerate(gs)), *(None,) * N_ARGS)

    @staticmethod
    def jvp(ctx, *tangents):
        x, y, w_post, w_res, phi, *coeffs, x2 = ctx.primals
        tx2 = write_jvp(x, y, w_post, w_res, *tangents[:4])
        t_read = mf.pre_jvp((x2, phi, *coeffs), (tx2, *tangents[5:N_IN]), ctx.perms, ctx.eps, ctx.iters,
                            *ctx.convention)
        return (tx2, *t_read, None, None)  # p and rstd are not differentiable


DirectMhcWritePre = direct_subclass("DirectMhcWritePre", MhcWritePre, CPU, None)
TritonMhcWritePre = direct_subclass("TritonMhcWritePre", MhcWritePre, TRITON, None)


def _autograd(x, y, w_post, w_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters,
              pre_eps=0.0, res_eps=0.0, res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
    return MhcWritePre.apply(x, y, w_post, w_res, products, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms,
                             eps, iters, pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)


LIB.impl("mhc_write_pre", _autograd, "Autograd")
