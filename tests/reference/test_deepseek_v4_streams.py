"""The float64 transcription of DeepSeek-V4's hyper-connection (``reference.deepseek_v4_streams``) against
HuggingFace's own modules, and its relation to the mHC paper's equations (``reference.streams``)."""

import pytest
import torch

from addnorm.reference import deepseek_v4_streams as dsv4
from addnorm.reference import streams as paper

N, C = 4, 16


def _module_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, N, C, generator=g) * 2 + 0.3
    x[1, :2] *= 1e-3  # tokens whose RMS is near eps
    fn = torch.randn((2 + N) * N, N * C, generator=g) * 0.2
    base = torch.randn((2 + N) * N, generator=g) * 0.5
    scale = torch.tensor([0.7, 1.2, 1.6])
    return x, fn, base, scale


def _hf_config(T, **kw):
    return T.DeepseekV4Config(hidden_size=C, hc_mult=N, hc_sinkhorn_iters=kw.get("iters", 20),
                              hc_eps=kw.get("hc_eps", 1e-6), rms_norm_eps=kw.get("rms_eps", 1e-6))


@pytest.mark.parametrize("iters, hc_eps", [(20, 1e-6), (3, 1e-2), (1, 1e-6)])
def test_the_transcription_is_hfs_hyper_connection(iters, hc_eps):
    T = pytest.importorskip("transformers")
    if not hasattr(T, "DeepseekV4Config"):
        pytest.skip(f"transformers {T.__version__} has no DeepSeek-V4")
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection

    hc = DeepseekV4HyperConnection(_hf_config(T, iters=iters, hc_eps=hc_eps))
    x, fn, base, scale = _module_inputs()
    with torch.no_grad():
        hc.fn.copy_(fn), hc.base.copy_(base), hc.scale.copy_(scale)
        post, comb, collapsed = hc(x)
    want = dsv4.hyper_connection(x, fn, base, scale, 1e-6, hc_eps, iters)
    for name, got, exp in zip(("post", "comb", "collapsed"), (post, comb, collapsed), want, strict=True):
        torch.testing.assert_close(got.double(), exp, atol=2e-6, rtol=1e-5, msg=name)
    # and what the layer does with them: X' = post y + comb^T X
    y = torch.randn(2, 5, C, generator=torch.Generator().manual_seed(1))
    hf_write = post.unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), x)
    torch.testing.assert_close(hf_write.double(), dsv4.write(x, y, *want[:2]), atol=1e-5, rtol=1e-5)


def test_the_transcription_is_hfs_hyper_head():
    T = pytest.importorskip("transformers")
    if not hasattr(T, "DeepseekV4Config"):
        pytest.skip(f"transformers {T.__version__} has no DeepSeek-V4")
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperHead

    head = DeepseekV4HyperHead(_hf_config(T, hc_eps=1e-3))
    x, fn, base, _ = _module_inputs(1)
    with torch.no_grad():
        head.hc_fn.copy_(fn[:N]), head.hc_base.copy_(base[:N]), head.hc_scale.fill_(0.8)
        got = head(x)
    want = dsv4.hyper_head(x, fn[:N], base[:N], torch.tensor([0.8]), 1e-6, 1e-3)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)


def test_without_eps_deepseeks_mix_is_the_papers_sinkhorn_of_the_transposed_logits():
    """The identity MhcConvention's res_transposed rests on: DeepSeek-V4's rows-first Sinkhorn, transposed, is
    the paper's columns-first Sinkhorn (eq. 9) of the transposed logits."""
    g = torch.Generator().manual_seed(2)
    L = torch.randn(3, N, N, generator=g, dtype=torch.float64)
    comb = dsv4.comb_sinkhorn(L, 1.0, torch.zeros(N, N, dtype=torch.float64), 0.0, 7)
    torch.testing.assert_close(comb.transpose(-1, -2), paper.mhc_eq9_sinkhorn(L.transpose(-1, -2), 7))
    # with eps it is not: the eps the convention carries matters
    comb_eps = dsv4.comb_sinkhorn(L, 1.0, torch.zeros(N, N, dtype=torch.float64), 1e-2, 7)
    assert (comb_eps - comb).abs().max() > 1e-4
