"""patch_hf_model on decoders whose residual stream is widened (B, T, n, C) and mixed by hyper-connections without a
mixing matrix: HY-V4 (its iHC and head) and Qwen4-exp (its gated low-rank residual and final mixer). HF's modules
against the float64 equations and addnorm's operators; every read, write and final collapse on addnorm's
operators, each write handed over to the read after it; refusals by name. (The generic exactness checks -- logits,
gradients, generation, bfloat16, padding, cache, checkpointing, save/load, unpatch -- run on both families in
test_patch.py.)"""

import copy

import pytest
import torch

T = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")

import addnorm.functional as AF  # noqa: E402
from addnorm.functional.hyper import PRODUCTS  # noqa: E402
from addnorm.interop import handoff, patch_hf_model, unpatch_hf_model  # noqa: E402
from addnorm.interop import hyper as H  # noqa: E402
from addnorm.reference import gated_streams as ref  # noqa: E402

import hyper_layers as HL  # noqa: E402
from test_patch import _EXTRA, HYPER, IDX, build  # noqa: E402

HY = pytest.importorskip("transformers.models.hy_v4.modeling_hy_v4", reason="transformers without HY-V4")
QW = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp", reason="transformers without Qwen4-exp")


def _randomized(module, seed=0):
    """HF's init leaves the gates near their constant start: random parameters make every term count."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module.eval()


def _stream(n, C, seed=1, flat=False):
    x = torch.randn(2, 5, n, C, generator=torch.Generator().manual_seed(seed)) * 2
    x[1] *= 1e-3  # tokens whose RMS is near eps
    return x.flatten(-2) if flat else x


def test_hy_v4s_modules_are_the_equations_and_addnorms_read():
    """HYV4HyperConnection and HYV4HyperHead against the float64 transcription of their equations, and addnorm's
    read with the convention probed from them (hc_magnitude, hc_eps, the config's rms_norm_eps)."""
    cfg = build("HYV4").config
    n, C = cfg.hc_mult, cfg.hidden_size
    for module, kind in ((HY.HYV4HyperConnection(cfg), "ihc"), (HY.HYV4HyperHead(cfg), "ihc_head")):
        module = _randomized(module)
        plan = H.probe_hyper(module)
        assert plan is not None and plan.kind == kind and (plan.n, plan.C) == (n, C)
        assert plan.convention == AF.ProjectedGates(cfg.rms_norm_eps, pre_eps=cfg.hc_eps,
                                                    post_scale=cfg.hc_magnitude if kind == "ihc" else 2.0,
                                                    post_eps=cfg.hc_eps if kind == "ihc" else 0.0)
        x = _stream(n, C)
        with torch.no_grad():
            want = module(x)
            if kind == "ihc":
                h64, _, post64 = ref.ihc_read(x, module.fn, module.scale, module.base, cfg.rms_norm_eps, cfg.hc_eps,
                                              cfg.hc_magnitude)
                torch.testing.assert_close(want[0].double(), post64, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(want[1].double(), h64, atol=1e-5, rtol=1e-5)
                h, _, post = AF.hyper_read(x, module.fn, module.scale, module.base, convention=plan.convention)
                got = (post, h)
            else:
                h64 = ref.ihc_head(x, module.hc_fn, module.hc_scale, module.hc_base, cfg.rms_norm_eps, cfg.hc_eps)
                torch.testing.assert_close(want.double(), h64, atol=1e-5, rtol=1e-5)
                got = (AF.hyper_read(x, module.hc_fn, module.hc_scale, module.hc_base, convention=plan.convention)[0],)
                want = (want,)
        for a, w in zip(got, want, strict=True):
            torch.testing.assert_close(a, w, atol=1e-6, rtol=1e-6)


def test_qwen4_exps_gated_residual_is_the_equations_and_addnorms_read():
    cfg = build("Qwen4Exp").config
    n, C = cfg.hc_count, cfg.hidden_size
    for module, kind in ((QW.Qwen4ExpTextGatedResidual(cfg), "gated"),
                         (QW.Qwen4ExpTextGatedResidual(cfg, use_combine=False), "gated_mixer")):
        module = _randomized(module)
        plan = H.probe_hyper(module)
        assert plan is not None and plan.kind == kind and plan.convention == AF.StreamNorm(cfg.rms_norm_eps)
        x = _stream(n, C, flat=True)
        inject = module.block_inject_weight
        with torch.no_grad():
            want = module(x)
            want = want if isinstance(want, tuple) else (want,)
            h64, a64 = ref.gated_read(x.unflatten(-1, (n, C)), module.hc_norm.weight.reshape(n, C), cfg.rms_norm_eps,
                                      module.input_mix_weight_down.weight, module.input_mix_weight_up.weight,
                                      None if inject is None else inject.weight)
            torch.testing.assert_close(want[0].double(), h64, atol=1e-5, rtol=1e-5)
            if inject is not None:
                torch.testing.assert_close(want[2].double(), a64, atol=1e-5, rtol=1e-5)
            # addnorm's read: its norm of the stream, the module's own low-rank gate, its gated collapse
            N = AF.stream_rms_norm(x.unflatten(-1, (n, C)), module.hc_norm.weight, convention=plan.convention)
            gate = torch.sigmoid(module.input_mix_weight_up(torch.nn.functional.silu(
                module.input_mix_weight_down(N.flatten(-2)) / n)))
            h = AF.gated_collapse(N, gate.unflatten(-1, (n, C)), rounding=PRODUCTS)
        torch.testing.assert_close(h, want[0], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", HYPER)
def test_the_writes_match_the_equations(name):
    """One layer's output, X + H_post^T y twice, against the float64 write of HF's own H_post and y."""
    m = patch_hf_model(build(name))
    layer = m.model.layers[0]
    seen = {}
    for attr in ("attn_hc", "ffn_hc", "attn_hyper_connection", "mlp_hyper_connection"):
        if hasattr(layer, attr):
            getattr(layer, attr).register_forward_hook(lambda mod, a, out, attr=attr: seen.__setitem__(attr, (a[0], out)))
    branch = layer.self_attn if hasattr(layer, "self_attn") else layer.linear_attn
    branch.register_forward_hook(lambda mod, a, out: seen.__setitem__("attn_out", out[0] if isinstance(out, tuple) else out))
    layer.mlp.register_forward_hook(lambda mod, a, out: seen.__setitem__("mlp_out", out))
    layer.register_forward_hook(lambda mod, a, out: seen.__setitem__("layer_out", out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        m(IDX)
    first, second = [v for k, v in seen.items() if k not in ("attn_out", "mlp_out", "layer_out")]
    coeff = (lambda out: out[0]) if name == "HYV4" else (lambda out: out[2])
    n = coeff(first[1]).shape[-1]
    shape = seen["layer_out"].shape
    x = first[0].reshape(*shape[:2], n, -1)
    mid = ref.expand(x, seen["attn_out"], coeff(first[1]))
    torch.testing.assert_close(second[0].reshape(mid.shape).double(), mid, atol=1e-5, rtol=1e-5)
    out = ref.expand(second[0].reshape(mid.shape), seen["mlp_out"], coeff(second[1]))
    torch.testing.assert_close(seen["layer_out"].reshape(out.shape).double(), out, atol=1e-5, rtol=1e-5)


def test_hy_v4s_layers_are_not_taken_for_llamas():
    """HY-V4's layer holds Llama's input_layernorm, self_attn, post_attention_layernorm and mlp: taken for one, its
    stream (B, T, n, C) went to the norm and attention without the hyper-connections, which raised 'too many values
    to unpack (expected 2)', and the patch was undone. A layer that holds hyper-connections is rewritten by its data
    flow instead."""
    m = patch_hf_model(build("HYV4"))
    for layer in m.model.layers:
        assert "_addnorm_plan" not in layer.__dict__
        assert {"attn_hc", "ffn_hc", "input_layernorm", "post_attention_layernorm"} <= layer._addnorm_sites


def _spy(monkeypatch):
    """Counts of addnorm's hyper-connection calls, and of the reads handed over by a write."""
    calls = {}
    for fn in ("hyper_read", "hyper_write", "hyper_write_read", "hyper_write_norm", "stream_rms_norm",
               "gated_collapse", "sigmoid_gated_collapse"):
        real = getattr(AF, fn)

        def spy(*a, _real=real, _fn=fn, **k):
            calls[_fn] = calls.get(_fn, 0) + 1
            return _real(*a, **k)

        monkeypatch.setattr(H.AF, fn, spy)
    real_take = handoff.take

    def take(module, x):
        y = real_take(module, x)
        if y is not None and "_addnorm_hyper" in module.__dict__:
            calls["handed over"] = calls.get("handed over", 0) + 1
        return y

    monkeypatch.setattr(handoff, "take", take)
    return calls


@pytest.mark.parametrize("name", HYPER)
def test_every_read_write_and_final_collapse_runs_on_addnorms_operators(name, monkeypatch):
    """2 layers: 4 writes, each computed together with the read after it (the same layer's second, the next
    layer's first, the final collapse) and handed over; the first layer's first read alone computes its own."""
    m = patch_hf_model(build(name))
    calls = _spy(monkeypatch)
    with torch.no_grad():
        m(IDX)
    if name == "HYV4":
        assert calls == {"hyper_read": 1, "hyper_write_read": 4, "handed over": 4}
    else:  # each gated read: its norm (computed by the write before it, but the first), the collapse after its gate
        assert calls == {"stream_rms_norm": 1, "hyper_write_norm": 4, "sigmoid_gated_collapse": 5, "handed over": 4}


@pytest.mark.parametrize("name", HYPER)
def test_under_gradient_checkpointing_each_read_computes_its_own(name, monkeypatch):
    """A checkpointed layer re-runs in backward and must record the same graph: no hand-over, each write and read
    on its own operator, and HF's gradients."""
    ref_m = build(name)
    m = patch_hf_model(copy.deepcopy(ref_m))
    for model in (m, ref_m):
        model.train()
        model.config.use_cache = False
        model.gradient_checkpointing_enable()
    calls = _spy(monkeypatch)
    torch.manual_seed(5)
    loss = m(IDX, labels=IDX).loss
    reads = {"HYV4": {"hyper_read": 5}, "Qwen4Exp": {"stream_rms_norm": 5, "sigmoid_gated_collapse": 5}}[name]
    assert calls == {**reads, "hyper_write": 4}
    grads = torch.autograd.grad(loss, list(m.parameters()), allow_unused=True)
    torch.manual_seed(5)
    want = torch.autograd.grad(ref_m(IDX, labels=IDX).loss, list(ref_m.parameters()), allow_unused=True)
    for a, b in zip(grads, want, strict=True):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_per_layer_embedding_between_the_write_and_the_read_is_kept():
    """Qwen4-exp's PLE adds to the stream at the start of a layer: the write before it has no read to hand over
    (reported so), and the model is still HF's."""
    extra = dict(_EXTRA["Qwen4Exp"], num_hidden_layers=3, ple_layer_ids=[2], ple_embed_dim=32, heads_per_ngram=2,
                 ngram_vocab_size_base=50, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=1,
                 layer_types=["linear_attention", "linear_attention", "indexed_attention"])
    torch.manual_seed(0)
    cfg = T.Qwen4ExpTextConfig(**extra, vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    ref_m = T.Qwen4ExpForCausalLM(cfg).eval()
    m = patch_hf_model(copy.deepcopy(ref_m))
    per_layer = m._addnorm_patched["per_layer"]
    assert [f.get("write+read hand-off", 0) for f in per_layer.values()] == [1, 2, 2]
    with torch.no_grad():
        assert (m(IDX).logits - ref_m(IDX).logits).abs().max() <= 1e-5
    gen = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(m.generate(IDX[:1], **gen), ref_m.generate(IDX[:1], **gen))


class _TripledPost(HY.HYV4HyperConnection):
    """A hyper-connection of HY-V4's shape whose expand gates are not HY-V4's."""

    def forward(self, hidden_streams):
        post, out = super().forward(hidden_streams)
        return 3 * post, out


class _OwnForward(HY.HYV4DecoderLayer):
    """A layer whose forward addnorm cannot read (super() needs its closure): its writes cannot be found."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


def _state(m):
    return {k: v.clone() for k, v in m.state_dict().items()}, [(n, type(x)) for n, x in m.named_modules()]


def test_what_cannot_be_matched_is_refused_by_name_before_anything_changes():
    m = build("HYV4")
    m.model.layers[1].ffn_hc.__class__ = _TripledPost
    state, modules = _state(m)
    with pytest.raises(NotImplementedError, match=r"model\.layers\.1\.ffn_hc \(_TripledPost\) is a hyper-connection "
                                                  r"whose read and write addnorm does not reproduce"):
        patch_hf_model(m)
    assert not any("forward" in mod.__dict__ for mod in m.modules()) and _state(m)[1] == modules

    m = build("HYV4")
    m.model.layers[0].__class__ = _OwnForward
    with pytest.raises(NotImplementedError, match=r"model\.layers\.0: _OwnForward reads its stream through attn_hc, "
                                                  r"ffn_hc, but addnorm found 0 writes of it"):
        patch_hf_model(m)
    assert not any("forward" in mod.__dict__ or "_addnorm_hyper" in mod.__dict__ for mod in m.modules())


@pytest.mark.parametrize("name", HYPER)
def test_unpatch_takes_the_hyper_connections_back(name):
    ref_m = build(name)
    m = patch_hf_model(copy.deepcopy(ref_m))
    assert sum("_addnorm_hyper" in mod.__dict__ for mod in m.modules()) == 5
    unpatch_hf_model(m)
    assert not any("forward" in mod.__dict__ or "_addnorm_hyper" in mod.__dict__ for mod in m.modules())
    with torch.no_grad():
        assert torch.equal(m(IDX).logits, ref_m(IDX).logits)


@pytest.mark.parametrize("layer, dtype", [(HL.StreamCast, torch.float32), (HL.StreamCast, torch.bfloat16),
                                          (HL.StreamFirst, torch.float32)], ids=str)
def test_other_spellings_of_a_write_keep_what_the_layer_computes(layer, dtype):
    """Written with the stream alone cast, or the stream first and no cast: each still found, and the patched model
    computes what the unpatched one does."""
    torch.manual_seed(0)
    ref_m = HL.Model(layer).to(dtype).eval()
    m = patch_hf_model(copy.deepcopy(ref_m))
    assert [f["hyper-connection write"] for f in m._addnorm_patched["per_layer"].values()] == [1, 1]
    assert m._addnorm_patched["final_collapse"] == 1
    ids = torch.randint(0, HL.V, (3, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = m(ids).logits, ref_m(ids).logits
    assert got.dtype == want.dtype
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2  # the norms' kernels: float32 rounding, or a bfloat16 ulp
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_a_write_addnorm_does_not_recognise_is_refused_by_name():
    m = HL.Model(HL.Einsum)
    with pytest.raises(NotImplementedError, match=r"Model: layers\.0: Einsum reads its stream through hc, but addnorm "
                                                  r"found 0 writes of it"):
        patch_hf_model(m)
    assert not any("forward" in mod.__dict__ or "_addnorm_hyper" in mod.__dict__ for mod in m.modules())


@pytest.mark.parametrize("name", HYPER)
def test_a_checkpoint_loaded_in_bfloat16_with_float32_hyper_connections(name, tmp_path):
    """from_pretrained(dtype=bfloat16) keeps HY-V4's gate parameters in float32 (_keep_in_fp32_modules_strict)
    beside a bfloat16 stream: the reads and writes take the mixed dtypes as HF's modules do."""
    build(name).save_pretrained(tmp_path)
    ref_m = type(build(name)).from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    m = patch_hf_model(copy.deepcopy(ref_m))
    assert list(m._addnorm_patched["per_layer"].values())[0]["write+read hand-off"] == 2
    with torch.no_grad():
        got, want = m(IDX).logits, ref_m(IDX).logits
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=1.6e-2, rtol=1.6e-2)
