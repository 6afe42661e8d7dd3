"""Negative views on every kernel entry, forward inputs and backward gradients alike.

A negative view (``torch._neg_view``; a conjugate's imaginary part) keeps its values un-negated in memory with a
flag. The kernels read raw memory, so a contiguous one reached them with the wrong sign: the stream ops, mhc_pre
and DyT/Derf in the forward, and in the backward every op's incoming gradient (plain rms_norm's too). PyTorch's
OpInfo suite checks this as ``test_neg_view``: an op given a negative view of -t must equal the op given t,
outputs and gradients. Here each op on each kernel backend, with every tensor input a negative view, and then
with every incoming gradient a negative view.
"""

import pytest
import torch

import addnorm
from addnorm.functional import layer_norm_add, parallel_add_layer_norm, parallel_add_rms_norm, rms_norm_add

BACKENDS = ["cpu", "triton"]


def _neg(t):
    """A negative view holding the same values as t (the flag set, the memory negated)."""
    return torch._neg_view(-t.detach()).requires_grad_(t.requires_grad)


def _cases():
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    D, n = 16, 4
    x, res, x2, w, b = r(3, D), r(3, D), r(3, D), r(D) + 1, r(D)
    X, hp, hpost, hres, y = r(3, n, D), r(3, n).sigmoid(), r(3, n).sigmoid(), r(3, n, n).softmax(-1), r(3, D)
    phi = r(n * D, n * n + 2 * n) * 0.1
    a, bp, bpo, br = torch.tensor(0.3), r(n), r(n), r(n, n)
    return {
        "layer_norm": (lambda x, w, b, **k: addnorm.layer_norm(x, D, w, b, **k), (x, w, b)),
        "rms_norm": (lambda x, w, **k: addnorm.rms_norm(x, D, w, **k), (x, w)),
        "add_layer_norm": (lambda x, r_, w, b, **k: addnorm.add_layer_norm(x, r_, D, w, b, **k), (x, res, w, b)),
        "add_rms_norm": (lambda x, r_, w, **k: addnorm.add_rms_norm(x, r_, D, w, **k), (x, res, w)),
        "layer_norm_add": (lambda x, r_, w, b, **k: layer_norm_add(x, r_, D, w, b, **k), (x, res, w, b)),
        "rms_norm_add": (lambda x, r_, w, **k: rms_norm_add(x, r_, D, w, **k), (x, res, w)),
        "parallel_add_layer_norm": (
            lambda x, x2, r_, w, b, **k: parallel_add_layer_norm(x, x2, r_, D, w, b, w * 2, b, **k),
            (x, x2, res, w, b)),
        "parallel_add_rms_norm": (lambda x, x2, r_, w, **k: parallel_add_rms_norm(x, x2, r_, D, w, w * 2, **k),
                                  (x, x2, res, w)),
        "add_dyt": (lambda x, r_, w, b, **k: addnorm.add_dyt(x, r_, torch.tensor(0.7), w, b, **k), (x, res, w, b)),
        "add_derf": (lambda x, r_, w, b, **k: addnorm.add_derf(x, r_, torch.tensor(0.7), torch.tensor(0.1), w, b, **k),
                     (x, res, w, b)),
        "stream_read": (lambda X, hp, **k: addnorm.stream_read(X, hp, **k), (X, hp)),
        "stream_write": (lambda X, y, hpost, hres, **k: addnorm.stream_write(X, y, hpost, hres, **k),
                         (X, y, hpost, hres)),
        "mhc_pre": (lambda X, phi, **k: addnorm.mhc_pre(X, phi, a, a, a, bp, bpo, br, **k)[:4], (X, phi)),
    }


CASES = _cases()


def _outs(o):
    return [t for t in (o if isinstance(o, tuple | list) else (o,)) if t is not None]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", sorted(CASES))
def test_negative_views_in_and_out_give_what_plain_tensors_give(op, backend, monkeypatch):
    if backend == "triton":
        pytest.importorskip("triton", reason="Triton is not installed (pip install -e '.[gpu]'; CI installs it)")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    elif not addnorm.cpu_kernel_availability().available:
        pytest.skip("the compiled CPU kernels are not built")
    fn, args = CASES[op]
    plain = [t.clone().requires_grad_() for t in args]
    want = _outs(fn(*plain, backend=backend))
    grads = [torch.randn_like(t) for t in want]
    want_g = torch.autograd.grad(want, plain, grads, allow_unused=True)

    negs = [_neg(t).requires_grad_() for t in args]  # every input a negative view
    got = _outs(fn(*negs, backend=backend))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, msg=lambda m: f"{op} {backend} forward, negative-view inputs: {m}")

    plain2 = [t.clone().requires_grad_() for t in args]  # every incoming gradient a negative view
    got_g = torch.autograd.grad(_outs(fn(*plain2, backend=backend)), plain2, [_neg(g) for g in grads],
                                allow_unused=True)
    for i, (a, b) in enumerate(zip(got_g, want_g)):
        if b is None:
            continue
        torch.testing.assert_close(a, b, msg=lambda m: f"{op} {backend} grad of input {i}, negative-view dy: {m}")
