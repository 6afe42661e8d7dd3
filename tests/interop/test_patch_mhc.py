"""patch_hf_model on DeepSeek-V4's widened stream (B, T, n, C) and its mHC hyper-connections: every read on
``mhc_pre`` (DeepSeek-V4's convention), every write together with the next read in one call (``mhc_write_pre``; the
last with the final collapse, ``hyper_write_read``'s head form), that read handed over; what cannot be matched
refused by name. (The generic checks -- exact logits and
gradients, bfloat16, generation, cache, padding, checkpointing, save/load, unpatch, Trainer's groups, and the fusions
counted per decoder layer -- run on it in ``test_patch``'s table.)"""

import copy

import pytest
import torch

T = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
hf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4",
                         reason="transformers without DeepSeek-V4")

import addnorm.functional as AF  # noqa: E402
from addnorm.interop import handoff, patch_hf_model, unpatch_hf_model  # noqa: E402
from addnorm.reference import deepseek_v4_streams as ref  # noqa: E402

from test_patch import IDX, build  # noqa: E402


def _spy(monkeypatch):
    """Counts of the addnorm calls a DeepSeek-V4 forward makes, and of the reads handed over by a write."""
    calls = {}
    for fn in ("stream_write", "mhc_pre", "hyper_read", "mhc_write_pre", "hyper_write_read"):
        real = getattr(AF, fn)

        def spy(*a, _real=real, _fn=fn, **k):
            calls[_fn] = calls.get(_fn, 0) + 1
            return _real(*a, **k)

        monkeypatch.setattr(AF, fn, spy)
    real_take = handoff.take

    def take(module, x):
        y = real_take(module, x)
        if y is not None and "_addnorm_hyper" in module.__dict__:
            calls["handed over"] = calls.get("handed over", 0) + 1
        return y

    monkeypatch.setattr(handoff, "take", take)
    return calls


def test_every_read_write_and_the_final_collapse_run_on_addnorms_operators(monkeypatch):
    """HF's connection modules never run. 2 layers: 4 writes, each computed with the read after it in one call (the
    same layer's second connection, the next layer's first: mhc_write_pre; the final collapse: hyper_write_read with
    the mixing matrix) and handing that read over; the first layer's first read computes its own."""
    ref_m = build("DeepseekV4")
    with torch.no_grad():
        want = ref_m(IDX).logits
    m = patch_hf_model(copy.deepcopy(ref_m))
    for cls in (hf.DeepseekV4HyperConnection, hf.DeepseekV4HyperHead):
        monkeypatch.setattr(cls, "forward", lambda *a, **k: pytest.fail("HF's own hyper-connection ran"))
    calls = _spy(monkeypatch)
    with torch.no_grad():
        got = m(IDX).logits
    assert (got - want).abs().max() <= 1e-5
    assert calls == {"mhc_pre": 1, "mhc_write_pre": 3, "hyper_write_read": 1, "handed over": 4}


def test_the_writes_are_the_transcription_of_hfs():
    """One layer's output, X' = post y + comb^T X twice, against the float64 write of HF's own post, comb and y."""
    m = patch_hf_model(build("DeepseekV4"))
    layer, seen = m.model.layers[0], {}
    for attr in ("attn_hc", "ffn_hc"):
        getattr(layer, attr).register_forward_hook(lambda mod, a, out, attr=attr: seen.__setitem__(attr, (a[0], out)))
    layer.self_attn.register_forward_hook(lambda mod, a, out: seen.__setitem__("attn", out[0]))
    layer.mlp.register_forward_hook(lambda mod, a, out: seen.__setitem__("mlp", out))
    layer.register_forward_hook(lambda mod, a, out: seen.__setitem__("out", out))
    with torch.no_grad():
        m(IDX)
    (x, (post, comb, _)), (mid, (post2, comb2, _)) = seen["attn_hc"], seen["ffn_hc"]
    torch.testing.assert_close(mid.double(), ref.write(x, seen["attn"], post, comb), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seen["out"].double(), ref.write(mid, seen["mlp"], post2, comb2), atol=1e-5, rtol=1e-5)


def test_under_gradient_checkpointing_each_read_computes_its_own(monkeypatch):
    """A checkpointed layer re-runs in backward and must record the same graph: nothing handed over, and HF's
    gradients."""
    ref_m = build("DeepseekV4")
    m = patch_hf_model(copy.deepcopy(ref_m))
    for model in (m, ref_m):
        model.train()
        model.config.use_cache = False
        model.gradient_checkpointing_enable()
    calls = _spy(monkeypatch)
    loss = m(IDX, labels=IDX).loss
    assert calls == {"stream_write": 4, "mhc_pre": 4, "hyper_read": 1}
    grads = torch.autograd.grad(loss, list(m.parameters()), allow_unused=True)
    want = torch.autograd.grad(ref_m(IDX, labels=IDX).loss, list(ref_m.parameters()), allow_unused=True)
    for a, b in zip(grads, want, strict=True):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_hook_that_replaces_or_edits_a_layers_stream_is_seen():
    """A read handed over by a write is taken only for that very tensor, unmodified."""
    for edit in ("replace", "in_place"):
        ref_m, m = build("DeepseekV4"), patch_hf_model(build("DeepseekV4"))
        for model in (ref_m, m):
            def hook(mod, args, out, edit=edit):
                if edit == "replace":
                    return out * 1.5
                out.mul_(1.5)
                return out
            model.model.layers[0].register_forward_hook(hook)
        with torch.no_grad():
            assert (m(IDX).logits - ref_m(IDX).logits).abs().max() <= 1e-5, edit


def test_a_checkpoint_loaded_in_bfloat16_keeps_its_float32_connections(tmp_path):
    """from_pretrained(dtype=bfloat16) keeps DeepSeek-V4's connections and norms in float32
    (_keep_in_fp32_modules_strict) beside a bfloat16 stream: the reads and writes take the mixed dtypes as HF's
    modules do (the coefficients cast to the stream's dtype before the write, as the layer casts them)."""
    build("DeepseekV4").save_pretrained(tmp_path)
    ref_m = type(build("DeepseekV4")).from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert ref_m.model.layers[0].attn_hc.fn.dtype == torch.float32
    m = patch_hf_model(copy.deepcopy(ref_m))
    assert list(m._addnorm_patched["per_layer"].values())[0]["write+read hand-off"] == 2
    with torch.no_grad():
        got, want = m(IDX).logits, ref_m(IDX).logits
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=1.6e-2, rtol=1.6e-2)


class _OtherSpelling(hf.DeepseekV4DecoderLayer):
    """DeepSeek-V4's layer with its writes spelled otherwise: ``@`` and ``.mT``, the terms and factors swapped, no
    casts, and a mix by comb itself rather than its transpose."""

    def forward(self, hidden_states, input_ids=None, **kwargs):
        dtype = hidden_states.dtype
        post, comb, collapsed = self.attn_hc(hidden_states)
        attn_output, _ = self.self_attn(self.input_layernorm(collapsed), **kwargs)
        hidden_states = comb.to(dtype).mT @ hidden_states + attn_output.unsqueeze(-2) * post.to(dtype).unsqueeze(-1)
        post, comb, collapsed = self.ffn_hc(hidden_states)
        mlp_output = self.mlp(self.post_attention_layernorm(collapsed), input_ids=input_ids)
        return torch.matmul(comb, hidden_states) + post.unsqueeze(-1) * mlp_output.unsqueeze(-2)


def test_other_spellings_of_a_write_are_found_and_keep_what_the_layer_computes():
    ref_m = build("DeepseekV4")
    for layer in ref_m.model.layers:
        layer.__class__ = _OtherSpelling
    m = patch_hf_model(copy.deepcopy(ref_m))
    assert [f["hyper-connection write"] for f in m._addnorm_patched["per_layer"].values()] == [2, 2]
    with torch.no_grad():
        assert (m(IDX).logits - ref_m(IDX).logits).abs().max() <= 1e-5


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}, [(n, type(x)) for n, x in m.named_modules()]


def _unchanged(m, state, modules):
    assert _state(m)[1] == modules
    assert not any(k.startswith("_addnorm") or k == "forward" for mod in m.modules() for k in mod.__dict__)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in state.items())


class _NoPreEps(hf.DeepseekV4HyperConnection):
    """A connection of another convention (no eps on its collapse)."""

    def forward(self, hidden_streams):
        post, comb, collapsed = super().forward(hidden_streams)
        return post, comb, collapsed - self.hc_eps * hidden_streams.sum(-2)


class _EinsumLayer(hf.DeepseekV4DecoderLayer):
    """DeepSeek-V4's layer with its writes spelled another way."""

    def forward(self, hidden_states, input_ids=None, **kwargs):
        post, comb, collapsed = self.attn_hc(hidden_states)
        attn_output, _ = self.self_attn(self.input_layernorm(collapsed), **kwargs)
        hidden_states = (torch.einsum("btn,btc->btnc", post, attn_output)
                         + torch.einsum("btjk,btjc->btkc", comb, hidden_states))
        post, comb, collapsed = self.ffn_hc(hidden_states)
        mlp_output = self.mlp(self.post_attention_layernorm(collapsed), input_ids=input_ids)
        return (torch.einsum("btn,btc->btnc", post, mlp_output)
                + torch.einsum("btjk,btjc->btkc", comb, hidden_states))


def test_what_cannot_be_matched_is_refused_by_name_before_anything_changes():
    m = build("DeepseekV4")
    m.model.layers[1].ffn_hc.hc_eps = 0.1  # large, so that the other convention shows on the probe
    m.model.layers[1].ffn_hc.__class__ = _NoPreEps
    state, modules = _state(m)
    with pytest.raises(NotImplementedError, match=r"model\.layers\.1\.ffn_hc \(_NoPreEps\) is a hyper-connection "
                                                  r"whose read and write addnorm does not reproduce"):
        patch_hf_model(m)
    _unchanged(m, state, modules)

    m = build("DeepseekV4")
    m.model.layers[0].__class__ = _EinsumLayer
    state, modules = _state(m)
    with pytest.raises(NotImplementedError, match=r"model\.layers\.0: _EinsumLayer reads its stream through attn_hc, "
                                                  r"ffn_hc, but addnorm found 0 writes of it"):
        patch_hf_model(m)
    _unchanged(m, state, modules)


def test_unpatch_takes_the_hyper_connections_back():
    ref_m = build("DeepseekV4")
    m = patch_hf_model(copy.deepcopy(ref_m))
    assert sum("_addnorm_hyper" in mod.__dict__ for mod in m.modules()) == 5
    unpatch_hf_model(m)
    assert not any(k.startswith("_addnorm") or k == "forward" for mod in m.modules() for k in mod.__dict__)
    with torch.no_grad():
        assert torch.equal(m(IDX).logits, ref_m(IDX).logits)


def test_glm5_nexts_text_layers_are_fused_as_deepseeks():
    """GLM-5-next (built by transformers as a vision-language model, not a causal LM) holds DeepSeek-V4's connection
    in its text layers: each read and write fused the same way, exact. Its final collapse is a plain mean over the
    streams, no hyper-connection (nothing of it is counted); its vision blocks keep their own forwards."""
    G = pytest.importorskip("transformers.models.glm5_next.modeling_glm5_next",
                            reason="transformers without GLM-5-next")
    text = dict(vocab_size=96, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, v_head_dim=16, index_topk=8, index_kpool=4,
                index_head_dim=16, index_n_heads=2, linear_head_dim=16, linear_num_heads=4, pad_token_id=0,
                max_position_embeddings=64, layer_types=["linear_attention", "indexed_attention"],
                mlp_layer_types=["dense", "sparse"])
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=2)
    torch.manual_seed(0)
    ref_m = G.Glm5NextForConditionalGeneration(T.Glm5NextConfig(text_config=text, vision_config=vision)).eval()
    m = patch_hf_model(copy.deepcopy(ref_m))
    r = m._addnorm_patched
    assert r["layers"] == 2 and r["final_collapse"] == 0
    first, last = r["per_layer"].values()
    assert first == {"hyper-connection read": 2, "hyper-connection write": 2, "write+read hand-off": 2}
    assert last == {"hyper-connection read": 2, "hyper-connection write": 2, "write+read hand-off": 1}
    with torch.no_grad():
        assert (m(input_ids=IDX).logits - ref_m(input_ids=IDX).logits).abs().max() <= 1e-5
