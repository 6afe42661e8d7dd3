"""The diagnostics hooks: exact gradient norms, statistics, HF models, clean detach, export."""

import csv
import json

import pytest
import torch
import torch.nn.functional as F

from addnorm import diagnostics
from addnorm.model import GPT, GPTConfig


def _model(placement="pre", n_layer=4):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=n_layer, n_head=2, n_embd=32, placement=placement))


def _direct_stream_grads(m, idx):
    """The residual stream entering each block, and dloss/dstream, by plain autograd."""
    x = m.wte(idx) + m.wpe(torch.arange(idx.shape[1]))
    streams = []
    for block in m.h:
        streams.append(x)
        x = block(x)
    if m.ln_f is not None:
        x = F.layer_norm(x, (m.config.n_embd,), m.ln_f.weight, m.ln_f.bias, m.config.eps)
    loss = F.cross_entropy(m.lm_head(x).reshape(-1, 50), idx.reshape(-1))
    return streams, torch.autograd.grad(loss, streams)


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich", "deepnorm"])
def test_hook_gradient_norms_equal_direct_autograd(placement):
    m = _model(placement)
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    streams, grads = _direct_stream_grads(m, idx)
    with diagnostics.record(m) as rec:
        _, loss = m(idx, idx)
        loss.backward()
    got = rec.by_block("grad_norm", site="attn")
    want = [g.norm().item() for g in grads]
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        assert a == pytest.approx(b, rel=1e-4)
    rms = rec.by_block("stream_rms", site="attn")
    for a, s in zip(rms, streams):
        assert a == pytest.approx(s.pow(2).mean().sqrt().item(), rel=1e-5)


def test_hooks_do_not_change_the_math_and_are_removed():
    m = _model()
    idx = torch.randint(0, 50, (2, 16))
    _, ref = m(idx, idx)
    g_ref = torch.autograd.grad(ref, list(m.parameters()))
    with diagnostics.record(m) as rec:
        _, loss = m(idx, idx)
        g = torch.autograd.grad(loss, list(m.parameters()))
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert all(not mod._forward_pre_hooks and not mod._forward_hooks for mod in m.modules())
    n = len(rec.records)
    m(idx, idx)  # detached: nothing more is recorded
    assert len(rec.records) == n


def test_norm_statistics_and_parameter_gradients():
    m = _model()
    idx = torch.randint(0, 50, (2, 16))
    with diagnostics.record(m) as rec:
        _, loss = m(idx, idx)
        loss.backward()
    outs = rec.frame("norm_out_std")
    assert len(outs) == 2 * 4 + 1  # two per block and the final norm
    assert all(abs(r["value"] - 1) < 1e-2 for r in outs)  # weight 1, bias 0 at init: unit std
    assert all(abs(r["value"]) < 1e-5 for r in rec.frame("norm_out_mean"))
    pg = rec.by_block("param_grad_norm", site="block")
    direct = [torch.cat([p.grad.reshape(-1) for p in b.parameters()]).norm().item() for b in m.h]
    assert pg == pytest.approx(direct, rel=1e-6)


def test_training_steps_and_export(tmp_path):
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    with diagnostics.record(m) as rec:
        for _ in range(3):
            idx = torch.randint(0, 50, (2, 16), generator=g)
            opt.zero_grad()
            m(idx, idx)[1].backward()
            rec.next_step()
            opt.step()
    # steps 0-2; the exit's collect adds nothing: no backward ran after the last next_step (it recorded the
    # step-2 gradients again as step 3 before)
    assert {r["step"] for r in rec.records} == {0, 1, 2}
    rec.to_csv(tmp_path / "r.csv")
    rec.to_json(tmp_path / "r.json")
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == len(rec.records) == len(json.loads((tmp_path / "r.json").read_text()))
    assert set(rows[0]) == {"step", "block", "site", "quantity", "value"}


def test_works_on_a_huggingface_gpt2():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=60, n_positions=16, n_layer=3, n_head=2,
                                                              n_embd=32, bos_token_id=0, eos_token_id=0)).eval()
    idx = torch.randint(0, 60, (2, 12))
    out = hf(idx, labels=idx, output_hidden_states=True)
    direct = torch.autograd.grad(out.loss, list(out.hidden_states[:3]))
    with diagnostics.record(hf) as rec:
        hf(idx, labels=idx).loss.backward()
    assert len(rec.blocks) == 3
    got = rec.by_block("grad_norm", site="block")
    assert got == pytest.approx([g.norm().item() for g in direct], rel=1e-4)
    sites = {r["site"] for r in rec.frame("norm_out_std")}
    assert {"ln_1", "ln_2", "transformer.ln_f"} <= sites


def test_custom_blocks_and_errors():
    with pytest.raises(ValueError, match="could not find the blocks"):
        diagnostics.find_blocks(torch.nn.Linear(2, 2))
    stack = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
    x = torch.randn(2, 4, requires_grad=True)
    with diagnostics.record(stack, blocks=list(stack)) as rec:
        stack(x).sum().backward()
    assert len(rec.by_block("grad_norm")) == 3


class _Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.fc = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x))


class _Shared(torch.nn.Module):
    """ALBERT-style: one block applied three times."""

    def __init__(self, d=16):
        super().__init__()
        b = _Block(d)
        self.layers = torch.nn.ModuleList([b, b, b])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_shared_block_gets_each_application_at_its_own_position():
    """Hooked once per position, a shared block recorded its first application's numbers at every position (nine
    records for three applications)."""
    torch.manual_seed(0)
    m = _Shared()
    x = (torch.randn(2, 5, 16) * 3 + 1).requires_grad_()
    with diagnostics.record(m) as rec:
        m(x).square().mean().backward()
    hs = [x.detach().requires_grad_()]  # by hand: each application's input, and the gradient flowing into it
    for layer in m.layers:
        hs.append(layer(hs[-1]))
    for t in hs[:-1]:
        t.retain_grad()
    hs[-1].square().mean().backward()
    want_rms = [t.detach().pow(2).mean().sqrt().item() for t in hs[:-1]]
    want_grad = [t.grad.norm().item() for t in hs[:-1]]
    assert len(rec.frame("stream_rms")) == 3
    assert rec.by_block("stream_rms") == pytest.approx(want_rms, rel=1e-5)
    assert rec.by_block("grad_norm") == pytest.approx(want_grad, rel=1e-5)


def test_by_block_keeps_block_positions_and_ignores_stale_or_late_gradients():
    """A frozen block has no gradient: by_block dropped it and moved the later blocks down. Gradients left from a
    backward before the recording were recorded as its own, and a backward after it still added records."""
    m = _model(n_layer=4)
    for p in m.h[0].parameters():
        p.requires_grad_(False)
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    m(idx, idx)[1].backward()  # stale gradients, before any recording
    with torch.no_grad(), diagnostics.record(m) as rec:
        m(idx)
    assert rec.frame("param_grad_norm") == []
    with diagnostics.record(m) as rec:
        loss = m(idx, idx)[1]
    loss.backward()  # after the recording
    assert rec.frame("grad_norm") == [] and rec.frame("param_grad_norm") == []
    for p in m.parameters():
        p.grad = None
    with diagnostics.record(m) as rec:
        m(idx, idx)[1].backward()
    prof = rec.by_block("param_grad_norm")
    assert len(prof) == 4 and prof[0] != prof[0] and all(v == v for v in prof[1:])  # NaN for the frozen block


def test_an_unknown_quantity_site_or_step_is_refused_naming_the_known_ones():
    """rec.by_block("grad_nrom") returned a profile of NaN: every method taking a quantity name (by_block, frame,
    depth_profile) refuses a name the recorder never records, naming the ones it does; a site or step likewise."""
    m = _model()
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    with diagnostics.record(m) as rec:
        m(idx, idx)[1].backward()
    for call in (lambda: rec.by_block("grad_nrom"), lambda: rec.frame("grad_nrom"),
                 lambda: diagnostics.depth_profile(rec.records, "grad_nrom")):
        with pytest.raises(ValueError, match=r"unknown diagnostics quantity 'grad_nrom'; known: .*\bgrad_norm\b"):
            call()
    with pytest.raises(ValueError, match=r"unknown site 'atn'; this model's: attn, attn.norm_before, block"):
        rec.by_block("grad_norm", site="atn")
    with pytest.raises(ValueError, match="step must be an integer from 0 to 0"):
        rec.frame("grad_norm", step=1)
    empty = rec.by_block("stream2_rms")  # a real name with no record here (one stream): NaN, as before
    assert len(empty) == 4 and all(v != v for v in empty)
    assert len(rec.frame("norm_out_std", site="attn.norm_before")) == 4


def test_every_quantity_recorded_is_a_known_one():
    """The names the recorder writes are the ones it accepts (mixing gains and per-stream RMS included)."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, placement="mhc"))
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    with diagnostics.record(m) as rec:
        m(idx, idx)[1].backward()
    recorded = {r["quantity"] for r in rec.records}
    assert {q for q in recorded if not q.startswith("stream") or not q[6].isdigit()} == set(diagnostics.QUANTITIES)
    assert {"stream0_rms", "stream3_rms"} <= recorded
    for q in recorded:
        rec.frame(q)  # accepted
