"""Large outputs come from recycled, already faulted-in memory; the pool is bounded and can be emptied."""

import gc

import pytest
import torch
import torch.nn.functional as F

import addnorm
from addnorm.kernels.cpu.output_pool import OutputPool


pytestmark = pytest.mark.skipif(not addnorm.cpu_kernel_availability().available,
                                reason="the compiled kernels are not built")
ROWS, D = 8192, 1024  # 32 MiB of float32


@pytest.fixture
def pool():
    p = addnorm.output_pool
    p.release()
    yield p
    p.set_limit(1 << 30)
    p.release()


def test_a_freed_output_is_reused(pool):
    x, r = torch.randn(ROWS, D), torch.randn(ROWS, D)
    y, s = addnorm.add_layer_norm(x, r, D)
    ptrs = {y.data_ptr(), s.data_ptr()}
    assert pool.stats()["in_use_bytes"] == 2 * ROWS * D * 4
    del y, s
    gc.collect()
    assert pool.stats()["idle_bytes"] == 2 * ROWS * D * 4
    y2, s2 = addnorm.add_layer_norm(x, r, D)
    assert {y2.data_ptr(), s2.data_ptr()} == ptrs
    torch.testing.assert_close(y2, F.layer_norm(x + r, (D,)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s2, x + r)


def test_a_live_view_keeps_its_block(pool):
    x = torch.randn(ROWS, D)
    y = addnorm.rms_norm(x, D)
    row = y[3]
    ptr = y.data_ptr()
    del y
    y2 = addnorm.rms_norm(x * 2, D)
    assert y2.data_ptr() != ptr  # the view still uses the first block
    torch.testing.assert_close(row, F.rms_norm(x, (D,), eps=torch.finfo(torch.float32).eps)[3])


def test_backward_outputs_and_training_use_the_pool(pool):
    x = torch.randn(ROWS, D, requires_grad=True)
    w = torch.ones(D, requires_grad=True)
    for _ in range(2):
        y = addnorm.layer_norm(x, D, w)
        (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
        del y, gx
    st = pool.stats()
    assert st["blocks"] <= 2 and st["in_use_bytes"] == 0


def test_limit_and_release(pool):
    pool.set_limit(0)
    assert pool.stats()["blocks"] == 0
    y = addnorm.rms_norm(torch.randn(ROWS, D), D)
    assert pool.stats()["blocks"] == 0 and y.is_contiguous()  # off: plain torch.empty
    pool.set_limit(1 << 30)
    with pytest.raises(ValueError, match="limit_bytes"):
        pool.set_limit(-1)
    own = OutputPool(limit_bytes=ROWS * D * 4)  # room for one idle block
    a = own.empty((ROWS, D), torch.float32)
    b = own.empty((ROWS, D), torch.float32)
    del a, b
    own.empty((1, 1), torch.float32)  # below the pool's size: torch's, and trims nothing
    assert own.stats()["idle_bytes"] == 2 * ROWS * D * 4
    c = own.empty((ROWS, D), torch.float32)  # reuses one; the other, idle, fits the limit
    assert own.stats() == {"blocks": 2, "idle_bytes": ROWS * D * 4, "in_use_bytes": ROWS * D * 4,
                           "limit_bytes": ROWS * D * 4}
    own.set_limit(1)
    assert own.stats()["blocks"] == 1 and own.stats()["in_use_bytes"] == ROWS * D * 4
    del c
    own.release()
    assert own.stats()["blocks"] == 0


def test_a_pooled_output_is_no_view_and_takes_in_place_operations():
    """An autograd Function's output that is a view refuses in-place operations; the pool's tensors are tensors of
    their own over its memory (they were views of a flat buffer, and ``out.relu_()`` on a large norm output raised
    "... is a view and is being modified inplace")."""
    import addnorm.functional as AF
    from addnorm.kernels.cpu import output_pool

    from addnorm.ops import native_nodes

    rows = max(output_pool.MIN_BYTES // (4 * 1024), native_nodes.MAX_NUMEL // 1024) + 3  # the Python node's, pooled
    w = torch.ones(1024, requires_grad=True)
    out = AF.rms_norm(torch.randn(rows, 1024), (1024,), w)
    assert not out.untyped_storage().resizable() and out._base is None  # from the pool
    out.relu_()
    out.sum().backward()
    assert w.grad is not None and w.grad.shape == (1024,)
    t = output_pool.POOL.empty((rows, 1024), torch.float32)
    assert t._base is None and t.is_contiguous() and t.shape == (rows, 1024)


def test_two_pooled_gradients_are_summed_in_place(pool):
    """A tensor used twice gets two gradients, and autograd sums them in place only into a buffer it owns alone. The
    pool's tensors were made through ``set_(flat.untyped_storage(), ...)``, whose Python storage object counted as a
    second owner: every such sum (the residual stream's, in any model whose large gradients come from the pool)
    allocated a third tensor. Now the sum lands in one of the two pooled buffers."""
    from addnorm.kernels.cpu import output_pool

    ptrs = []

    class Pooled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, v):
            ctx.v = v
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            t = output_pool.POOL.empty(tuple(g.shape), g.dtype)
            assert t is not None, "the pool declined a tensor of its size"
            ptrs.append(t.data_ptr())
            return t.fill_(ctx.v), None

    x = torch.zeros(output_pool.MIN_BYTES // 4 + 1024, requires_grad=True)
    (Pooled.apply(x, 1.0).sum() + Pooled.apply(x, 2.0).sum()).backward()
    assert torch.all(x.grad == 3.0)
    assert len(ptrs) == 2 and x.grad.data_ptr() in ptrs, "autograd summed the two pooled gradients into a new tensor"


def test_the_widened_stream_sums_its_gradients_in_place(pool):
    """The read and the write of a widened stream both take X: its two gradients (C++ nodes' pooled outputs) are summed
    in place (``aten::add_``), not into a fresh tensor (``aten::add``), as the training step of an mHC block does."""
    from torch.profiler import ProfilerActivity, profile

    from addnorm.functional import stream_read, stream_write

    T, n, C = 512, 4, 768  # 6 MiB of float32: pooled
    g = torch.Generator().manual_seed(0)
    X = torch.randn(T, n, C, generator=g).requires_grad_()
    hp, hpo = torch.rand(T, n, generator=g), torch.rand(T, n, generator=g)
    hr = torch.rand(T, n, n, generator=g)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        X2, _ = stream_write(X, stream_read(X, hp) * 2, hpo, hr)
        X2.backward(torch.ones_like(X2))
    ops = {e.key: e.count for e in p.key_averages()}
    assert ops.get("aten::add", 0) == 0 and ops.get("aten::add_", 0) >= 1, ops
