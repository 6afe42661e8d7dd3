"""The widened stream's C++ inference entries (``kernels/cpu/autograd_nodes.cpp``: ``fast_mhc``,
``fast_hyper_read``, ``fast_hyper_gated``), which check and run a plain call with no gradient wanted -- a decoded
token, where the Python layers around the kernel cost more than HF's whole module -- against the general path
they stand in front of: the same outputs to the bit, in the same dtypes and shapes, for every form, dtype,
convention and rounding; taken where they should be (the general path is never reached), declined where they
should not (float64, a view, a bad argument: the general path answers, with its autograd and its errors). Where a
gradient is wanted, mhc_pre's read and the stream write make C++ autograd nodes (tests/ops/test_stream_nodes.py)
and the other entries decline."""

import itertools
from unittest import mock

import pytest
import torch

import addnorm.functional as AF
from addnorm.functional import MhcConvention, ProjectedGates, last_backend
from addnorm.functional import mhc as M
from addnorm.functional.hyper import ONCE, PRODUCTS, StreamNorm
from addnorm.kernels.cpu import nodes
from addnorm.ops import native_nodes

pytestmark = pytest.mark.skipif(native_nodes.NODES is None, reason=(
    f"the C++ nodes are not loaded here: {nodes.status()}; make setup builds them, CI runs these"))

N, C = 4, 40
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LEADS = ((1, 1), (3,), (2, 5))
GATES = ProjectedGates(1e-6, pre_eps=1e-3, post_scale=2.5, post_eps=1e-4)
HEAD = ProjectedGates(1e-6, pre_eps=1e-3)
NORM = StreamNorm(1e-6, 1.0)


def _general(fn):
    saved, M.NODES = M.NODES, None
    try:
        return fn()
    finally:
        M.NODES = saved


def _same(fn):
    """fn's outputs through the entry and through the general path: equal to the bit."""
    with torch.no_grad():
        fast = fn()
        assert last_backend() == "cpu"
        slow = _general(fn)
        assert last_backend() == "cpu"
    fast, slow = (r if isinstance(r, tuple) else (r,) for r in (fast, slow))
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert torch.equal(a, b), (a.float() - b.float()).abs().max()


@pytest.fixture
def no_general_path():
    """Fail if any call reaches a general path (the Python kernel hosts)."""
    boom = AssertionError("the general path ran")
    with mock.patch.object(M, "run_pre", side_effect=boom), mock.patch.object(M, "run_write_pre", side_effect=boom), \
            mock.patch("addnorm.functional.hyper._run_cpu", side_effect=boom):
        yield


def _stream(dt, lead, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*lead, N, C, generator=g).to(dt), torch.randn(*lead, C, generator=g).to(dt),
            torch.rand(*lead, N, generator=g) * 2, torch.rand(*lead, N, N, generator=g))


def _hyper_params(groups, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(groups * N, N * C, generator=g) * 0.05, torch.rand(groups, generator=g) + 0.5,
            torch.randn(groups * N, generator=g))


def _mhc_params(contiguous_phi, seed=2):
    g = torch.Generator().manual_seed(seed)
    fn = torch.randn(2 * N + N * N, N * C, generator=g) * 0.05  # a model's (m, nC) weight
    phi = fn.t().contiguous() if contiguous_phi else fn.t()
    return (phi, torch.tensor(0.7), torch.tensor([1.1]), torch.tensor(0.9), torch.randn(N, generator=g),
            torch.randn(N, generator=g), torch.randn(N, N, generator=g))


@pytest.mark.parametrize("dt,lead", list(itertools.product(DTYPES, LEADS)))
def test_hyper_read_and_write_read_as_the_general_path(dt, lead):
    x, y, hp, hr = _stream(dt, lead)
    for groups, conv in ((2, GATES), (1, HEAD)):
        w, sc, b = _hyper_params(groups)
        _same(lambda: AF.hyper_read(x, w, sc, b, convention=conv))
        for rounding, h_res in ((ONCE, None), (PRODUCTS, None), (ONCE, hr)):
            _same(lambda: AF.hyper_write_read(x, y, hp, w, sc, b, convention=conv, rounding=rounding, h_res=h_res))


@pytest.mark.parametrize("dt,lead", list(itertools.product(DTYPES, LEADS)))
@pytest.mark.parametrize("contiguous_phi", [False, True], ids=["model_weight", "contiguous_phi"])
def test_mhc_pre_and_write_pre_as_the_general_path(dt, lead, contiguous_phi):
    x, y, hp, hr = _stream(dt, lead)
    args = _mhc_params(contiguous_phi)
    for conv in (None, MhcConvention.deepseek_v4(1e-6)):
        _same(lambda: AF.mhc_pre(x, *args, convention=conv))
        _same(lambda: AF.mhc_write_pre(x, y, hp, hr, *args, convention=conv))
        _same(lambda: AF.mhc_write_pre(x, y, hp, None, *args, convention=conv, products=True))


@pytest.mark.parametrize("dt,pdt,lead", list(itertools.product(DTYPES, (torch.float32, torch.bfloat16), LEADS)))
def test_gated_read_as_the_general_path(dt, pdt, lead):
    x, y, _, _ = _stream(dt, lead)
    g = torch.Generator().manual_seed(3)
    u = torch.randn(x.shape, generator=g).to(dt)
    hp = (torch.rand(*lead, N, generator=g) * 2).to(pdt)
    w = (torch.randn(N, C, generator=g) * 0.1).to(pdt)
    for weight in (w, w.reshape(-1)):
        _same(lambda: AF.stream_rms_norm(x, weight, convention=NORM))
        for rounding in (ONCE, PRODUCTS):
            _same(lambda: AF.hyper_write_norm(x, y, hp, weight, convention=NORM, rounding=rounding))
    for rounding in (ONCE, PRODUCTS):
        _same(lambda: AF.sigmoid_gated_collapse(x, u, rounding=rounding))


def test_a_decoding_call_takes_the_entry(no_general_path):
    x, y, hp, hr = _stream(torch.float32, (1, 1))
    w, sc, b = _hyper_params(2)
    u = torch.randn(x.shape)
    with torch.no_grad():
        AF.hyper_read(x, w, sc, b, convention=GATES)
        AF.hyper_write_read(x, y, hp, w, sc, b, convention=GATES)
        AF.mhc_pre(x, *_mhc_params(False), convention=MhcConvention.deepseek_v4(1e-6))
        AF.mhc_write_pre(x, y, hp, hr, *_mhc_params(False))
        AF.stream_rms_norm(x, w[0, :N * C], convention=NORM)
        AF.hyper_write_norm(x, y, hp, w[0, :N * C], convention=NORM)
        AF.sigmoid_gated_collapse(x, u)
    with torch.inference_mode():
        AF.hyper_write_read(x.clone(), y.clone(), hp.clone(), w, sc, b, convention=GATES)
    # parameters that require grad (a model's), with grad mode off, are still an inference call
    wp = torch.nn.Parameter(w.clone())
    with torch.no_grad():
        AF.hyper_read(x, wp, sc, b, convention=GATES)


def test_a_gradient_wanted_takes_the_autograd_node():
    x, y, hp, _ = _stream(torch.float32, (2,))
    w, sc, b = _hyper_params(2)
    w.requires_grad_()
    h = AF.hyper_write_read(x, y, hp, w, sc, b, convention=GATES)[1]
    assert h.grad_fn is not None
    h.sum().backward()
    with torch.no_grad():
        assert torch.equal(h, AF.hyper_write_read(x, y, hp, w, sc, b, convention=GATES)[1])
    xg = x.clone().requires_grad_()
    n_out = AF.stream_rms_norm(xg, torch.ones(N, C), convention=NORM)
    assert n_out.grad_fn is not None


@pytest.mark.parametrize("case", ["float64", "transposed_view", "perms", "backend_torch"])
def test_declined_calls_answer_as_the_general_path(case):
    x, y, hp, hr = _stream(torch.float32, (3,))
    args = _mhc_params(False)
    perms = None
    backend = None
    if case == "float64":
        x, y = x.double(), y.double()
    elif case == "transposed_view":
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif case == "perms":  # matrices that are not permutations: the general path's formulas mix them
        perms = torch.full((1, N, N), 1.0 / N)
        args = (torch.randn(N * C, 2 * N + 1) * 0.05, *args[1:6], torch.zeros(1))
    else:
        backend = "torch"
    with torch.no_grad():
        got = AF.mhc_pre(x, *args, perms=perms, backend=backend)
        want = _general(lambda: AF.mhc_pre(x, *args, perms=perms, backend=backend))
        assert last_backend() == ("torch" if case in ("float64", "backend_torch", "perms") else "cpu")
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_bad_arguments_get_the_general_paths_errors():
    x, y, hp, hr = _stream(torch.float32, (3,))
    w, sc, b = _hyper_params(2)
    with torch.no_grad():
        with pytest.raises(ValueError, match="weight must have shape"):
            AF.hyper_read(x, w[:, :-1], sc, b, convention=GATES)
        with pytest.raises(ValueError, match="y must have shape"):
            AF.hyper_write_read(x, y[..., :-1], hp, w, sc, b, convention=GATES)
        with pytest.raises(ValueError, match="h_post must have shape"):
            AF.hyper_write_norm(x, y, hp[..., :-1], torch.ones(N, C), convention=NORM)
        with pytest.raises(ValueError, match="products"):
            AF.mhc_write_pre(x, y, hp, hr, *_mhc_params(False), products=True)
        with pytest.raises(ValueError, match="logits must have shape"):
            AF.sigmoid_gated_collapse(x, x[..., :-1])
        with pytest.raises(ValueError, match="eps"):
            AF.mhc_pre(x, *_mhc_params(False), eps=-1.0)
        with pytest.raises(ValueError, match="iters"):
            AF.mhc_pre(x, *_mhc_params(False), iters=-1)
        with pytest.raises(TypeError, match="convention"):
            AF.hyper_read(x, w, sc, b, convention="HY-V4")


FREED = r"""
import sys, torch
import addnorm.functional as AF
from addnorm.functional import mhc as M
from addnorm.functional.hyper import StreamNorm
if sys.argv[1] == "general":
    M.NODES = None
N, C = 4, 16
a = [torch.tensor(0.7), torch.tensor([1.1]), torch.tensor(0.9)]
b = [torch.randn(N), torch.randn(N), torch.randn(N, N)]
phi = torch.randn(N * C, 2 * N + N * N) * 0.05
x = torch.randn(3, N, C)
gates = (torch.randn(2 * N, N * C), torch.rand(2), torch.randn(2 * N))

def freed(t, offset):  # a view of a storage FSDP freed: at an offset its data pointer is not null
    base = torch.randn(offset + t.numel()).to(t.dtype)
    v = base[offset:].view(t.shape)
    base.untyped_storage().resize_(0)
    return v

for offset in (0, 1 << 20):
    f = lambda t: freed(t, offset)
    calls = {
        "mhc_pre x": lambda: AF.mhc_pre(f(x), phi, *a, *b),
        "mhc_pre phi": lambda: AF.mhc_pre(x, f(phi), *a, *b),
        "mhc_write_pre y": lambda: AF.mhc_write_pre(x, f(torch.randn(3, C)), torch.rand(3, N), None, phi, *a, *b),
        "mhc_write_pre h_post": lambda: AF.mhc_write_pre(x, torch.randn(3, C), f(torch.rand(3, N)), None, phi, *a, *b),
        "mhc_write_pre h_res": lambda: AF.mhc_write_pre(x, torch.randn(3, C), torch.rand(3, N), f(torch.rand(3, N, N)),
                                                        phi, *a, *b),
        "hyper_read x": lambda: AF.hyper_read(f(x), *gates, convention=AF.ProjectedGates(1e-6)),
        "hyper_write_read y": lambda: AF.hyper_write_read(x, f(torch.randn(3, C)), torch.rand(3, N), *gates,
                                                          convention=AF.ProjectedGates(1e-6)),
        "sigmoid_gated_collapse logits": lambda: AF.sigmoid_gated_collapse(x, f(x)),
        "stream_rms_norm weight": lambda: AF.stream_rms_norm(x, f(torch.randn(N, C)), convention=StreamNorm(1e-6)),
        "hyper_write_norm h_post": lambda: AF.hyper_write_norm(x, torch.randn(3, C), f(torch.rand(3, N)),
                                                               torch.randn(N, C), convention=StreamNorm(1e-6)),
    }
    for name, call in calls.items():
        with torch.no_grad():
            try:
                call()
                print(offset, name, "returned")
            except RuntimeError as e:
                print(offset, name, "refused" if "storage has been freed" in str(e) else repr(e))
"""


@pytest.mark.parametrize("path", ["entry", "general"])
def test_a_freed_storage_is_refused_by_name(path, tmp_path):
    """A tensor whose storage was freed (FSDP's resize_(0)), at offset 0 and as a view at an offset (whose data
    pointer is not null: the kernels read unmapped memory, a segfault, before), refused with the general path's
    error on both paths -- in a process of its own, so that a crash fails this test alone."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", FREED, path], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 20 and all(line.endswith("refused") for line in lines), r.stdout


def test_a_bfloat16_models_coefficients_take_the_entry(no_general_path):
    """DeepSeek-V4's bfloat16 layers write with H_post and H_res cast to the stream's dtype; addnorm's own streams
    may hold a bfloat16 projection: all of it read as float32, as the general path reads it."""
    x, y, hp, hr = _stream(torch.bfloat16, (1, 1))
    args = _mhc_params(False)
    bf_args = (args[0].bfloat16(), *args[1:])
    w, sc, b = _hyper_params(1)
    with torch.no_grad():
        AF.mhc_write_pre(x, y, hp.bfloat16(), hr.bfloat16(), *args, convention=MhcConvention.deepseek_v4(1e-6))
        AF.mhc_pre(x, *bf_args)
        AF.hyper_write_read(x, y, hp.bfloat16(), w.bfloat16(), sc, b, convention=HEAD, h_res=hr.bfloat16())


@pytest.mark.parametrize("dt", DTYPES)
def test_a_bfloat16_models_coefficients_as_the_general_path(dt):
    x, y, hp, hr = _stream(dt, (2, 3))
    args = _mhc_params(False)
    w, sc, b = _hyper_params(1)
    for cdt in (torch.bfloat16, torch.float16):
        _same(lambda: AF.mhc_write_pre(x, y, hp.to(cdt), hr.to(cdt), *args, convention=MhcConvention.deepseek_v4(1e-6)))
        _same(lambda: AF.mhc_write_pre(x, y, hp.to(cdt), None, *args, products=True))
        _same(lambda: AF.mhc_pre(x, args[0].to(cdt), *args[1:]))
        _same(lambda: AF.hyper_write_read(x, y, hp.to(cdt), w.to(cdt), sc, b, convention=HEAD, h_res=hr.to(cdt)))


def test_the_general_path_allocates_on_the_cpu_under_another_default_device():
    """The CPU kernels' outputs are CPU tensors whatever ``torch.device(...)`` says the default is (the gated
    collapse's came from the default device: on "meta" it had no storage, and the kernel refused)."""
    x, _, _, _ = _stream(torch.float32, (2,))
    u = torch.randn(x.shape)
    want = _general(lambda: AF.sigmoid_gated_collapse(x, u))
    with torch.device("meta"):
        got = _general(lambda: AF.sigmoid_gated_collapse(x, u))
    assert got.device.type == "cpu" and torch.equal(got, want)
