"""patch_hf_model on the HF decoder families it recognises by structure (tiny models built offline): exact
outputs, gradients and generation; training semantics intact; refusals that change nothing."""

import copy
import inspect
import io

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
T = transformers

import addnorm  # noqa: E402
from addnorm.interop import patch_hf_model, unpatch_hf_model  # noqa: E402

V = 96
_COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
               head_dim=16)
# Every family, and how many residual adds its 2-layer model has: 4 for a sequential layer (attention add,
# MLP add), 2 for a parallel one (x + attn + mlp). Every one must be fused (``fused_adds``): an add with the
# norm after it, a post-branch norm with its add, or a sum handed off to the norms that read it next.
SEQUENTIAL = ["Llama", "Mistral", "Mixtral", "Qwen2", "Qwen2Moe", "Qwen3", "Qwen3Moe", "SmolLM3", "Olmo", "Helium",
              "Ministral", "Gemma", "Gemma2", "Glm4", "Granite", "Phi3", "Glm", "Starcoder2", "StableLm", "Arcee",
              "Ernie4_5", "HunYuanDenseV1",
              # post-branch norms (norm then add)
              "Olmo2", "Olmo3", "Exaone4", "Apertus",
              # attribute names the old matcher did not know
              "Bloom", "OPT", "BioGpt", "XGLM", "Mpt", "GraniteMoe", "JetMoe", "VaultGemma",
              # refused before: GPT-Neo's attention call, Nemotron's LayerNorm1P (a (1 + w) LayerNorm)
              "GPTNeo", "Nemotron"]
PARALLEL = ["GPTJ", "GPTNeoX", "Phi", "Falcon", "CodeGen", "Cohere", "Cohere2"]
# a widened stream (B, T, n, C) and hyper-connections without a mixing matrix: each layer reads the stream twice
# (the collapse, with its own norm) and writes it twice (the expand), every write fused with the read that follows
# it (the same layer's second read, the next layer's first, the final collapse)
HYPER = ["HYV4", "Qwen4Exp"]
# the same with mHC's mixing matrix (DeepSeek-V4): each write is the expand and the mix H_res X (test_patch_mhc)
MHC = ["DeepseekV4"]
FAMILIES = ["GPT2"] + SEQUENTIAL + PARALLEL + HYPER + MHC
# what a family's config needs beyond the common sizes (rotary dims that fit head_dim 16)
_EXTRA = {"GPTJ": dict(rotary_dim=8), "CodeGen": dict(rotary_dim=8, n_ctx=64),
          "GPTNeo": dict(attention_types=[[["global", "local"], 1]]),
          # a dense layer and a MoE layer; hc_magnitude other than DeepSeek's fixed 2
          "HYV4": dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, q_lora_rank=32,
                       kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, index_topk=4,
                       index_head_dim=16, index_n_heads=2, hc_mult=3, hc_magnitude=1.5, hc_eps=1e-3),
          # DeepSeek-V4's MoE, low-rank attention and compressor at a tiny size
          "DeepseekV4": dict(moe_intermediate_size=32, q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2,
                             o_groups=2, o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4,
                             sliding_window=8),
          # a linear-attention layer and an indexed-attention layer
          "Qwen4Exp": dict(linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                           linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                           num_experts=4, num_experts_per_tok=2, hc_count=3, hc_lowrank=8, indexer_n_heads=2,
                           indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=4, indexer_compress_ratio=2,
                           layer_types=["linear_attention", "indexed_attention"])}
_CONFIG = {"Qwen4Exp": "Qwen4ExpTextConfig"}  # its Qwen4ExpConfig is the vision-language one


def expected_fusions(name) -> dict:
    """What every layer of a family's 2-layer model fuses: its residual adds (4 in a sequential model, 2 in a
    parallel one), or its hyper-connections' reads, writes and write+read hand-offs and the final collapse."""
    if name in HYPER or name in MHC:
        return {"fused_adds": 2 * 6 + 1, "per_layer": {"hyper-connection read": 2, "hyper-connection write": 2,
                                                       "write+read hand-off": 2}, "final_collapse": 1}
    return {"fused_adds": 2 if name in PARALLEL else 4}


def assert_fused_as_expected(name, report):
    want = expected_fusions(name)
    assert report["fused_adds"] == want["fused_adds"], report
    if "per_layer" in want:
        assert report["final_collapse"] == want["final_collapse"], report
        assert list(report["per_layer"].values()) == [want["per_layer"]] * 2, report


def build(name, dtype=torch.float32):
    torch.manual_seed(0)
    if name == "GPT2":
        m = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=V, n_positions=64, n_layer=2, n_head=4, n_embd=64,
                                           bos_token_id=0, eos_token_id=0))
    else:
        cfg_cls, cls = getattr(T, _CONFIG.get(name, f"{name}Config"), None), getattr(T, f"{name}ForCausalLM", None)
        if cfg_cls is None or cls is None:
            pytest.skip(f"transformers {T.__version__} has no {name}")
        common = {k: v for k, v in _COMMON.items() if not (name == "Falcon" and k == "head_dim")}
        try:
            cfg = cfg_cls(**_EXTRA.get(name, {}), **common)
        except (TypeError, ValueError):  # a config that checks its sizes in __init__: set them afterwards
            cfg = cfg_cls(**_EXTRA.get(name, {}))
            for k, v in common.items():
                setattr(cfg, k, v)
        layer_types = getattr(cfg, "layer_types", None)
        if isinstance(layer_types, list) and len(layer_types) != cfg.num_hidden_layers:
            cfg.layer_types = layer_types[:cfg.num_hidden_layers]  # so that save/load validates
        m = cls(cfg)
    return m.to(dtype).eval()


IDX = torch.randint(1, V, (2, 10), generator=torch.Generator().manual_seed(1))


def _loss_and_grads(m, **kw):
    out = m(IDX, labels=IDX, **kw)
    return out.logits, torch.autograd.grad(out.loss, [p for p in m.parameters() if p.requires_grad],
                                           allow_unused=True)


def _assert_same(m, ref, **kw):
    logits, grads = _loss_and_grads(m, **kw)
    logits_ref, grads_ref = _loss_and_grads(ref, **kw)
    assert (logits - logits_ref).abs().max() <= 1e-5
    for a, b in zip(grads, grads_ref):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", FAMILIES)
def test_patched_family_is_exact_and_every_add_is_fused(name):
    ref = build(name)
    m = copy.deepcopy(ref)
    params = {k: id(p) for k, p in m.named_parameters()}
    keys = list(m.state_dict())
    patch_hf_model(m)
    report = m._addnorm_patched
    assert_fused_as_expected(name, report)
    assert report["norms"] >= 3 and report["fusions"]
    assert {k: id(p) for k, p in m.named_parameters()} == params and list(m.state_dict()) == keys
    _assert_same(m, ref)
    gen = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(m.generate(IDX[:1], **gen), ref.generate(IDX[:1], **gen))


@pytest.mark.parametrize("name", FAMILIES)
def test_the_report_counts_decoder_layers(name):
    """``layers`` is the number of decoder layers, whatever was rewritten in them: BLOOM's attention and MLP (each
    adds its residual inside) made 4 of its 2 layers, MPT's likewise, and Qwen4-exp's linear-attention layer (no
    norm addnorm patches in it) was not counted at all. ``per_layer`` says what each one fuses."""
    report = patch_hf_model(build(name))._addnorm_patched
    assert report["layers"] == 2, report
    assert [k.rsplit(".", 1)[-1] for k in report["per_layer"]] == ["0", "1"], report  # the decoder layers' names
    assert sum(n for f in report["per_layer"].values() for n in f.values()) + report.get("final_collapse", 0) == \
        report["fused_adds"], report


def _count_handoffs(monkeypatch):
    from addnorm.interop import handoff

    taken = []
    real = handoff.take

    def spy(norm, x):
        y = real(norm, x)
        taken.append(y is not None)
        return y

    monkeypatch.setattr(handoff, "take", spy)
    return taken


@pytest.mark.parametrize("name, readers", [("Llama", 2), ("GPTNeoX", 3), ("OPT", 4), ("Bloom", 4)])
def test_the_handed_off_outputs_are_the_ones_the_norms_use(name, readers, monkeypatch):
    """The norms that read a fused sum take the output left for them (GPT-NeoX: the next layer's two input
    norms and the final norm; OPT: through its reshape of the stream), rather than computing it again."""
    m = patch_hf_model(build(name))
    taken = _count_handoffs(monkeypatch)
    with torch.no_grad():
        m(IDX)
    assert sum(taken) == readers, taken


def test_a_hook_that_replaces_or_edits_a_layers_output_is_seen(monkeypatch):
    """A handed-off output is used only for that very tensor, unmodified: a hook that returns a new tensor,
    or edits the output in place, gets the norm of what it made."""
    for edit in ("replace", "in_place"):
        ref, m = build("Llama"), patch_hf_model(build("Llama"))
        for model in (ref, m):
            def hook(mod, args, out, edit=edit):
                if edit == "replace":
                    return out * 1.5
                out.mul_(1.5)
                return out
            model.model.layers[0].register_forward_hook(hook)
        with torch.no_grad():
            assert (m(IDX).logits - ref(IDX).logits).abs().max() <= 1e-5, edit


def test_padding_masks_hidden_states_and_attentions_are_unchanged():
    ids = IDX.clone()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding, with explicit positions
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    for name in ("Llama", "GPTNeoX", "Olmo2", "OPT"):
        ref = build(name)
        ref.config._attn_implementation = "eager"
        m = patch_hf_model(copy.deepcopy(ref))
        kw = dict(attention_mask=mask, output_hidden_states=True, output_attentions=True)
        if name != "OPT":
            kw["position_ids"] = pos
        with torch.no_grad():
            out, out_ref = m(ids, **kw), ref(ids, **kw)
        assert (out.logits - out_ref.logits).abs().max() <= 1e-5, name
        for a, b in zip(out.hidden_states, out_ref.hidden_states):
            assert (a - b).abs().max() <= 1e-5, name
        for a, b in zip(out.attentions, out_ref.attentions):
            assert (a - b).abs().max() <= 1e-6, name


@pytest.mark.parametrize("name", FAMILIES)
def test_bfloat16_error_no_worse_than_hfs_own(name):
    exact = build(name)(IDX).logits.double()
    hf16 = build(name, torch.bfloat16)
    ours16 = patch_hf_model(copy.deepcopy(hf16))
    err_hf = (hf16(IDX).logits.double() - exact).abs().max().item()
    err_ours = (ours16(IDX).logits.double() - exact).abs().max().item()
    assert_fused_as_expected(name, ours16._addnorm_patched)
    assert err_ours <= 1.05 * err_hf, f"{err_ours:.3g} vs HF's own {err_hf:.3g}"


def _unchanged(m, state, modules):
    assert [(n, type(mod)) for n, mod in m.named_modules()] == modules
    assert not any(k in mod.__dict__ for mod in m.modules() for k in ("forward", "_addnorm_plan", "_addnorm_convention"))
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in state.items())


class _DoubledNorm(torch.nn.Module):
    """A norm no convention reproduces (twice Llama's)."""

    def __init__(self, norm):
        super().__init__()
        self.weight, self.variance_epsilon = norm.weight, norm.variance_epsilon

    def forward(self, x):
        h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return 2 * self.weight * h.to(x.dtype)


def test_a_layer_whose_norm_follows_no_convention_is_refused_before_anything_changes():
    m = build("Llama")
    m.model.layers[1].post_attention_layernorm = _DoubledNorm(m.model.layers[1].post_attention_layernorm)
    state, modules = {k: v.clone() for k, v in m.state_dict().items()}, [(n, type(x)) for n, x in m.named_modules()]
    with pytest.raises(NotImplementedError, match="follows no known norm convention.*supported: fused"):
        patch_hf_model(m)
    _unchanged(m, state, modules)


def test_a_layer_that_only_looks_sequential_keeps_its_own_forward():
    """A user's subclass with Llama's attributes but its own forward (no residual around the MLP): its forward
    cannot be rewritten and is not the library's, so no structure's generic forward stands in for it (that was
    caught only by the probe, which undid the whole patch); the layer keeps its forward, its norms are patched."""
    m = build("Llama")
    layer = m.model.layers[0]
    own = type(layer).forward

    class NoResidual(type(layer)):  # Llama's attributes, but no residual around the MLP
        def forward(self, hidden_states, *args, **kwargs):
            h = own(self, hidden_states, *args, **kwargs)
            return h - hidden_states

    layer.__class__ = NoResidual
    with torch.no_grad():
        want = m(IDX).logits
    patch_hf_model(m)
    assert "forward" not in layer.__dict__ and "forward" in m.model.layers[1].__dict__
    assert "forward" in layer.input_layernorm.__dict__
    with torch.no_grad():
        torch.testing.assert_close(m(IDX).logits, want, atol=1e-5, rtol=1e-5)


def test_trainer_weight_decay_grouping_is_unchanged():
    # Trainer's own grouping, called without building a Trainer (that needs accelerate; the method reads only
    # the model): LayerNorm weights and anything named like a norm get no decay
    decay_names = T.Trainer.get_decay_parameter_names
    for name in ("GPT2", "Llama", "Gemma2"):
        ref = build(name)
        m = patch_hf_model(copy.deepcopy(ref))
        names = decay_names(None, m)
        assert names == decay_names(None, ref)
        assert not any("norm" in n or ".ln_" in n for n in names)


def test_patching_twice_is_a_no_op_and_unpatch_restores():
    ref = build("Llama")
    m = patch_hf_model(copy.deepcopy(ref))
    fwd = m.model.layers[0].forward
    patch_hf_model(m)
    assert m.model.layers[0].forward is fwd and m._addnorm_patched["layers"] == 2
    unpatch_hf_model(m)
    assert "forward" not in m.model.layers[0].__dict__ and not hasattr(m, "_addnorm_patched")
    assert torch.equal(m(IDX).logits, ref(IDX).logits)


@pytest.mark.parametrize("name", ["GPT2", "Llama"])
def test_save_and_load_of_a_patched_model(name, tmp_path):
    ref = build(name)
    m = patch_hf_model(copy.deepcopy(ref))
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert loaded._addnorm_patched == m._addnorm_patched
    assert torch.equal(loaded(IDX).logits, m(IDX).logits)
    m.save_pretrained(tmp_path)
    again = type(ref).from_pretrained(tmp_path).eval()
    assert torch.equal(again(IDX).logits, ref(IDX).logits)


# DeepSeek-V4: addnorm computes mHC's coefficients in float32 with autocast off, HF its projection in bf16 under it
@pytest.mark.parametrize("name", ["GPT2", "Llama", "Gemma2", "DeepseekV4"])
def test_autocast_and_gradient_checkpointing(name):
    ref = build(name)
    m = patch_hf_model(copy.deepcopy(ref))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, out_ref = m(IDX).logits, ref(IDX).logits
    assert out.dtype == out_ref.dtype
    torch.testing.assert_close(out.float(), out_ref.float(), atol=2e-2, rtol=2e-2)
    for model in (m, ref):
        model.train()
        model.config.use_cache = False
        model.gradient_checkpointing_enable()
    torch.manual_seed(5)  # dropout in training: the same draws, in the same order, for both
    logits, grads = _loss_and_grads(m)
    torch.manual_seed(5)
    logits_ref, grads_ref = _loss_and_grads(ref)
    torch.testing.assert_close(logits, logits_ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, grads_ref):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_patch_refuses_what_has_no_decoder_layer():
    with pytest.raises(ValueError, match="has no decoder layer"):
        patch_hf_model(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert addnorm.last_backend() in (None, "cpu", "torch", "triton")


def test_a_norm_that_refuses_mixed_dtypes_is_still_probed():
    """torch's CUDA LayerNorm raises on a bf16 input beside float32 weights (its CPU one accepts it); the
    probe used to give up on such a norm, so patch_hf_model refused GPT-2 on a GPU (seen on an H100)."""
    from torch import nn

    from addnorm.interop.patch import probe_convention

    class StrictLayerNorm(nn.LayerNorm):
        def forward(self, x):
            if x.dtype != self.weight.dtype:
                raise RuntimeError("expected scalar type BFloat16 but found Float")
            return super().forward(x)

    conv = probe_convention(StrictLayerNorm(64))
    assert conv is not None and conv.kind == "layer"


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_keeps_its_call_paths(name, tmp_path):
    """For every family: left padding with explicit positions and every hidden state, gradient checkpointing
    in training, cached decoding, Trainer's decay groups, save_pretrained to a plain HF checkpoint, and unpatch
    back to HF's own forward."""
    ref = build(name)
    m = patch_hf_model(copy.deepcopy(ref))
    mask = torch.ones_like(IDX)
    mask[0, :3] = 0
    kw = dict(attention_mask=mask, output_hidden_states=True)
    if "position_ids" in inspect.signature(type(ref).forward).parameters:
        kw["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        out, out_ref = m(IDX, **kw), ref(IDX, **kw)
    assert (out.logits - out_ref.logits).abs().max() <= 1e-5
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(out.hidden_states, out_ref.hidden_states))
    # cached decoding: one step after a prompt, from the cache
    with torch.no_grad():
        p, p_ref = m(IDX[:, :6], use_cache=True), ref(IDX[:, :6], use_cache=True)
        s = m(IDX[:, 6:7], past_key_values=p.past_key_values, use_cache=True)
        s_ref = ref(IDX[:, 6:7], past_key_values=p_ref.past_key_values, use_cache=True)
    assert (s.logits - s_ref.logits).abs().max() <= 1e-5
    assert T.Trainer.get_decay_parameter_names(None, m) == T.Trainer.get_decay_parameter_names(None, ref)
    m.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(type(ref).from_pretrained(tmp_path).eval()(IDX).logits, ref(IDX).logits)
    if ref.supports_gradient_checkpointing:  # JetMoE's does not
        for model in (m, ref):
            model.train()
            model.config.use_cache = False
            model.gradient_checkpointing_enable()
        torch.manual_seed(5)
        logits, grads = _loss_and_grads(m)
        torch.manual_seed(5)
        logits_ref, grads_ref = _loss_and_grads(ref)
        assert (logits - logits_ref).abs().max() <= 1e-5
        for a, b in zip(grads, grads_ref):
            if a is not None or b is not None:
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    unpatch_hf_model(m)
    m.eval(), ref.eval()
    with torch.no_grad():
        assert torch.equal(m(IDX).logits, ref(IDX).logits)


@pytest.mark.parametrize("name", ["Llama", "GPTNeoX"])
def test_a_patched_model_compiles(name):
    """torch.compile of a patched model: the rewritten forwards trace (their helpers live in a real module,
    as dynamo looks globals up by module name), and logits and gradients stay HF's."""
    ref = build(name)
    m = torch.compile(patch_hf_model(copy.deepcopy(ref)))
    _assert_same(m, ref)


def test_a_model_without_decoder_layers_is_refused_naming_replace_norms():
    """nn.Sequential(Linear, LayerNorm) was 'patched' (norms: 1) though it is no HF decoder: refused, naming the way
    to swap the norms of any model."""
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    with pytest.raises(ValueError, match=r"Sequential has no decoder layer .*addnorm\.nn\.replace_norms\(model\)"):
        patch_hf_model(m)
    assert "forward" not in m[1].__dict__ and not hasattr(m, "_addnorm_patched")  # nothing changed
