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
