"""The widened stream's C++ autograd nodes (``kernels/cpu/autograd_nodes.cpp``: ``MhcPreNode`` behind
``functional.mhc.mhc_pre``, ``MhcWritePreNode`` behind ``functional.mhc.mhc_write_pre``, ``StreamWriteNode`` behind
``functional.stream.stream_write``) against the Python nodes they stand in front of (``DirectMhcPre``,
``DirectMhcWritePre``, ``DirectStreamWrite``): the same outputs and gradients, to the bit and in
the same dtypes and shapes, for every dtype, convention, phi layout, which inputs need a gradient and which outputs
are used; and every backward but the plain one (create_graph, batched gradients, a forward-AD level, a dispatch
mode, a gradient in another dtype) answered as the Python node answers it."""

import itertools

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import addnorm.functional as AF
from addnorm.functional import MhcConvention, last_backend
from addnorm.functional import mhc as M
from addnorm.kernels.cpu import nodes
from addnorm.ops import native_nodes
from tests.ops.test_native_nodes import _Count  # a dispatch mode that lists the operators it sees

pytestmark = pytest.mark.skipif(native_nodes.NODES is None, reason=(
    f"the C++ nodes are not loaded here: {nodes.status()}; make setup builds them, CI runs these"))

N, C = 4, 40
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CONVENTIONS = {"paper": None, "deepseek_v4": MhcConvention.deepseek_v4(1e-6),
               "groups2": MhcConvention(groups=2, pre_eps=1e-3, post_scale=2.5), "groups1": MhcConvention(groups=1)}
NAMES = ("x", "phi", "a_pre", "a_post", "a_res", "b_pre", "b_post", "b_res")


class _Python:
    """Calls inside take the Python nodes (the C++ entries are not asked)."""

    def __enter__(self):
        self.saved, M.NODES = M.NODES, None

    def __exit__(self, *exc):
        M.NODES = self.saved


def _pre_inputs(dt, conv, lead=(3, 5), layout="contiguous", seed=0):
    g = torch.Generator().manual_seed(seed)
    groups = 3 if conv is None else conv.groups
    r = N * N if groups == 3 else 0
    m = N if groups == 1 else 2 * N + r
    x = torch.randn(*lead, N, C, generator=g).to(dt)
    w = torch.randn(m, N * C, generator=g) * 0.05  # a model's (m, nC) weight
    phi = {"contiguous": w.t().contiguous(), "weight_view": w.t(), "bfloat16": w.t().contiguous().bfloat16()}[layout]
    coeffs = [torch.tensor(0.8), torch.tensor([0.6]), torch.tensor(1.1), 0.5 * torch.randn(N, generator=g),
              0.5 * torch.randn(N if groups > 1 else 0, generator=g),
              0.5 * torch.randn(N, N, generator=g) if groups == 3 else torch.zeros(0)]
    return [x, phi, *coeffs]


def _pre_run(ins, conv, want, used, seed=1):
    """mhc_pre's outputs, and the gradients of the used outputs (against fixed random upstream gradients) with
    respect to the inputs in ``want``."""
    ts = [t.clone().requires_grad_(i in want) for i, t in enumerate(ins)]
    outs = AF.mhc_pre(*ts, convention=conv, iters=7)
    g = torch.Generator().manual_seed(seed)
    ups = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
    pairs = [(o, u) for k, (o, u) in enumerate(zip(outs, ups)) if k in used and o.numel()]
    wrt = [ts[i] for i in want]
    if not wrt or not pairs:
        return outs, ()
    return outs, torch.autograd.grad([o for o, _ in pairs], wrt, [u for _, u in pairs], allow_unused=True)


def _same(a, b, what):
    if a is None or b is None:
        assert a is None and b is None, what
        return
    assert (a.dtype, a.shape) == (b.dtype, b.shape), what
    assert torch.equal(a, b), (what, (a.float() - b.float()).abs().max())


def _both(fn):
    got = fn()
    assert last_backend() == "cpu"
    with _Python():
        want = fn()
    return got, want


@pytest.mark.parametrize("dt,conv", list(itertools.product(DTYPES, CONVENTIONS)))
def test_mhc_pre_node_matches_the_python_node_bit_for_bit(dt, conv):
    convention = CONVENTIONS[conv]
    ins = _pre_inputs(dt, convention)
    for want, used in (((0, 1, 2, 3, 4, 5, 6, 7), (0, 1, 2, 3)), ((0,), (0,)), ((1,), (0, 1)), ((2, 5), (1,)),
                       ((0, 4, 7), (3,)), ((1, 3, 6), (2,))):
        (outs, grads), (outs_py, grads_py) = _both(lambda: _pre_run(ins, convention, want, used))
        assert type(outs[0].grad_fn).__name__ == "CppFunction"
        assert type(outs_py[0].grad_fn).__name__ == "DirectMhcPreBackward"
        for k, (a, b) in enumerate(zip(outs, outs_py, strict=True)):
            _same(a, b, f"output {k}")
        assert len(grads) == len(grads_py)
        for i, a, b in zip(want, grads, grads_py):
            _same(a, b, f"d{NAMES[i]} (want {want}, used {used})")


def _perms(n):
    return torch.stack([torch.eye(n)[list(p)] for p in itertools.permutations(range(n))])


@pytest.mark.parametrize("dt", DTYPES)
def test_mhc_lite_node_matches_the_python_node_bit_for_bit(dt):
    """mHC-lite: H_res mixes the n! permutation matrices (the node reads them as the kernels' index table)."""
    g = torch.Generator().manual_seed(3)
    x, phi, *coeffs = _pre_inputs(dt, None)
    phi = torch.randn(N * C, 2 * N + 24, generator=g) * 0.05
    ins = [x, phi, *coeffs[:5], torch.randn(24, generator=g)]
    perms = _perms(N)[torch.randperm(24, generator=g)]
    _lite_matches_python(AF.mhc_pre, ins, perms, (((0, 1, 2, 3, 4, 5, 6, 7), (0, 1, 2, 3)), ((4, 7), (3,)),
                                                  ((0,), (0, 3))), 0, "mHC-lite")


def _lite_matches_python(op, ins, perms, cases, node_out, what):
    """op(*ins, perms=perms) through the C++ node (its output ``node_out`` made by it) against the Python node, to
    the bit: outputs and gradients for each (inputs wanted, outputs used) of ``cases``, then the inference entry."""

    def run(want, used):
        ts = [t.clone().requires_grad_(i in want) for i, t in enumerate(ins)]
        outs = op(*ts, perms=perms)
        ups = [torch.randn(o.shape, generator=torch.Generator().manual_seed(4)).to(o.dtype) for o in outs]
        pairs = [(o, u) for k, (o, u) in enumerate(zip(outs, ups)) if k in used]
        return outs, torch.autograd.grad([o for o, _ in pairs], [ts[i] for i in want], [u for _, u in pairs])

    for want, used in cases:
        (outs, grads), (outs_py, grads_py) = _both(lambda: run(want, used))
        assert type(outs[node_out].grad_fn).__name__ == "CppFunction"
        for k, (a, b) in enumerate(zip((*outs, *grads), (*outs_py, *grads_py))):
            _same(a, b, f"{what} {k} (want {want}, used {used})")
    with torch.no_grad():  # the inference entry takes it too
        got, want = _both(lambda: op(*ins, perms=perms))
    for a, b in zip(got, want):
        _same(a, b, f"{what} inference")


@pytest.mark.parametrize("layout", ["weight_view", "bfloat16"])
def test_mhc_pre_node_reads_phi_as_it_lies(layout):
    ins = _pre_inputs(torch.float32, None, layout=layout)
    (outs, grads), (outs_py, grads_py) = _both(lambda: _pre_run(ins, None, tuple(range(8)), (0, 1, 2, 3)))
    for a, b in zip((*outs, *grads), (*outs_py, *grads_py)):
        _same(a, b, layout)
    assert grads[1].dtype == ins[1].dtype


def _write_inputs(dt, lead=(3, 7), pdt=torch.float32, seed=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*lead, N, 33, generator=g).to(dt), torch.randn(*lead, 33, generator=g).to(dt),
            (torch.rand(*lead, N, generator=g) * 2).to(pdt), torch.rand(*lead, N, N, generator=g).to(pdt)]


def _write_run(ins, want, use_q, seed=3):
    ts = [t.clone().requires_grad_(i in want) for i, t in enumerate(ins)]
    x2, q = AF.stream_write(*ts)
    g = torch.Generator().manual_seed(seed)
    outs, ups = [x2], [torch.randn(x2.shape, generator=g).to(x2.dtype)]
    if use_q:
        outs.append(q)
        ups.append(torch.randn(q.shape, generator=g))
    return (x2, q), torch.autograd.grad(outs, [ts[i] for i in want], ups, allow_unused=True)


@pytest.mark.parametrize("dt,pdt", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                    (torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_stream_write_node_matches_the_python_node_bit_for_bit(dt, pdt):
    ins = _write_inputs(dt, pdt=pdt)
    for want, use_q in (((0, 1, 2, 3), False), ((0, 1, 2, 3), True), ((0,), False), ((2, 3), True), ((1,), False)):
        (outs, grads), (outs_py, grads_py) = _both(lambda: _write_run(ins, want, use_q))
        assert type(outs[0].grad_fn).__name__ == "CppFunction"
        assert type(outs_py[0].grad_fn).__name__ == "DirectStreamWriteBackward"
        for a, b in zip((*outs, *grads), (*outs_py, *grads_py)):
            _same(a, b, f"{want} q={use_q}")


WP_NAMES = ("x", "y", "w_post", "w_res", *NAMES[1:])


def _write_pre_inputs(dt, conv, mixing=True, lead=(3, 5), pdt=torch.float32, seed=6):
    g = torch.Generator().manual_seed(seed)
    x, phi, *coeffs = _pre_inputs(dt, conv, lead=lead, seed=seed)
    y = torch.randn(*lead, C, generator=g).to(dt)
    w_post = (torch.rand(*lead, N, generator=g) * 2).to(pdt)
    w_res = torch.rand(*lead, N, N, generator=g).to(pdt) if mixing else None
    return [x, y, w_post, w_res, phi, *coeffs]


def _write_pre_run(ins, conv, want, used, products=False, seed=7):
    """mhc_write_pre's outputs (X', h, H_pre, H_post, H_res), and the gradients of the used outputs with respect to
    the inputs in ``want``."""
    ts = [None if t is None else t.clone().requires_grad_(i in want) for i, t in enumerate(ins)]
    outs = AF.mhc_write_pre(*ts, convention=conv, iters=6, products=products)
    g = torch.Generator().manual_seed(seed)
    ups = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
    pairs = [(o, u) for k, (o, u) in enumerate(zip(outs, ups)) if k in used and o.numel()]
    wrt = [ts[i] for i in want if ts[i] is not None]
    if not wrt or not pairs:
        return outs, ()
    return outs, torch.autograd.grad([o for o, _ in pairs], wrt, [u for _, u in pairs], allow_unused=True)


@pytest.mark.parametrize("dt,conv", list(itertools.product(DTYPES, CONVENTIONS)))
def test_mhc_write_pre_node_matches_the_python_node_bit_for_bit(dt, conv):
    """The node keeps Sinkhorn-Knopp's rounds from its forward; the Python node's backward recomputes them: the same
    bits either way, with and without a mixing matrix, for every set of inputs and outputs used."""
    convention = CONVENTIONS[conv]
    for mixing in (True, False):
        ins = _write_pre_inputs(dt, convention, mixing)
        for want, used in ((tuple(range(11)), (0, 1, 2, 3, 4)), ((0,), (0,)), ((0, 1), (1,)), ((4, 2), (1, 4)),
                           ((3, 7, 10), (0, 3)), ((1, 5, 8), (2,)), ((0, 2), (0, 1))):
            (outs, grads), (outs_py, grads_py) = _both(lambda: _write_pre_run(ins, convention, want, used))
            assert type(outs[1].grad_fn).__name__ == "CppFunction"
            assert type(outs_py[1].grad_fn).__name__ == "DirectMhcWritePreBackward"
            for k, (a, b) in enumerate(zip(outs, outs_py, strict=True)):
                _same(a, b, f"output {k}")
            assert len(grads) == len(grads_py)
            for i, a, b in zip([i for i in want if ins[i] is not None], grads, grads_py):
                _same(a, b, f"d{WP_NAMES[i]} (want {want}, used {used}, mixing {mixing})")


@pytest.mark.parametrize("dt", DTYPES)
def test_mhc_lite_write_pre_node_matches_the_python_node_bit_for_bit(dt):
    """mHC-lite's read after a write (its permutations as the kernels' index table; no rounds to keep)."""
    g = torch.Generator().manual_seed(9)
    x, y, w_post, w_res, _, *coeffs = _write_pre_inputs(dt, None)
    phi = torch.randn(N * C, 2 * N + 24, generator=g) * 0.05
    ins = [x, y, w_post, w_res, phi, *coeffs[:5], torch.randn(24, generator=g)]
    perms = _perms(N)[torch.randperm(24, generator=g)]
    _lite_matches_python(AF.mhc_write_pre, ins, perms, ((tuple(range(11)), (0, 1, 2, 3, 4)), ((0, 10), (1, 4)),
                                                        ((4, 1), (0, 2))), 1, "mHC-lite write+read")


def test_mhc_write_pre_node_products_and_coefficient_dtypes():
    """Each H_post[i] y rounded first (no mixing matrix, a bfloat16 stream), and bfloat16 coefficients."""
    for products, pdt in ((True, torch.float32), (True, torch.bfloat16), (False, torch.bfloat16)):
        ins = _write_pre_inputs(torch.bfloat16, None, mixing=not products, pdt=pdt)
        (outs, grads), (outs_py, grads_py) = _both(
            lambda: _write_pre_run(ins, None, tuple(range(11)), (0, 1, 2, 3, 4), products=products))
        assert type(outs[1].grad_fn).__name__ == "CppFunction"
        for a, b in zip((*outs, *grads), (*outs_py, *grads_py)):
            _same(a, b, f"products={products} {pdt}")


def test_mhc_write_pre_backward_keeps_a_float32_nan_a_nan_in_bfloat16():
    """The fused backward's gradient of X' is float32 arithmetic on float32 operands (here H_pre's gradient): a NaN
    whose low half is not zero (0x7fffffff) must round to a bfloat16 NaN in dX and dy, not carry into -0 as the
    rounding without the NaN test does. It gave zeros before the kernel checked that gradient too."""
    x, y, w_post, w_res, phi, *coeffs = _write_pre_inputs(torch.bfloat16, None, lead=(2, 3))
    ts = [t.clone().requires_grad_() for t in (x, y, w_post, w_res, phi)]
    outs = AF.mhc_write_pre(*ts, *coeffs, iters=5)
    assert type(outs[1].grad_fn).__name__ == "CppFunction"
    dpre = torch.zeros(outs[2].shape)
    dpre[0, 1, 2] = torch.tensor([0x7FFFFFFF], dtype=torch.int32).view(torch.float32)[0]
    dx, dy = torch.autograd.grad(outs[2], ts[:2], dpre)
    assert dx[0, 1].float().isnan().all() and dy[0, 1].float().isnan().all()
    assert not dx[1].float().isnan().any()  # the other tokens' rows are untouched


def test_mhc_write_pre_node_hands_other_backwards_to_python():
    """create_graph, batched gradients and a dispatch mode take MhcWritePre's backward through the fallback."""
    ins = _write_pre_inputs(torch.float32, None, lead=(2,))

    def penalty():
        ts = [t.clone().requires_grad_() for t in ins]
        outs = AF.mhc_write_pre(*ts, iters=5)
        loss = sum((o * (k + 1)).square().sum() for k, o in enumerate(outs))
        gs = torch.autograd.grad(loss, ts, create_graph=True)
        return torch.autograd.grad(sum(g.square().sum() for g in gs), ts, allow_unused=True)

    for a, b in zip(*_both(penalty)):
        _same(a, b, "write+read double backward")
    v = torch.randn(3, 2, C, generator=torch.Generator().manual_seed(8))
    res = []
    for py in (False, True):
        ts = [t.clone().requires_grad_() for t in ins]
        with _Python() if py else torch.enable_grad():
            res.append(torch.autograd.grad(AF.mhc_write_pre(*ts, iters=5)[1], ts, v, is_grads_batched=True))
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    fn = lambda ts: AF.mhc_write_pre(*ts, iters=5)[1]  # noqa: E731
    ops, grads = _dispatched(fn, ins)
    with _Python():
        ops_py, grads_py = _dispatched(fn, ins)
    assert ops and ops == ops_py
    for a, b in zip(grads, grads_py):
        _same(a, b, "write+read under a dispatch mode")
    packed = []
    ts = [t.clone().requires_grad_() for t in ins]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        outs = AF.mhc_write_pre(*ts, iters=5)
    assert len(packed) >= 15  # the inputs, X', p, rstd and the kept rounds
    sum(o.sum() for o in outs).backward()
    x = ts[0] * 1
    h = AF.mhc_write_pre(x, *ts[1:], iters=5)[1]
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.sum().backward()


def test_the_entries_decline_what_the_python_path_answers():
    """Outside the plain call the Python node answers (and names what is wrong): matrices in perms that are not
    permutations (the formulas mix them), perms with a convention that changes Sinkhorn-Knopp, float64, a read with
    the write before it (mhc_write_pre)."""
    x, phi, *coeffs = _pre_inputs(torch.float32, None)
    x = x.requires_grad_()
    lite_phi = torch.randn(N * C, 2 * N + 24, requires_grad=True)
    mixed = _perms(N) * 0.5 + _perms(N).flip(0) * 0.5  # doubly stochastic, not permutations
    h = AF.mhc_pre(x, lite_phi, *coeffs[:5], torch.zeros(24), perms=mixed)[0]
    assert type(h.grad_fn).__name__ == "DirectMhcPreBackward"  # the Python node, whose kernel choice takes the formulas
    with pytest.raises(ValueError, match="perms"):
        AF.mhc_pre(x, lite_phi, *coeffs[:5], torch.zeros(24), perms=_perms(N),
                   convention=MhcConvention.deepseek_v4(1e-6))
    h = AF.mhc_pre(x.double(), phi.double(), *coeffs)[0]
    assert "Direct" not in type(h.grad_fn).__name__ and type(h.grad_fn).__name__ != "CppFunction"
    y = torch.randn(3, 5, C, requires_grad=True)
    hp, hr = torch.rand(3, 5, N), torch.rand(3, 5, N, N)
    out = AF.mhc_write_pre(x.double(), y.double(), hp, hr, phi.double(), *coeffs)
    assert type(out[1].grad_fn).__name__ != "CppFunction"
    out = AF.mhc_write_pre(x, y, hp.double(), hr, phi, *coeffs)  # float64 coefficients: the formulas
    assert type(out[1].grad_fn).__name__ != "CppFunction"
    with pytest.raises(TypeError, match="y dtype"):
        AF.stream_write(x, y.double(), hp, hr)


def _penalty_pre(ins, create_graph=True):
    """A gradient penalty: the gradients of mhc_pre's outputs, differentiated again."""
    ts = [t.clone().requires_grad_() for t in ins]
    outs = AF.mhc_pre(*ts, iters=5)
    loss = sum((o.float() * (k + 1)).square().sum() for k, o in enumerate(outs))
    gs = torch.autograd.grad(loss, ts, create_graph=create_graph)
    return torch.autograd.grad(sum(g.float().square().sum() for g in gs), ts, allow_unused=True)


def test_double_backward_goes_to_the_python_backward():
    ins = _pre_inputs(torch.float32, None, lead=(2,))
    got = _penalty_pre(ins)
    with _Python():
        want = _penalty_pre(ins)
    for a, b in zip(got, want):
        _same(a, b, "double backward")
    ws = _write_inputs(torch.float32, lead=(2,))

    def penalty():
        ts = [t.clone().requires_grad_() for t in ws]
        x2, q = AF.stream_write(*ts)
        gs = torch.autograd.grad(x2.square().sum() + q.sum(), ts, create_graph=True)
        return torch.autograd.grad(sum(g.square().sum() for g in gs), ts, allow_unused=True)

    got = penalty()
    with _Python():
        want = penalty()
    for a, b in zip(got, want):
        _same(a, b, "write double backward")


def test_batched_gradients_go_to_the_python_backward():
    """is_grads_batched runs the backward under vmap: incoming gradients without storage, which the kernels must
    not read."""
    ins = _pre_inputs(torch.float32, None, lead=(2,))
    g = torch.Generator().manual_seed(4)
    v = torch.randn(3, 2, C, generator=g)
    res = []
    for py in (False, True):
        ts = [t.clone().requires_grad_() for t in ins]
        with _Python() if py else torch.enable_grad():
            h = AF.mhc_pre(*ts, iters=5)[0]
            res.append(torch.autograd.grad(h, ts[:2], v, is_grads_batched=True))
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    ws = _write_inputs(torch.float32, lead=(2,))
    vw = torch.randn(3, 2, N, 33, generator=g)
    res = []
    for py in (False, True):
        ts = [t.clone().requires_grad_() for t in ws]
        with _Python() if py else torch.enable_grad():
            res.append(torch.autograd.grad(AF.stream_write(*ts)[0], ts, vw, is_grads_batched=True))
    for a, b in zip(*res):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_forward_ad_level_opened_after_the_forward():
    """The forward ran outside any dual level (the C++ node), the backward inside one with a dual incoming
    gradient: its tangent reaches the result, as through the Python node."""
    ins = _pre_inputs(torch.float32, None, lead=(2,))
    g = torch.Generator().manual_seed(5)
    u, tu = torch.randn(2, C, generator=g), torch.randn(2, C, generator=g)
    res = []
    for py in (False, True):
        ts = [t.clone().requires_grad_() for t in ins]
        with _Python() if py else torch.enable_grad():
            h = AF.mhc_pre(*ts, iters=5)[0]
            with fwAD.dual_level():
                (gx,) = torch.autograd.grad(h, ts[0], fwAD.make_dual(u, tu))
                res.append(fwAD.unpack_dual(gx).tangent)
    assert res[0] is not None
    torch.testing.assert_close(res[0], res[1], atol=1e-6, rtol=1e-5)


def _dispatched(fn, ins):
    """The operators a dispatch mode sees in fn's backward, and its gradients."""
    ts = [t.clone().requires_grad_() for t in ins]
    out = fn(ts)
    mode = _Count()
    with mode:
        grads = torch.autograd.grad(out.sum(), ts)
    return mode.ops, grads


def test_a_dispatch_mode_sees_the_backward_as_the_python_node_runs_it():
    """A dispatch mode active during backward gets what the Python node's backward runs, op for op."""
    for fn, ins in ((lambda ts: AF.mhc_pre(*ts, iters=5)[0], _pre_inputs(torch.float32, None, lead=(2,))),
                    (lambda ts: AF.stream_write(*ts)[0], _write_inputs(torch.float32, lead=(2,)))):
        ops, grads = _dispatched(fn, ins)
        with _Python():
            ops_py, grads_py = _dispatched(fn, ins)
        assert ops and ops == ops_py
        for a, b in zip(grads, grads_py):
            _same(a, b, "under a dispatch mode")


def test_a_gradient_in_another_dtype_and_saved_tensor_hooks():
    """A bfloat16 stream's h handed a float32 gradient (autograd casts it to h's dtype for either node); the node's
    saved tensors go through saved_tensors_hooks, and a saved tensor modified in place is refused."""
    ins = _pre_inputs(torch.bfloat16, None, lead=(2,))
    res = []
    for py in (False, True):
        ts = [t.clone().requires_grad_() for t in ins]
        with _Python() if py else torch.enable_grad():
            h = AF.mhc_pre(*ts, iters=5)[0]
            res.append(torch.autograd.grad(h, ts, torch.ones(h.shape), allow_unused=True))
    for a, b in zip(*res):
        _same(a, b, "float32 gradient of a bfloat16 h")
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        ts = [t.clone().requires_grad_() for t in _pre_inputs(torch.float32, None, lead=(2,))]
        h = AF.mhc_pre(*ts, iters=5)[0]
    assert len(packed) >= 11  # x, phi, the six coefficients, p, rstd and the kept rounds
    h.sum().backward()
    ts = [t.clone().requires_grad_() for t in _pre_inputs(torch.float32, None, lead=(2,))]
    x = ts[0] * 1
    h = AF.mhc_pre(x, *ts[1:], iters=5)[0]
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        h.sum().backward()


def test_retain_graph_twice_and_the_model_reaches_the_nodes():
    from addnorm.model import GPTConfig
    from addnorm.model.block import TransformerBlock

    ts = [t.clone().requires_grad_() for t in _pre_inputs(torch.float32, None, lead=(2,))]
    h = AF.mhc_pre(*ts, iters=5)[0]
    a = torch.autograd.grad(h.sum(), ts, retain_graph=True)
    b = torch.autograd.grad(h.sum(), ts)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    torch.manual_seed(0)
    block = TransformerBlock(GPTConfig(placement="mhc", n_streams=4, n_embd=64, n_head=4), layer_idx=1)
    x = torch.randn(2, 8, 4, 64, requires_grad=True)
    seen = set()

    def walk(fn):
        if fn is None or fn in seen:
            return
        seen.add(fn)
        for nxt, _ in fn.next_functions:
            walk(nxt)

    walk(block(x).grad_fn)
    assert sum(type(f).__name__ == "CppFunction" for f in seen) >= 4  # two reads and two writes
    assert not any(type(f).__name__ in ("DirectMhcPreBackward", "DirectStreamWriteBackward") for f in seen)


@pytest.mark.parametrize("conv", ["paper", "deepseek_v4"])
def test_batched_gradients_through_h_res_and_h_post(conv):
    """A batch of gradients (is_grads_batched: vmap over the backward) reaching the read through H_post and H_res --
    a sub-layer's write uses both -- is each gradient's own backward, through either node. It raised before: the
    formulas' backward flattened H_res's gradient with a view vmap has no batching rule for."""
    convention = CONVENTIONS[conv]
    ins = _pre_inputs(torch.float32, convention, lead=(2,))
    g = torch.Generator().manual_seed(9)
    ups = [torch.randn(3, 2, C, generator=g), torch.randn(3, 2, N, generator=g), torch.randn(3, 2, N, N, generator=g)]
    for py in (False, True):
        ts = [t.clone().requires_grad_() for t in ins]
        with _Python() if py else torch.enable_grad():
            h, _, h_post, h_res = AF.mhc_pre(*ts, convention=convention, iters=5)
            outs = (h, h_post, h_res)
            batched = torch.autograd.grad(outs, ts[:2], ups, is_grads_batched=True, retain_graph=True)
            for k in range(3):
                one = torch.autograd.grad(outs, ts[:2], [u[k] for u in ups], retain_graph=True)
                for a, b in zip(batched, one):
                    torch.testing.assert_close(a[k], b, atol=1e-5, rtol=1e-5)


def test_large_calls_take_the_nodes_with_outputs_from_the_pool():
    """The widened stream's nodes take every size: their outputs of the output pool's size or more come from it
    (recycled memory, faulted in once; its storages are the ones that cannot be resized), forward and backward,
    with the Python path's values; with the pool off, from torch, the same values. A pooled output is no view:
    in-place operations on it work as on torch's own outputs."""
    from addnorm.kernels.cpu import output_pool

    C4 = 40
    lead = (output_pool.MIN_BYTES // (4 * C4) + 7,)  # h (lead, C) itself at the pool's size
    g = torch.Generator().manual_seed(11)
    x = torch.randn(*lead, N, C4, generator=g)
    w = torch.randn(2 * N + N * N, N * C4, generator=g) * 0.05
    coeffs = [torch.tensor(0.8), torch.tensor(0.6), torch.tensor(1.1), torch.randn(N, generator=g),
              torch.randn(N, generator=g), torch.randn(N, N, generator=g)]
    ins = [x, w.t().contiguous(), *coeffs]
    with _Python():
        want_outs, want_grads = _pre_run(ins, None, tuple(range(8)), (0, 1, 2, 3))
    outs, grads = _pre_run(ins, None, tuple(range(8)), (0, 1, 2, 3))
    assert type(outs[0].grad_fn).__name__ == "CppFunction"
    for name, t in (("h", outs[0]), ("dX", grads[0])):
        assert not t.untyped_storage().resizable(), f"{name} did not come from the pool"
        assert t._base is None
    for a, b in zip((*outs, *grads), (*want_outs, *want_grads)):
        _same(a, b, "a large call")
    y, hp, hr = torch.randn(*lead, C4, generator=g), torch.rand(*lead, N, generator=g), torch.rand(*lead, N, N, generator=g)
    xs = x.clone().requires_grad_()
    ys = y.clone().requires_grad_()
    x2 = AF.stream_write(xs, ys, hp, hr)[0]
    assert type(x2.grad_fn).__name__ == "CppFunction" and not x2.untyped_storage().resizable()
    dx, dy = torch.autograd.grad(x2, (xs, ys), torch.ones_like(x2))
    assert not dx.untyped_storage().resizable() and not dy.untyped_storage().resizable()
    h = AF.mhc_pre(x.clone().requires_grad_(), *ins[1:])[0]
    h.mul_(2)  # an output of a custom Function that were a view would refuse this
    assert h.grad_fn is not None
    output_pool.POOL.set_limit(0)
    try:
        outs0, grads0 = _pre_run(ins, None, tuple(range(8)), (0, 1, 2, 3))
        assert outs0[0].untyped_storage().resizable() and grads0[0].untyped_storage().resizable()
        for a, b in zip((*outs0, *grads0), (*outs, *grads)):
            _same(a, b, "the pool off")
    finally:
        output_pool.POOL.set_limit(1 << 30)


@pytest.mark.parametrize("iters", [5, 100])
def test_no_tokens_with_a_gradient(iters):
    """A stream of no tokens: outputs of no tokens and zero gradients, through the kernels' path (iters <= 64) and
    the formulas' (more rounds than the kernels take), whose backward had reshaped H_res's gradient with a -1 that
    no tokens leave ambiguous."""
    ins = _pre_inputs(torch.float32, None, lead=(0,))
    ts = [t.clone().requires_grad_() for t in ins]
    outs = AF.mhc_pre(*ts, iters=iters)
    assert outs[0].shape == (0, C) and outs[3].shape == (0, N, N)
    grads = torch.autograd.grad([o.sum() for o in outs], ts)
    for g, t in zip(grads, ts):
        assert g.shape == t.shape and not g.any()


@pytest.mark.parametrize("dt,pdt", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                    (torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_stream_read_node_matches_the_python_node_bit_for_bit(dt, pdt):
    """The stream's read (hyper-connections read their sub-layer's input with it): outputs and gradients the Python
    node's to the bit, whichever inputs need a gradient; inference through the entry too."""
    g = torch.Generator().manual_seed(12)
    x, hp = torch.randn(3, 7, N, 33, generator=g).to(dt), (torch.rand(3, 7, N, generator=g) * 2).to(pdt)
    up = torch.randn(3, 7, 33, generator=g).to(dt)

    def run(want):
        ts = [t.clone().requires_grad_(i in want) for i, t in enumerate((x, hp))]
        h = AF.stream_read(*ts)
        return h, torch.autograd.grad(h, [ts[i] for i in want], up)

    for want in ((0, 1), (0,), (1,)):
        (h, grads), (h_py, grads_py) = _both(lambda: run(want))
        assert type(h.grad_fn).__name__ == "CppFunction"
        assert type(h_py.grad_fn).__name__ == "DirectStreamReadBackward"
        for a, b in zip((h, *grads), (h_py, *grads_py)):
            _same(a, b, f"the read (want {want})")
    with torch.no_grad():
        got, want = _both(lambda: AF.stream_read(x, hp))
    _same(got, want, "the read at inference")


def test_stream_read_node_hands_other_backwards_to_python():
    """Double backward and batched gradients through the read answer as through the Python node."""
    g = torch.Generator().manual_seed(13)
    x, hp = torch.randn(2, N, 33, generator=g), torch.rand(2, N, generator=g)
    v = torch.randn(3, 2, 33, generator=g)

    def penalty():
        xs, hs = x.clone().requires_grad_(), hp.clone().requires_grad_()
        h = AF.stream_read(xs, hs)
        gx, gh = torch.autograd.grad(h.square().sum(), (xs, hs), create_graph=True)
        return torch.autograd.grad(gx.square().sum() + gh.square().sum(), (xs, hs))

    def batched():
        xs, hs = x.clone().requires_grad_(), hp.clone().requires_grad_()
        return torch.autograd.grad(AF.stream_read(xs, hs), (xs, hs), v, is_grads_batched=True)

    for fn in (penalty, batched):
        got, want = _both(fn)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
