"""patch_hf_model's Qwen4-exp gated residual on the gated read's own C kernels (``addnorm.ops.hyper``): each read one
stream-norm pass (or, handed over, the write before it with the norm) and one sigmoid-gated collapse from the
up-projection's logits, forward and backward, the low-rank gate's GEMMs the module's own. The patched module against
HF's and against the float64 transcription of its equations, in float32 and bfloat16; which operators run."""

import copy
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp", reason="transformers without Qwen4-exp")

import addnorm  # noqa: E402
from addnorm.interop import patch_hf_model  # noqa: E402
from addnorm.reference import gated_streams as ref  # noqa: E402

from test_patch import IDX, build  # noqa: E402

needs_cpu = pytest.mark.skipif(not addnorm.cpu_kernel_availability().available,
                               reason="the compiled kernels are not built")
SITES = ("layers.0.attn_hyper_connection", "hyper_connection_mixer")  # a gated read, and the final mixer's


def _pair(dtype):
    """(HF's model, the patched copy): the two gated residuals of SITES given random parameters first (HF's init
    leaves the gates near their constant start), so that every term counts."""
    hf = build("Qwen4Exp")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for site in SITES:
            for p in hf.model.get_submodule(site).parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    hf = hf.to(dtype)
    return hf, patch_hf_model(copy.deepcopy(hf))


def _stream(module, dtype, tokens=(4, 32)):
    n, C = module.hc_count, module.hidden_size
    x = torch.randn(*tokens, n * C, generator=torch.Generator().manual_seed(1)) * 2
    x[1] *= 1e-3  # tokens whose RMS is near eps
    return x.to(dtype)


def _run(module, x):
    """The module's h (and injection weights), and the gradients of x and of every parameter through both."""
    x = x.clone().requires_grad_()
    out = module(x)
    outs = (out[0], out[2]) if isinstance(out, tuple) else (out,)
    cots = [torch.randn(o.shape, generator=torch.Generator().manual_seed(7 + i)).to(o.dtype)
            for i, o in enumerate(outs)]
    return outs, torch.autograd.grad(outs, [x, *module.parameters()], cots), cots


def _float64(module, x, cots):
    """The same from the float64 equations (``reference.gated_streams.gated_read``)."""
    params = [p.detach().double().requires_grad_() for p in module.parameters()]
    x64 = x.detach().double().requires_grad_()
    n, C = module.hc_count, module.hidden_size
    norm_w, down, up, *inject = params
    h, a = ref.gated_read(x64.unflatten(-1, (n, C)), norm_w.reshape(n, C), module.hc_norm.eps, down, up,
                          inject[0] if inject else None)
    outs = (h, a) if inject else (h,)
    return outs, torch.autograd.grad(outs, [x64, *params], [c.double() for c in cots])


@needs_cpu
@pytest.mark.parametrize("site", SITES)
def test_float32_outputs_and_every_gradient_within_1e_5_of_hfs_and_the_equations(site):
    hf, patched = _pair(torch.float32)
    theirs, mine = hf.model.get_submodule(site), patched.model.get_submodule(site)
    x = _stream(theirs, torch.float32)
    got, got_grads, cots = _run(mine, x)
    want, want_grads, _ = _run(theirs, x)
    exact, exact_grads = _float64(theirs, x, cots)
    for a, e, e64 in zip((*got, *got_grads), (*want, *want_grads), (*exact, *exact_grads), strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        # 1e-5 at the tensor's scale: x's gradient reaches ~500 on the tokens near eps, where HF's own is 9e-5 off
        atol = 1e-5 * (1 + e64.abs().max().item())
        torch.testing.assert_close(a, e, atol=atol, rtol=1e-5)
        torch.testing.assert_close(a.double(), e64, atol=atol, rtol=1e-5)


@needs_cpu
@pytest.mark.parametrize("site", SITES)
def test_bfloat16_is_hfs_forward_and_no_further_from_the_equations(site):
    """bfloat16 parameters and stream: h is HF's to the bit (the collapse rounds where eager's does) on at least
    99 % of its elements, and h, the injection weights and every gradient no further from the float64 equations than
    HF's own bfloat16 module (the gradients from float32 rounded once, where HF's autograd rounds each step). Taken
    over all of them, strictly (the sum of each tensor's mean error over its scale); each one's mean error within
    10 % of HF's (a parameter's gradient sums its tokens' rounding errors: one of 192 values came out 4 % above HF's
    where the other site's was 18 % below), and its largest within one bfloat16 rounding at the tensor's scale (x's
    gradient reaches ~600 on the tokens near eps, where one element's rounding, 2 or 4, decides the largest)."""
    hf, patched = _pair(torch.bfloat16)
    theirs, mine = hf.model.get_submodule(site), patched.model.get_submodule(site)
    x = _stream(theirs, torch.bfloat16, tokens=(8, 64))
    got, got_grads, cots = _run(mine, x)
    want, want_grads, _ = _run(theirs, x)
    exact, exact_grads = _float64(theirs, x, cots)
    assert (got[0] == want[0]).float().mean().item() >= 0.99
    total = [0.0, 0.0]
    for k, (a, e, e64) in enumerate(zip((*got, *got_grads), (*want, *want_grads), (*exact, *exact_grads),
                                        strict=True)):
        ea, eb = (a.double() - e64).abs(), (e.double() - e64).abs()
        scale = e64.abs().max().item()
        total[0] += ea.mean().item() / scale
        total[1] += eb.mean().item() / scale
        assert ea.mean().item() <= 1.1 * eb.mean().item(), (k, ea.mean().item(), eb.mean().item())
        assert ea.max().item() <= eb.max().item() + torch.finfo(torch.bfloat16).eps * scale, (k, ea.max().item(),
                                                                                             eb.max().item())
    assert total[0] <= total[1], total


class _Ops(TorchDispatchMode):
    """Every operator call below autograd, by name, forward and backward."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))


@needs_cpu
@pytest.mark.parametrize("site", SITES)
def test_the_read_is_two_addnorm_operators_each_way_around_the_gates_gemms(site):
    """One patched read, forward and backward: the stream norm and the sigmoid-gated collapse (and their backward),
    the low-rank gate's GEMMs and SiLU, the injection weights' sigmoid -- and none of the per-stream calls, stacks,
    means, powers or second sigmoid that computing the norm and the collapse in torch ops takes."""
    _, patched = _pair(torch.float32)
    module = patched.model.get_submodule(site)
    x = _stream(module, torch.float32)
    with _Ops() as ops:
        _run(module, x)
    ours = {k: v for k, v in ops.calls.items() if k.startswith("addnorm.")}
    assert ours == {f"addnorm.{op}.default": 1 for op in ("hyper_stream_norm", "hyper_stream_norm_backward",
                                                          "hyper_sigmoid_gated_collapse",
                                                          "hyper_sigmoid_gated_collapse_backward")}
    gone = ("aten.stack.default", "aten.cat.default", "aten.unbind.int", "aten.select.int", "aten.mean.dim",
            "aten.pow.Tensor_Scalar", "aten.rsqrt.default")
    assert not {k for k in ops.calls if k in gone}, ops.calls
    injection = 0 if site == "hyper_connection_mixer" else 1
    assert ops.calls["aten.sigmoid.default"] == injection and ops.calls["aten.sigmoid_backward.default"] == injection
    assert ops.calls["aten.silu.default"] == ops.calls["aten.silu_backward.default"] == 1


@needs_cpu
def test_the_whole_model_runs_each_read_and_write_on_the_kernels_both_ways(monkeypatch):
    """A training step of the 2-layer model: the first read's norm, every write with the norm after it (4), every
    gated collapse (5, the final mixer's with them), each one kernel call forward and one backward."""
    from addnorm.kernels.cpu import hyper as cpu_hyper

    hf, patched = _pair(torch.float32)  # (patching probes each hyper-connection: before the count)
    counts = Counter()
    for name in ("stream_norm", "stream_norm_backward", "write_norm", "write_norm_backward", "sigmoid_collapse",
                 "sigmoid_collapse_backward"):
        real = getattr(cpu_hyper, name)

        def spy(*a, _real=real, _name=name):
            counts[_name] += 1
            return _real(*a)

        monkeypatch.setattr(cpu_hyper, name, spy)
    patched.train()
    torch.manual_seed(5)
    loss = patched(IDX, labels=IDX).loss
    loss.backward()
    assert counts == {"stream_norm": 1, "stream_norm_backward": 1, "write_norm": 4, "write_norm_backward": 4,
                      "sigmoid_collapse": 5, "sigmoid_collapse_backward": 5}, counts
    hf.train()
    torch.manual_seed(5)
    torch.testing.assert_close(loss, hf(IDX, labels=IDX).loss, atol=1e-5, rtol=1e-5)
