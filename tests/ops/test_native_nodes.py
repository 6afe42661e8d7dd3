"""The eager fast path's C++ autograd nodes (``kernels/cpu/autograd_nodes.cpp``) against its Python nodes
(``EagerAddNorm``, ``EagerNormAdd``, ``EagerParallelAddNorm``): the same outputs and gradients, to the bit and in
the same dtypes, for every argument combination the fast path takes, which inputs need a gradient and which
outputs are used; and the cases the C++ nodes hand to the Python backward (create_graph, a forward-AD level, a
dispatch mode, batched gradients, the residual output alone) answered as the Python nodes answer them."""

import itertools
import os
import subprocess
import sys

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.utils._python_dispatch import TorchDispatchMode

import addnorm
import addnorm.functional.norm as A
import addnorm.functional.fused as B
from addnorm.kernels.cpu import nodes
from addnorm.ops import native_nodes

NODES = native_nodes.NODES
NOT_BUILT = f"the C++ autograd nodes are not loaded here: {nodes.status()}; make setup builds them, CI runs these"
pytestmark = pytest.mark.skipif(NODES is None, reason=NOT_BUILT)
D = 24


def test_ci_builds_the_nodes():
    if os.environ.get("CI"):
        assert NODES is not None, nodes.status()
    assert nodes.status().startswith("loaded")


class _Use:
    """Call through the C++ nodes (True) or the Python nodes (False)."""

    def __init__(self, on):
        self.on = on

    def __enter__(self):
        A._NODES = B._NODES = NODES if self.on else None

    def __exit__(self, *exc):
        A._NODES = B._NODES = NODES


def _forms(kind, two, x2_given, branches_first, cbw, off):
    """name -> (fn(x, x2, r, w, b, w2, b2) -> tuple of outputs, which of (x, x2, r, w, b, w2, b2) it reads)."""
    rms = kind == "rms"
    return {
        "add_norm": (lambda x, x2, r, w, b, w2, b2: (
            addnorm.add_rms_norm(x, r, D, w, cast_before_weight=cbw, weight_offset=off) if rms
            else addnorm.add_layer_norm(x, r, D, w, b, weight_offset=off)), (0, 2, 3) if rms else (0, 2, 3, 4)),
        "norm": (lambda x, x2, r, w, b, w2, b2: (
            (addnorm.rms_norm(x, D, w, cast_before_weight=cbw, weight_offset=off),) if rms
            else (addnorm.layer_norm(x, D, w, b, weight_offset=off),)), (0, 3) if rms else (0, 3, 4)),
        "norm_add": (lambda x, x2, r, w, b, w2, b2: (
            (addnorm.rms_norm_add(x, r, D, w, cast_before_weight=cbw, weight_offset=off),) if rms
            else (addnorm.layer_norm_add(x, r, D, w, b, weight_offset=off),)), (0, 2, 3) if rms else (0, 2, 3, 4)),
        "parallel": (lambda x, x2, r, w, b, w2, b2: tuple(o for o in (
            addnorm.parallel_add_rms_norm(x, x2 if x2_given else None, r, D, w, w2 if two else None,
                                          cast_before_weight=cbw, weight_offset=off, branches_first=branches_first)
            if rms else addnorm.parallel_add_layer_norm(x, x2 if x2_given else None, r, D, w, b,
                                                        w2 if two else None, b2 if two else None, weight_offset=off,
                                                        branches_first=branches_first)) if o is not None),
                     tuple(i for i in (0, 1 if x2_given else None, 2, 3, None if rms else 4, 5 if two else None,
                                       None if rms or not two else 6) if i is not None)),
    }


def _run(fn, reads, tensors, grad_mask, out_mask, ups):
    ins = [t.clone().requires_grad_(bool(i in reads and grad_mask[i])) for i, t in enumerate(tensors)]
    outs = fn(*ins)
    used = [(o, u) for k, (o, u) in enumerate(zip(outs, ups)) if out_mask[k % len(out_mask)]]
    wrt = [ins[i] for i in reads if grad_mask[i]]
    if not wrt or not used:
        return outs, ()
    grads = torch.autograd.grad([o for o, _ in used], wrt, [u.to(o.dtype) for o, u in used], allow_unused=True)
    return outs, grads


def _same(a, b):
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


CASES = list(itertools.product(
    ("layer", "rms"), (torch.float32, torch.bfloat16, torch.float16), ("same", torch.float32, torch.float64)))


@pytest.mark.parametrize("kind,dt,pdt", CASES)
def test_cpp_nodes_match_python_nodes_bit_for_bit(kind, dt, pdt):
    g = torch.Generator().manual_seed(0)
    pdt = dt if pdt == "same" else pdt
    x, x2, r = (torch.randn(5, 3, D, generator=g).to(dt) for _ in range(3))
    w, b, w2, b2 = ((1 + 0.2 * torch.randn(D, generator=g)).to(pdt) for _ in range(4))
    ups = [torch.randn(5, 3, D, generator=g) for _ in range(3)]
    tensors = (x, x2, r, w, b, w2, b2)
    checked = 0
    for two, x2_given, bf, cbw, off in [(True, True, True, False, 0.0), (False, True, False, True, 1.0),
                                        (False, False, True, False, 0.0), (True, False, False, True, 0.5)]:
        for name, (fn, reads) in _forms(kind, two, x2_given, bf, cbw, off).items():
            for grad_mask in [(1,) * 7, (1, 0, 0, 0, 1, 0, 1), (0, 1, 1, 1, 0, 1, 0), (0, 0, 0, 1, 1, 1, 1)]:
                for out_mask in [(1, 1, 1), (1, 0, 0), (0, 1, 1), (0, 0, 1)]:
                    with _Use(True):
                        o1, g1 = _run(fn, reads, tensors, grad_mask, out_mask, ups)
                    assert all(type(o.grad_fn).__name__ == "CppFunction" for o in o1 if o.grad_fn is not None)
                    with _Use(False):
                        o0, g0 = _run(fn, reads, tensors, grad_mask, out_mask, ups)
                    where = (name, two, x2_given, bf, cbw, off, grad_mask, out_mask)
                    assert len(o1) == len(o0) and all(_same(a, c) for a, c in zip(o1, o0)), where
                    assert len(g1) == len(g0) and all(_same(a, c) for a, c in zip(g1, g0)), where
                    checked += 1
    assert checked == 4 * 4 * 4 * 4


def _penalty(fn, x, w):
    (gx,) = torch.autograd.grad(fn(x, w).square().sum(), x, create_graph=True)
    return torch.autograd.grad(gx.square().sum(), (x, w))


FNS = {
    "add_layer_norm": lambda x, w: addnorm.add_layer_norm(x, x.detach() * 0.5, D, w)[0],
    "layer_norm": lambda x, w: addnorm.layer_norm(x, D, w),
    "rms_norm_add": lambda x, w: addnorm.rms_norm_add(x, x.detach() * 0.5, D, w),
    "parallel_add_layer_norm": lambda x, w: addnorm.parallel_add_layer_norm(x, x * 2, x.detach(), D, w, None, w * 2)[1],
}


@pytest.mark.parametrize("op", list(FNS))
def test_create_graph_double_backward_matches(op):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, D, generator=g), 1 + 0.1 * torch.randn(D, generator=g)
    res = []
    for on in (True, False):
        with _Use(on):
            res.append(_penalty(FNS[op], x.clone().requires_grad_(), w.clone().requires_grad_()))
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    ref = _penalty(lambda x, w: _torch_ref(op, x, w), x64, w64)
    for a, c, r in zip(*res, ref):
        assert torch.equal(a, c)
        torch.testing.assert_close(a.double(), r, atol=1e-4, rtol=1e-4)


def _torch_ref(op, x, w):
    ln = torch.nn.functional.layer_norm
    if op == "add_layer_norm":
        return ln(x + x.detach() * 0.5, (D,), w)
    if op == "layer_norm":
        return ln(x, (D,), w)
    if op == "rms_norm_add":
        return x.detach() * 0.5 + torch.nn.functional.rms_norm(x, (D,), w, eps=torch.finfo(torch.float32).eps)
    return ln(x * 2 + x + x.detach(), (D,), w * 2)


@pytest.mark.parametrize("op", list(FNS))
def test_batched_gradients(op):
    """autograd.grad(..., is_grads_batched=True) runs the backward under vmap: the incoming gradients have no
    storage, so the kernels must not read them (they did: "Cannot access data pointer")."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, D, generator=g), 1 + 0.1 * torch.randn(D, generator=g)
    v = torch.randn(6, 3, D, generator=g)
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    ref = torch.autograd.grad(_torch_ref(op, xr, wr), (xr, wr), v.double(), is_grads_batched=True)
    for on in (True, False):
        with _Use(on):
            xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
            got = torch.autograd.grad(FNS[op](xg, wg), (xg, wg), v, is_grads_batched=True)
        for a, r in zip(got, ref):
            torch.testing.assert_close(a.double(), r, atol=1e-4, rtol=1e-4)


def test_forward_ad_level_opened_after_the_forward():
    """The forward ran outside any dual level (the C++ node), the backward inside one with a dual incoming
    gradient: its tangent must reach the result (the Python backward's torch ops carry it)."""
    g = torch.Generator().manual_seed(3)
    x, r, w = torch.randn(3, D, generator=g), torch.randn(3, D, generator=g), 1 + 0.1 * torch.randn(D, generator=g)
    u, tu = torch.randn(3, D, generator=g), torch.randn(3, D, generator=g)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = addnorm.layer_norm_add(xg, r, D, wg)
    with fwAD.dual_level():
        (gx,) = torch.autograd.grad(y, xg, fwAD.make_dual(u, tu))
        tangent = fwAD.unpack_dual(gx).tangent
    x64 = x.double().requires_grad_()
    y64 = r.double() + torch.nn.functional.layer_norm(x64, (D,), w.double())
    (ref,) = torch.autograd.grad(y64, x64, tu.double())  # linear in the incoming gradient
    assert tangent is not None
    torch.testing.assert_close(tangent.double(), ref, atol=1e-5, rtol=1e-5)


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_dispatch_mode_sees_the_backward_as_the_operator():
    """A dispatch mode active during backward (as a tracer's is) gets the operators, not a hidden kernel call."""
    g = torch.Generator().manual_seed(4)
    x, r = torch.randn(3, D, generator=g, requires_grad=True), torch.randn(3, D, generator=g, requires_grad=True)
    w = torch.ones(D, requires_grad=True)
    y, _ = addnorm.add_layer_norm(x, r, D, w)
    ref = torch.autograd.grad(y.sum(), (x, w), retain_graph=True)
    mode = _Count()
    with mode:
        got = torch.autograd.grad(y.sum(), (x, w))
    assert any("addnorm" in op for op in mode.ops), mode.ops
    for a, c in zip(got, ref):
        torch.testing.assert_close(a, c)


def test_saved_tensor_hooks_and_version_checks_apply():
    g = torch.Generator().manual_seed(5)
    x, r = torch.randn(3, D, generator=g), torch.randn(3, D, generator=g)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        xg = x.clone().requires_grad_()
        y = addnorm.layer_norm_add(xg, r, D)
    assert packed, "saved_tensors_hooks did not see the node's saved tensors"
    y.sum().backward()
    h = torch.randn(3, D, generator=g, requires_grad=True) * 1
    y = addnorm.layer_norm(h, D)
    h.add_(1)  # modifies a tensor the node saved
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_retain_graph_twice_and_residual_output_only():
    g = torch.Generator().manual_seed(6)
    x, r, w = torch.randn(3, D, generator=g), torch.randn(3, D, generator=g), torch.randn(D, generator=g)
    res = []
    for on in (True, False):
        with _Use(on):
            xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
            y, s = addnorm.add_layer_norm(xg, rg, D, wg)
            a = torch.autograd.grad(y.sum(), (xg, wg), retain_graph=True)
            b = torch.autograd.grad(y.sum(), (xg, wg), retain_graph=True)
            c = torch.autograd.grad(s.sum(), (xg, rg, wg), allow_unused=True)
            res.append((a, b, c))
    for one, other in zip(*res):
        assert all(_same(p, q) for p, q in zip(one, other))
    assert all(torch.equal(p, q) for p, q in zip(res[0][0], res[0][1]))


def test_large_calls_use_the_python_nodes_and_the_pool():
    """Outputs of >= MAX_NUMEL elements come from the output pool through the Python nodes."""
    n = native_nodes.MAX_NUMEL // 256 + 1
    x = torch.randn(n, 256, requires_grad=True)
    y = addnorm.layer_norm(x, 256)
    assert type(y.grad_fn).__name__ == "EagerAddNormBackward"
    small = addnorm.layer_norm(torch.randn(4, 256, requires_grad=True), 256)
    assert type(small.grad_fn).__name__ == "CppFunction"


def test_turned_off_by_the_environment():
    code = "import addnorm; from addnorm.kernels.cpu import nodes; from addnorm.ops import native_nodes as n; " \
           "print(n.NODES is None, nodes.status())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ADDNORM_CPP_NODES": "0"},
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("True turned off by ADDNORM_CPP_NODES=0"), out


@pytest.mark.parametrize("kind,dt,pdt", CASES)
def test_inference_entry_matches_the_python_path(kind, dt, pdt):
    g = torch.Generator().manual_seed(7)
    pdt = dt if pdt == "same" else pdt
    x, r = torch.randn(4, 2, D, generator=g).to(dt), torch.randn(4, 2, D, generator=g).to(dt)
    w, b = (1 + 0.2 * torch.randn(D, generator=g)).to(pdt), (0.1 * torch.randn(D, generator=g)).to(pdt)
    calls = {
        "add": lambda: (addnorm.add_rms_norm(x, r, D, w, cast_before_weight=True, weight_offset=0.5) if kind == "rms"
                        else addnorm.add_layer_norm(x, r, D, w, b, weight_offset=0.5)),
        "plain": lambda: ((addnorm.rms_norm(x, D, w),) if kind == "rms" else (addnorm.layer_norm(x, D, None, b),)),
        "no params": lambda: (addnorm.add_rms_norm(x, r, D) if kind == "rms" else addnorm.add_layer_norm(x, r, D)),
    }
    for name, call in calls.items():
        with torch.no_grad():
            with _Use(True):
                one = call()
            with _Use(False):
                other = call()
        assert all(_same(a, c) for a, c in zip(one, other)), name


@pytest.mark.parametrize("kind,dt,pdt", CASES)
def test_fused_inference_entries_match_the_python_path(kind, dt, pdt):
    g = torch.Generator().manual_seed(8)
    pdt = dt if pdt == "same" else pdt
    x, x2, r = (torch.randn(3, 5, D, generator=g).to(dt) for _ in range(3))
    w, b, w2, b2 = ((1 + 0.2 * torch.randn(D, generator=g)).to(pdt) for _ in range(4))
    tensors = (x, x2, r, w, b, w2, b2)
    for two, x2_given, bf, cbw, off in [(True, True, True, False, 0.0), (False, True, False, True, 1.0),
                                        (False, False, True, False, 0.0), (True, False, False, True, 0.5)]:
        for name, (fn, _) in _forms(kind, two, x2_given, bf, cbw, off).items():
            with torch.no_grad():
                with _Use(True):
                    one = fn(*tensors)
                with _Use(False):
                    other = fn(*tensors)
            assert len(one) == len(other) and all(_same(a, c) for a, c in zip(one, other)), (name, two, x2_given)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("which", ["x", "residual"])
def test_freed_storage_is_named(which, grad):
    calls = [lambda x, r: addnorm.add_layer_norm(x, r, 8), lambda x, r: addnorm.layer_norm_add(x, r, 8),
             lambda x, r: addnorm.parallel_add_layer_norm(x, x.detach(), r, 8)]
    for call in calls:
        x, r = torch.randn(3, 8), torch.randn(3, 8)
        (x if which == "x" else r).untyped_storage().resize_(0)
        x.requires_grad_(grad)
        # the C++ entries decline it and the general path names it, as every other path does
        with pytest.raises(RuntimeError, match=f"{which} has 24 elements but its storage has been freed"):
            call(x, r)


def test_a_build_from_another_version_is_refused_not_imported(monkeypatch):
    """A stale build (the .cpp changed, the .so did not) must never break `import addnorm`: it is refused, saying
    why, and the Python nodes run."""
    before = nodes._MODULE
    monkeypatch.setattr(nodes, "ABI", nodes.ABI + 1)
    try:
        assert "another version of addnorm" in nodes.load(native_nodes._backward, native_nodes.MAX_NUMEL)
    finally:
        monkeypatch.undo()
        assert nodes.load(native_nodes._backward, native_nodes.MAX_NUMEL, native_nodes._pool_empty,
                          native_nodes._pool.MIN_BYTES) is NODES
        assert nodes._MODULE is before


def test_non_reentrant_checkpoint_unpacks_once():
    """Every backward the C++ nodes hand to Python reads the saved tensors once: non-reentrant checkpointing (HF's
    default) refuses a second unpack, and unpack hooks (offloading) must run once per saved tensor."""
    from torch.utils.checkpoint import checkpoint

    g = torch.Generator().manual_seed(9)
    x, r, w = torch.randn(4, D, generator=g), torch.randn(4, D, generator=g), torch.randn(D, generator=g)
    for on in (True, False):
        with _Use(on):
            xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
            out = checkpoint(lambda a, c: addnorm.add_layer_norm(a, c, D, wg)[0], xg, rg, use_reentrant=False)
            (gx,) = torch.autograd.grad(out.pow(2).sum(), xg, create_graph=True)  # the Python backward
            s = checkpoint(lambda a, c: addnorm.parallel_add_rms_norm(a, None, c, D, wg)[2], xg, rg,
                           use_reentrant=False)
            s.sum().backward()  # only the stream used: the Python backward
            counts = {"pack": 0, "unpack": 0}

            def pack(t):
                counts["pack"] += 1
                return t

            def unpack(t):
                counts["unpack"] += 1
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                y, s = addnorm.add_rms_norm(xg, rg, D, wg)
            s.sum().backward()
            assert counts["unpack"] == counts["pack"] > 0, (on, counts)


def test_storage_freed_between_forward_and_backward_is_named():
    g = torch.Generator().manual_seed(10)
    x, w = torch.randn(4, D, generator=g, requires_grad=True), torch.nn.Parameter(torch.randn(D, generator=g))
    y = addnorm.rms_norm(x, D, w)
    w.untyped_storage().resize_(0)  # an FSDP-style reshard that is not undone before backward
    with pytest.raises(ValueError, match="no storage"):
        torch.autograd.grad(y.sum(), x)
    r = torch.randn(4, D, generator=g, requires_grad=True)
    y, s = addnorm.add_layer_norm(x, r, D)
    dres = torch.ones(4, D)
    dres.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="no storage"):
        torch.autograd.backward([y, s], [torch.ones(4, D), dres])


class _Sub(torch.Tensor):
    pass


def test_subclass_incoming_gradient_keeps_its_type_as_the_python_nodes_do():
    g = torch.Generator().manual_seed(11)
    x, r, w = torch.randn(3, D, generator=g), torch.randn(3, D, generator=g), torch.randn(D, generator=g)
    up = torch.randn(3, D, generator=g).as_subclass(_Sub)
    res = []
    for on in (True, False):
        with _Use(on):
            xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
            res.append(torch.autograd.grad(addnorm.rms_norm_add(xg, r, D, wg), (xg, wg), up))
    for a, c in zip(*res):
        assert type(a) is type(c)
        torch.testing.assert_close(a.as_subclass(torch.Tensor), c.as_subclass(torch.Tensor), rtol=0, atol=0)


def test_modules_and_the_hf_convention_reach_the_nodes():
    """The modules pass normalized_shape as a tuple and HF's patch passes out_dtype = the input's dtype: both are
    the fast path's call (they had taken the general path, with its Python autograd node)."""
    from addnorm.nn import AddLayerNorm

    m = AddLayerNorm(D)
    x, r = torch.randn(3, D, requires_grad=True), torch.randn(3, D)
    y, s = m(x, r)
    assert type(y.grad_fn).__name__ == "CppFunction"
    y2, _ = addnorm.add_rms_norm(x, r, (D,), out_dtype=torch.float32)
    assert type(y2.grad_fn).__name__ == "CppFunction"
    with _Use(False):
        y0, s0 = m(x, r)
    assert type(y0.grad_fn).__name__ != "CppFunction"
    assert torch.equal(y, y0) and torch.equal(s, s0)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x + r, (D,)))


def test_unpack_hook_handing_back_another_layout():
    """An unpack hook may return a saved tensor in another memory layout (same values): the kernels read rows, so
    the backward makes it contiguous first (it read the transposed strides as rows)."""
    g = torch.Generator().manual_seed(12)
    x, r, w = torch.randn(6, D, generator=g), torch.randn(6, D, generator=g), torch.randn(D, generator=g)

    def relayout(t):
        return t.t().contiguous().t() if t.dim() == 2 else t

    for on in (True, False):
        with _Use(on):
            res = []
            for hooks in (False, True):
                xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t, relayout if hooks else (lambda t: t)):
                    y, s = addnorm.add_layer_norm(xg, rg, D, wg)
                    o = addnorm.layer_norm_add(xg, rg, D, wg)
                    p = addnorm.parallel_add_layer_norm(xg, None, rg, D, wg)[0]
                res.append(torch.autograd.grad((y.sum() + s.square().sum() + o.square().sum() + p.square().sum()),
                                               (xg, rg, wg)))
            for a, c in zip(*res):
                assert torch.equal(a, c), on


def _set_pointwise(on):
    import addnorm.functional.pointwise as P

    P._NODES = NODES if on else None


class _UsePW(_Use):
    def __enter__(self):
        super().__enter__()
        _set_pointwise(self.on)

    def __exit__(self, *exc):
        super().__exit__(*exc)
        _set_pointwise(True)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.float16])
def test_pointwise_inference_entry_matches_the_python_path(dt):
    """DyT / Derf inference through the C++ entry: the same bits as the Python path, alpha and shift read as
    float32 whatever their dtype."""
    from addnorm.functional import add_derf, add_dyt

    g = torch.Generator().manual_seed(13)
    x, r = torch.randn(4, 3, D, generator=g).to(dt), torch.randn(4, 3, D, generator=g).to(dt)
    w, b = (1 + 0.2 * torch.randn(D, generator=g)).to(dt), (0.1 * torch.randn(D, generator=g)).to(torch.float32)
    cases = [
        lambda a, s: add_dyt(x, r, a, w, b), lambda a, s: add_dyt(x, None, a), lambda a, s: add_derf(x, r, a, s, w),
        lambda a, s: add_derf(x, None, a, None, None, b),
    ]
    for adt in (torch.float32, torch.float64, torch.bfloat16):
        a, sh = torch.tensor(0.73, dtype=adt), torch.tensor(-0.21, dtype=adt)
        for k, call in enumerate(cases):
            with torch.no_grad():
                with _UsePW(True):
                    one = call(a, sh)
                with _UsePW(False):
                    other = call(a, sh)
            assert all(_same(p, q) for p, q in zip(one, other)), (k, adt)
            assert one[1] is x or k % 2 == 0  # no residual: the stream is x itself


@pytest.mark.parametrize("kind", ["dyt", "derf"])
@pytest.mark.parametrize("dt,pdt", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.bfloat16, torch.float32), (torch.float16, torch.float64)])
def test_pointwise_node_matches_the_python_node_bit_for_bit(kind, dt, pdt):
    """DyT / Derf with the add: the C++ node against the Python node (PointwiseNorm), outputs and gradients to the
    bit, for which inputs need gradients (x, residual, alpha, shift, weight, bias) and which outputs are used."""
    from addnorm.functional import add_derf, add_dyt

    g = torch.Generator().manual_seed(14)
    x, r = torch.randn(5, 2, D, generator=g).to(dt), torch.randn(5, 2, D, generator=g).to(dt)
    w, b = (1 + 0.2 * torch.randn(D, generator=g)).to(pdt), (0.1 * torch.randn(D, generator=g)).to(pdt)
    a, sh = torch.tensor(0.6, dtype=pdt), torch.tensor(-0.2, dtype=pdt)
    ups = [torch.randn(5, 2, D, generator=g).to(dt) for _ in range(2)]

    def call(x, r, a, sh, w, b, has_res, has_shift, has_params):
        r = r if has_res else None
        p = (w, b) if has_params else (None, None)
        if kind == "dyt":
            return add_dyt(x, r, a, *p)
        return add_derf(x, r, a, sh if has_shift else None, *p)

    for has_res, has_shift, has_params in itertools.product((True, False), repeat=3):
        for grad_mask in [(1,) * 6, (1, 0, 1, 0, 1, 0), (0, 1, 0, 1, 0, 1), (0, 0, 1, 1, 1, 1)]:
            for out_mask in [(1, 1), (1, 0), (0, 1)]:
                res = []
                for on in (True, False):
                    with _UsePW(on):
                        ins = [t.clone().requires_grad_(bool(m)) for t, m in zip((x, r, a, sh, w, b), grad_mask)]
                        outs = call(*ins, has_res, has_shift, has_params)
                        if on and pdt is not torch.float64:  # float64 parameters: torch ops, the Python node
                            assert outs[0].grad_fn is None or type(outs[0].grad_fn).__name__ == "CppFunction"
                        used = [(o, u) for o, u, m in zip(outs, ups, out_mask) if m and o.requires_grad]
                        wrt = [t for t in ins if t.requires_grad]
                        grads = (torch.autograd.grad([o for o, _ in used], wrt, [u for _, u in used], allow_unused=True)
                                 if used and wrt else ())
                        res.append((outs, grads))
                (o1, g1), (o0, g0) = res
                where = (has_res, has_shift, has_params, grad_mask, out_mask)
                assert all(_same(p, q) for p, q in zip(o1, o0)), where
                assert len(g1) == len(g0) and all(_same(p, q) for p, q in zip(g1, g0)), where


@pytest.mark.parametrize("kind", ["dyt", "derf"])
def test_pointwise_node_hands_double_backward_and_batched_gradients_to_python(kind):
    from addnorm.functional import add_derf, add_dyt

    g = torch.Generator().manual_seed(15)
    x0, r0 = torch.randn(3, D, generator=g), torch.randn(3, D, generator=g)
    a0 = torch.tensor(0.7)
    fn = (lambda x, r, a: add_dyt(x, r, a)[0]) if kind == "dyt" else (lambda x, r, a: add_derf(x, r, a, None)[0])
    res = []
    for on in (True, False):
        with _UsePW(on):
            x, a = x0.clone().requires_grad_(), a0.clone().requires_grad_()
            (gx,) = torch.autograd.grad(fn(x, r0, a).square().sum(), x, create_graph=True)
            hv = torch.autograd.grad(gx.square().sum(), (x, a))
            v = torch.randn(4, 3, D, generator=torch.Generator().manual_seed(16))
            gb = torch.autograd.grad(fn(x, r0, a), (x, a), v, is_grads_batched=True)
            res.append((*hv, *gb))
    for p, q in zip(*res):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def test_review_round_two_cases():
    """From the second review of the fast entries: each had crashed, errored or differed."""
    from addnorm.functional import add_derf, add_dyt

    # rows of zero elements: DyT/Derf crashed the process (SIGFPE, N = numel / 0); now the general path's answer
    for fn in (lambda x: add_dyt(x, None, torch.tensor(0.5)), lambda x: add_derf(x, x.clone(), torch.tensor(0.5), None)):
        for grad in (False, True):
            y, s = fn(torch.randn(3, 0, requires_grad=grad))
            assert y.shape == (3, 0)
    # a default-device context (meta) must not move the CPU kernels' scratch tensors off the CPU
    x, w = torch.randn(2, 64, requires_grad=True), torch.randn(64)
    big = torch.randn(native_nodes.MAX_NUMEL // 64 + 1, 64, requires_grad=True)
    with torch.device("meta"):
        for shape in (64, (64,), [64]):
            addnorm.layer_norm(x, shape, w).sum().backward()
            addnorm.layer_norm_add(x.detach(), x.detach(), shape, w)
            addnorm.parallel_add_rms_norm(x.detach(), None, x.detach(), shape, w)
        addnorm.layer_norm(big, 64, w).sum().backward()  # the Python node and the output pool
    # [D] takes the same node as (D,) and D
    names = {type(addnorm.layer_norm(x, s, w).grad_fn).__name__ for s in (64, (64,), [64], torch.Size([64]))}
    assert names == {"CppFunction"}, names
    # bad option types are named by the general path, not by the C++ entry's argument conversion
    with pytest.raises(TypeError):
        addnorm.add_rms_norm(x, x.detach(), 64, w, cast_before_weight=torch.ones(2))
    with pytest.raises((TypeError, ValueError), match="backend"):
        addnorm.layer_norm(x, 64, w, backend=["cpu"])
