"""Without the compiled library (no C compiler at install time) addnorm still works, exactly, and says why."""

import pytest
import torch
import torch.nn.functional as F

import addnorm
import addnorm.kernels.cpu.library as library


@pytest.fixture
def no_kernels(monkeypatch):
    monkeypatch.setattr(library, "_LIB", "the compiled kernel library is missing (test)")
    library.availability.cache_clear()
    yield
    library.availability.cache_clear()


def test_auto_falls_back_to_the_exact_torch_backend(no_kernels):
    av = addnorm.cpu_kernel_availability()
    assert not av.available and "missing" in av.reason
    x, r = torch.randn(4, 32, requires_grad=True), torch.randn(4, 32)
    y, s = addnorm.add_layer_norm(x, r, 32)
    assert addnorm.last_backend() == "torch"
    torch.testing.assert_close(y, F.layer_norm(x + r, (32,)))
    y.sum().backward()
    with torch.no_grad():
        addnorm.add_rms_norm(x, r, 32, out=torch.empty(4, 32), residual_out=torch.empty(4, 32))
    assert addnorm.last_backend() == "torch"


def test_cpu_backend_says_why_it_cannot_run(no_kernels):
    with pytest.raises(RuntimeError, match="backend='cpu' cannot run this call: the compiled kernel library is missing"):
        addnorm.layer_norm(torch.randn(2, 8), 8, backend="cpu")


def test_a_declined_call_reports_the_formulas_that_ran():
    """A kernel backend that declines a call (the fused Triton kernels hold a row in one block: D <= 16384) runs
    the formulas, and last_backend() says so rather than naming the backend it was asked for; the values are
    the torch backend's."""
    from backends import TRITON

    if not TRITON:
        pytest.skip("needs Triton's interpreter (or a GPU) for backend='triton'")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    for D, ran in ((768, "triton"), (20000, "torch")):
        x, r = (torch.randn(2, D, generator=g).to(dev) for _ in range(2))
        w = torch.ones(D, device=dev)
        calls = {
            "rms_norm_add": lambda b: addnorm.rms_norm_add(x, r, D, w, eps=1e-6, backend=b),
            "parallel_add_layer_norm": lambda b: addnorm.parallel_add_layer_norm(x, x, r, D, w, None, w, None,
                                                                                 backend=b),
            "add_dyt": lambda b: addnorm.add_dyt(x, r, torch.tensor(0.5, device=dev), w, None, backend=b),
        }
        for name, call in calls.items():
            got = call("triton")
            assert addnorm.last_backend() == ran, (name, D)
            want = call("torch")
            for a, e in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                if a is not None:
                    torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
    X = torch.randn(2, 4, 20000, generator=g).to(dev)
    addnorm.stream_read(X, torch.rand(2, 4, generator=g).to(dev), backend="triton")
    assert addnorm.last_backend() == "torch"  # the stream kernels hold C <= 16384 too
