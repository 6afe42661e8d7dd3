"""mHC's pre step as an operator: schema, fake implementation and device implementations.

    addnorm::mhc_pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms?, eps, iters,
                     pre_eps=0, res_eps=0, res_transposed=False, post_scale=2, post_eps=0, groups=3)
        -> (h, h_pre, h_post, h_res, p, rstd, state)
    addnorm::mhc_pre_backward(dh?, dh_pre?, dh_post?, dh_res?, x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res,
                              perms?, p, rstd, state, eps, iters, pre_eps=0, res_eps=0, res_transposed=False,
                              post_scale=2, post_eps=0, groups=3)
        -> (dx, dphi, da_pre, da_post, da_res, db_pre, db_post, db_res)

See ``formulas`` for the math (``pre_op``; ``state``, what the backward keeps from the forward: Sinkhorn-Knopp's
rounds where the CPU kernels take mHC, so that their backward does not run them again); the last six arguments are
a model's convention (``convention.MhcConvention``), the paper's by default, and the rounds kept are the
convention's: groups 2 makes no H_res (HY-V4's iHC: phi (nC, 2n), b_res empty, h_res (..., 0, 0)), groups 1 H_pre
alone (a final collapse: phi (nC, n), h_post (..., 0)); neither runs Sinkhorn, so neither keeps rounds (state
(..., 0), as mHC-lite). CPU: the C kernels (``kernels.cpu.mhc``) where they take the call (a kernel dtype, n <= 8,
m <= 128, iters <= 64, perms that are permutation matrices), else the formulas; CUDA: the Triton kernels where
Triton is installed and the convention is the paper's (they take no other yet), else the formulas; other devices:
the formulas. Autograd: ``autograd``.
"""

from __future__ import annotations

import torch

from ...kernels.cpu import mhc as _cpu
from ...kernels.triton import mhc as _triton
from ..last import declined
from ..norm.schema import LIB
from . import formulas as mf

LIB.define("mhc_pre(Tensor x, Tensor phi, Tensor a_pre, Tensor a_post, Tensor a_res, Tensor b_pre, Tensor b_post, "
           "Tensor b_res, Tensor? perms, float eps, int iters, float pre_eps=0., float res_eps=0., "
           "bool res_transposed=False, float post_scale=2., float post_eps=0., int groups=3) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
LIB.define("mhc_pre_backward(Tensor? dh, Tensor? dh_pre, Tensor? dh_post, Tensor? dh_res, Tensor x, Tensor phi, "
           "Tensor a_pre, Tensor a_post, Tensor a_res, Tensor b_pre, Tensor b_post, Tensor b_res, Tensor? perms, "
           "Tensor p, Tensor rstd, Tensor state, float eps, int iters, float pre_eps=0., float res_eps=0., "
           "bool res_transposed=False, float post_scale=2., float post_eps=0., int groups=3) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")

COEFFS = ("a_pre", "a_post", "a_res", "b_pre", "b_post", "b_res")


def pre_formulas(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, *convention):
    """The operator's formulas (``mf.pre_op``: ``mf.pre``'s outputs and the state), each output contiguous."""
    return tuple(t.contiguous() for t in mf.pre_op(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps,
                                                   iters, *convention))


def pre_backward_formulas(dh, dh_pre, dh_post, dh_res, x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, p,
                          rstd, state, eps, iters, *convention):
    gs = mf.pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps,
                         iters, *convention)
    return tuple(g.contiguous() for g in gs)


def perm_index(perms: torch.Tensor | None, n: int) -> torch.Tensor | None | bool:
    """mHC-lite's (r, n, n) permutation matrices as the kernels' index table (r, n) int32: P_k[i, idx[k, i]] = 1.
    False when ``perms`` are not permutation matrices (the formulas take those)."""
    if perms is None:
        return None
    if perms.dim() != 3 or perms.shape[1:] != (n, n) or perms.shape[0] < 1:
        return False
    one_hot = ((perms == 0) | (perms == 1)).all() and (perms.sum(-1) == 1).all() and (perms.sum(-2) == 1).all()
    if not bool(one_hot):
        return False
    return perms.argmax(-1).to(device=perms.device, dtype=torch.int32).contiguous()


def _kernel_params(x, phi, coeffs):
    return (x.dtype != torch.float64 and phi.dtype != torch.float64
            and all(t.dtype != torch.float64 for t in coeffs))


def scal_bias(a_pre, a_post, a_res, b_pre, b_post, b_res):
    scal = torch.stack([a_pre.reshape(()), a_post.reshape(()), a_res.reshape(())]).float()
    bias = torch.cat([b_pre.reshape(-1), b_post.reshape(-1), b_res.reshape(-1)]).float()
    return scal, bias


PAPER = (0.0, 0.0, False, 2.0, 0.0, 3)  # (pre_eps, res_eps, res_transposed, post_scale, post_eps, groups): the paper's


def kernel_index(k, x, phi, coeffs, perms, iters, convention=PAPER):
    """The permutation index table (None for mHC) when kernel backend ``k`` takes the call, else False. A model's
    convention (``convention.MhcConvention``'s fields) where the kernels take one (``k.CONVENTIONS``: the C kernels;
    the Triton ones compute the paper's), else the formulas."""
    if x.dim() < 2 or not (_kernel_params(x, phi, coeffs) and k.applies(x, phi.shape[-1], iters)):
        return False
    if tuple(convention) != PAPER and not getattr(k, "CONVENTIONS", False):
        return False
    if convention[5] < 3 and perms is not None:  # no H_res to mix permutations into: the formulas ignore them
        return False
    return perm_index(perms, x.shape[-2])


def _coefficient_grads(k, out, p, n, coeffs):
    """The coefficients' gradients from a backward's outputs: the kernel's own float64 sums where it returns them
    (``k.COEFFICIENT_SUMS``: the C kernels, its last output), else summed here from dlogits (out[1])."""
    if getattr(k, "COEFFICIENT_SUMS", False):
        return mf.coefficient_grads_from_sums(out[-1], n, coeffs)
    return mf.coefficient_grads(out[1], p, n, coeffs)


def _convention_args(k, conv):
    """The convention as the kernel host takes it: nothing for one that computes the paper's only."""
    return tuple(conv) if getattr(k, "CONVENTIONS", False) else ()


def _impls(k):
    def pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps=0.0, res_eps=0.0,
            res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
        coeffs = (a_pre, a_post, a_res, b_pre, b_post, b_res)
        conv = (pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)
        idx = kernel_index(k, x, phi, coeffs, perms, iters, conv)
        if idx is False:
            declined()
            return pre_formulas(x, phi, *coeffs, perms, eps, iters, *conv)
        out = k.mhc_pre(x, phi, *scal_bias(*coeffs), idx, eps, iters, *_convention_args(k, conv))
        if out[6].shape[-1] != mf.state_size(x, perms, iters, groups):  # kernels that keep no rounds (Triton,
            # interpreted on CPU tensors, whose operator keeps them): the rounds from p, as the formulas give them
            state = mf.coefficient_state(out[4], x.shape[-2], a_res.float(), b_res.float(), iters, res_eps,
                                         res_transposed)
            out = (*out[:6], state)
        return out

    def pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, p, rstd,
                     state, eps, iters, pre_eps=0.0, res_eps=0.0, res_transposed=False, post_scale=2.0, post_eps=0.0,
                     groups=3):
        coeffs = (a_pre, a_post, a_res, b_pre, b_post, b_res)
        conv = (pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)
        idx = kernel_index(k, x, phi, coeffs, perms, iters, conv)
        if idx is False or (dh is not None and dh.dtype != x.dtype) or p.dtype != torch.float32:
            return pre_backward_formulas(dh, dh_pre, dh_post, dh_res, x, phi, *coeffs, perms, p, rstd, state, eps,
                                         iters, *conv)
        out = k.mhc_pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, *scal_bias(*coeffs), idx, p, rstd, state, iters,
                                 *_convention_args(k, conv))
        return (out[0], out[2].to(phi.dtype), *_coefficient_grads(k, out, p, x.shape[-2], coeffs))

    return pre, pre_backward


CPU = _impls(_cpu)
TRITON = _impls(_triton)
LIB.impl("mhc_pre", CPU[0], "CPU")
LIB.impl("mhc_pre_backward", CPU[1], "CPU")
LIB.impl("mhc_pre", TRITON[0], "CUDA")
LIB.impl("mhc_pre_backward", TRITON[1], "CUDA")
LIB.impl("mhc_pre", pre_formulas, "CompositeExplicitAutograd")
LIB.impl("mhc_pre_backward", pre_backward_formulas, "CompositeExplicitAutograd")


def pre_fake(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps=0.0, res_eps=0.0,
             res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
    """The outputs' shapes and dtypes: H_post (..., 0) without its group, H_res (..., 0, 0)."""
    ct = mf.compute_dtype(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res)
    lead, n, m = x.shape[:-2], x.shape[-2], phi.shape[-1]
    f = dict(dtype=ct)
    return (x.new_empty(lead + x.shape[-1:]), x.new_empty(lead + (n,), **f),
            x.new_empty(lead + ((n,) if groups > 1 else (0,)), **f),
            x.new_empty(lead + ((n, n) if groups > 2 else (0, 0)), **f), x.new_empty(lead + (m,), **f),
            x.new_empty(lead, **f), x.new_empty(lead + (mf.state_size(x, perms, iters, groups),), **f))


torch.library.register_fake("addnorm::mhc_pre", pre_fake, lib=LIB)


@torch.library.register_fake("addnorm::mhc_pre_backward", lib=LIB)
def _pre_backward_fake(dh, dh_pre, dh_post, dh_res, x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, p, rstd,
                       state, eps, iters, pre_eps=0.0, res_eps=0.0, res_transposed=False, post_scale=2.0,
                       post_eps=0.0, groups=3):
    return tuple(t.new_empty(t.shape) for t in (x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res))
