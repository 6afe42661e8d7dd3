"""patch_hf_model where a user's code or model goes off the usual path (each found by an adversarial
review): the result is always what the unpatched model computes."""

import copy
import io

import pytest
import torch

T = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")

from addnorm.interop import patch_hf_model  # noqa: E402

import edge_layers as E  # noqa: E402
from test_patch import IDX, build  # noqa: E402


def _out(m, ids):
    o = m(ids)
    return o if isinstance(o, torch.Tensor) else o.logits


@pytest.mark.parametrize("layer", [E.LoopNormAdd, E.BranchNormAdd, E.InplaceOther, E.PreNorm])
@pytest.mark.parametrize("plain_tensor", [False, True])
def test_the_rewrite_keeps_what_the_layer_computes(layer, plain_tensor):
    torch.manual_seed(0)
    ref = E.Model(layer, plain_tensor).eval()
    m = patch_hf_model(copy.deepcopy(ref))
    for batch in (1, 2, 4):  # BranchNormAdd's if is taken only at batch 4, which the probe never runs
        ids = torch.randint(0, E.V, (batch, 5), generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            assert (_out(m, ids) - _out(ref, ids)).abs().max() <= 1e-5, (layer.__name__, batch)


def test_the_probe_compares_a_model_that_returns_a_plain_tensor(monkeypatch):
    import addnorm.interop.patch as P
    m = E.Model(E.PreNorm, plain_tensor=True)
    want = m(torch.randint(0, E.V, (2, 5), generator=torch.Generator().manual_seed(0)))
    # a rewritten forward that computes something else: the probe must see it and undo the patch
    monkeypatch.setattr(P, "_rewritten_forward", lambda layer, *a, **k: type(layer).forward(layer, *a, **k) * 0)
    with pytest.raises(NotImplementedError, match="changed the model's outputs"):
        patch_hf_model(m)
    assert all("forward" not in mod.__dict__ for mod in m.modules())
    torch.testing.assert_close(m(torch.randint(0, E.V, (2, 5), generator=torch.Generator().manual_seed(0))), want)


def test_a_forward_some_other_code_put_on_the_instance_is_left_alone():
    """A module whose instance holds its own forward (not addnorm's, not an accelerate hook) keeps it: replacing it
    would drop whatever that wrapper does, and unpatching would have popped it."""
    m = E.Model(E.PreNorm, plain_tensor=True)
    theirs = lambda x, _m=m.layers[0]: E.PreNorm.forward(_m, x) * 2  # noqa: E731
    m.layers[0].forward = theirs
    ids = torch.randint(0, E.V, (2, 5), generator=torch.Generator().manual_seed(0))
    want = m(ids)
    patch_hf_model(m)
    assert m.layers[0].__dict__["forward"] is theirs
    torch.testing.assert_close(m(ids), want)


def test_a_detached_layer_output_gets_no_gradient_through_the_hand_off():
    ref, m = build("Llama"), patch_hf_model(build("Llama"))
    kept = []  # the hook keeps the original output alive: its memory is the detached tensor's
    for model in (ref, m):
        model.model.layers[0].register_forward_hook(lambda mod, a, out: kept.append(out) or out.detach())
    g_ref = torch.autograd.grad(ref(IDX, labels=IDX).loss, ref.model.layers[0].mlp.down_proj.weight,
                                allow_unused=True)[0]
    g = torch.autograd.grad(m(IDX, labels=IDX).loss, m.model.layers[0].mlp.down_proj.weight, allow_unused=True)[0]
    assert g_ref is None and g is None


def test_a_hook_on_a_norm_registered_after_patching_runs():
    ref, m = build("Llama"), patch_hf_model(build("Llama"))
    for model in (ref, m):
        for layer in model.model.layers:
            layer.post_attention_layernorm.register_forward_hook(lambda mod, a, out: out * 2)
        model.model.norm.register_forward_hook(lambda mod, a, out: out * 0.5)
    with torch.no_grad():
        assert (m(IDX).logits - ref(IDX).logits).abs().max() <= 1e-5


def test_eps_changed_after_patching_and_rmsnorm_with_eps_none():
    ref, m = build("Llama"), patch_hf_model(build("Llama"))
    for model in (ref, m):
        for mod in model.modules():
            if hasattr(mod, "variance_epsilon"):
                mod.variance_epsilon = 0.5
    with torch.no_grad():
        assert (m(IDX).logits - ref(IDX).logits).abs().max() <= 1e-5
    torch.manual_seed(0)
    ref = E.Model(E.PreNorm).eval()
    ref.layers[0].norm = torch.nn.RMSNorm(E.D, eps=None)
    m = patch_hf_model(copy.deepcopy(ref))
    ids = torch.randint(0, E.V, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref.emb.weight.mul_(1e-4), m.emb.weight.mul_(1e-4)  # activations small enough for eps to matter
        assert (m(ids).logits - ref(ids).logits).abs().max() <= 1e-5


def test_each_modules_train_or_eval_mode_is_kept():
    m = build("Llama").train()
    m.model.layers[1].eval()
    modes = [(n, mod.training) for n, mod in m.named_modules()]
    patch_hf_model(m)
    assert [(n, mod.training) for n, mod in m.named_modules()] == modes


def test_inference_mode_and_saving_with_an_output_still_waiting():
    ref, m = build("Llama"), patch_hf_model(build("Llama"))
    with torch.inference_mode():
        assert (m(IDX).logits - ref(IDX).logits).abs().max() <= 1e-5
    h = m.model.embed_tokens(IDX)
    pos = m.model.rotary_emb(h, torch.arange(IDX.shape[1]).unsqueeze(0))
    m.model.layers[1](h, position_embeddings=pos)  # the last layer leaves the final norm's output waiting
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    again = torch.load(buf, weights_only=False)
    with torch.no_grad():
        assert (again(IDX).logits - ref(IDX).logits).abs().max() <= 1e-5


def test_a_function_monkeypatched_in_the_layers_module_is_seen(monkeypatch):
    torch.manual_seed(0)
    ref = E.Model(E.Gated).eval()
    m = patch_hf_model(copy.deepcopy(ref))
    monkeypatch.setattr(E, "gate", lambda t: 3 * t)
    ids = torch.randint(0, E.V, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (m(ids).logits - ref(ids).logits).abs().max() <= 1e-5


def _steered_llama():
    """A Llama whose decoder layers are a user's subclass: super().forward() plus a steering vector."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    class SteeredLayer(LlamaDecoderLayer):
        def __init__(self, config, idx):
            super().__init__(config, idx)
            self.register_buffer("steer", torch.zeros(config.hidden_size))

        def forward(self, hidden_states, *args, **kwargs):
            return super().forward(hidden_states, *args, **kwargs) + self.steer

    ref = build("Llama")
    for i, layer in enumerate(ref.model.layers):
        new = SteeredLayer(ref.config, i)
        new.load_state_dict(layer.state_dict(), strict=False)
        ref.model.layers[i] = new
    return ref.eval()


def test_a_subclass_that_calls_super_forward_keeps_what_it_adds():
    """Found by review: its forward cannot be rewritten (super() needs the closure), and the structure's generic
    forward stood in for it, dropping the steering vector (0.50 on the logits once it was set after patching)."""
    ref = _steered_llama()
    m = patch_hf_model(copy.deepcopy(ref))
    for x in (ref, m):
        x.model.layers[0].steer.fill_(1.0)
    with torch.no_grad():
        torch.testing.assert_close(m(IDX).logits, ref(IDX).logits, atol=1e-5, rtol=1e-5)
    assert "forward" not in m.model.layers[0].__dict__  # its own forward; its norms are patched
    assert m._addnorm_patched["norms"] > 0


def test_accelerate_hooks_survive_patching_and_unpatching():
    """accelerate's add_hook_to_module puts its wrapper in the instance's forward (device_map relies on it): the patch
    had overwritten it and unpatch_hf_model popped it, for good."""
    hooks = pytest.importorskip("accelerate.hooks", reason="accelerate not installed")
    from addnorm.interop import unpatch_hf_model
    calls = []

    class Count(hooks.ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            calls.append(type(module).__name__)
            return args, kwargs

    ref = build("Llama")
    m = copy.deepcopy(ref)
    for layer in m.model.layers:
        hooks.add_hook_to_module(layer, Count())
    hooks.add_hook_to_module(m.model.norm, Count())
    patch_hf_model(m)
    calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(m(IDX).logits, ref(IDX).logits, atol=1e-5, rtol=1e-5)
    assert len(calls) == len(m.model.layers) + 1
    assert m._addnorm_patched["fused_adds"] > 0  # the layers are patched, inside their hooks
    unpatch_hf_model(m)
    calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(m(IDX).logits, ref(IDX).logits, atol=1e-5, rtol=1e-5)
    assert len(calls) == len(m.model.layers) + 1
    assert "_addnorm_old_forward" not in m.model.layers[0].__dict__


def test_group_norm_is_not_taken_for_a_layer_norm():
    """GroupNorm(1, C) acts as a LayerNorm on a 2-D probe but normalizes (C, L) together: patched, an (N, C, L)
    input with L == C was normalized over L alone (7.4 off); PoolFormer's GroupNorm subclass too."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(8, 8, 3, padding=1)
            self.gn = torch.nn.GroupNorm(1, 8)
            self.ln = torch.nn.LayerNorm(8)

        def forward(self, x):
            return self.ln(self.gn(self.conv(x)))

    torch.manual_seed(0)
    net = Net()
    torch.nn.init.normal_(net.gn.weight)
    torch.nn.init.normal_(net.gn.bias)
    x = torch.randn(2, 8, 8)
    want = net(x)
    patch_hf_model(torch.nn.ModuleList([net]))  # a stack of one layer: patch_hf_model refuses a model without one
    assert "forward" not in net.gn.__dict__ and "forward" in net.ln.__dict__
    torch.testing.assert_close(net(x), want)


def test_a_sequence_classifier_without_a_pad_token_can_be_patched():
    """HF refuses batches > 1 without a pad token; the patch's probe ran two rows, so the patch (verify or not) failed."""
    cfg = build("Llama").config
    cfg.pad_token_id = None
    torch.manual_seed(0)
    ref = T.LlamaForSequenceClassification(cfg).eval()
    m = patch_hf_model(copy.deepcopy(ref))
    with torch.no_grad():
        torch.testing.assert_close(m(IDX[:1]).logits, ref(IDX[:1]).logits, atol=1e-5, rtol=1e-5)


def test_a_layer_whose_add_is_not_plain_is_refused_not_patched_wrong():
    """Beam's layer adds through depth_scaled_residual_add(h, residual, idx) -- no `+` in its forward for the
    rewrite -- and its modules' names are Gemma 2's sandwich: the structure's generic forward, with its plain add,
    rescaled the stream by sqrt(3) while the logits, behind RMSNorm's scale invariance, moved by 6e-7. The probe
    now compares every hidden state, and the patch is refused with nothing changed."""
    m = build("Beam")
    ref = copy.deepcopy(m)
    try:
        patch_hf_model(m)
    except NotImplementedError as e:
        assert "nothing was changed" in str(e)
    with torch.no_grad():
        a, b = m(IDX, output_hidden_states=True), ref(IDX, output_hidden_states=True)
    for x, y in zip(a.hidden_states, b.hidden_states):  # patched or refused, the stream is HF's
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_nemotron_with_trained_norm_weights_is_patched_exactly(seed):
    """LayerNorm1P rounds 1 + w to the weight's dtype before the norm; addnorm adds the offset in float32. In the
    bfloat16 probe that is an ulp of the terms, which the check relative to each output refused wherever a bias
    cancelled the output to near 0: every trained Nemotron was refused, only the fresh init (w = 0) patched."""
    m = build("Nemotron")
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    ref = copy.deepcopy(m)
    patch_hf_model(m)
    assert m._addnorm_patched["norms"] > 0 and m._addnorm_patched["fused_adds"] > 0
    with torch.no_grad():
        torch.testing.assert_close(m(IDX).logits, ref(IDX).logits, atol=1e-5, rtol=1e-5)


def test_a_float16_norms_convention_does_not_depend_on_its_weights():
    """The float32 check once ran in the module's own dtype: an ulp of float16 rounding refused the right
    convention for some weights (2 of 20 seeds for a LayerNorm(256)), and a float16 Falcon lost fused adds."""
    from addnorm.interop.patch import probe_convention
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        norm = torch.nn.LayerNorm(256).half()
        with torch.no_grad():
            norm.weight.copy_(torch.randn(256, generator=g) * 0.3 + 1)
            norm.bias.copy_(torch.randn(256, generator=g) * 0.3)
        conv = probe_convention(norm)
        assert conv is not None and conv.kind == "layer" and conv.weight_offset == 0.0, (seed, conv)


def test_data_parallel_replicas_are_refused_by_name():
    """nn.DataParallel's replicate copies a module's __dict__: the patched forward, a partial of the module, ran
    the original's parameters in every replica (a review scaled the replicas' copies and saw logits 2.1 off)."""
    m = patch_hf_model(build("Llama"))
    layer = m.model.layers[0]
    with pytest.raises(RuntimeError, match="nn.DataParallel cannot replicate.*use DistributedDataParallel"):
        layer._replicate_for_data_parallel()  # what torch.nn.parallel.replicate calls on every module
    from addnorm.interop import unpatch_hf_model

    unpatch_hf_model(m)
    assert all("_replicate_for_data_parallel" not in mod.__dict__ for mod in m.modules())


def test_a_composite_config_is_verified_through_its_text_config(monkeypatch):
    """A vision-language config keeps vocab_size in its text config: the probe returned None, so verify=True
    compared None with None and accepted a wrong patch, and the hand-offs were never found."""
    import transformers as T

    from addnorm.interop import conventions as C

    vc = T.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                            image_size=32, patch_size=16)
    text = build("Llama").config
    cfg = T.LlavaConfig(vision_config=vc, text_config=text, image_token_index=text.vocab_size - 1)
    torch.manual_seed(0)
    llava = T.LlavaForConditionalGeneration(cfg).eval()
    assert "sum+norm hand-off" in patch_hf_model(copy.deepcopy(llava))._addnorm_patched["fusions"]["LlamaDecoderLayer"]
    real = C.apply
    monkeypatch.setattr(C, "apply", lambda *a, **k: (lambda y, s: (y * 1.01, s))(*real(*a, **k)))
    with pytest.raises(NotImplementedError, match="changed the model's outputs on a probe"):
        patch_hf_model(llava)


def test_fused_adds_that_cannot_be_verified_are_refused_unless_asked():
    import types

    class Wrapper(torch.nn.Module):  # decoder layers inside a model whose config has no vocab_size
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, types.SimpleNamespace()

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids).logits

    m = Wrapper(build("Llama"))
    with pytest.raises(NotImplementedError, match="cannot verify the fused adds"):
        patch_hf_model(m)
    assert "forward" not in m.inner.model.layers[0].__dict__
    want = m(IDX)
    patch_hf_model(m, verify=False)  # asked for: patched, unchecked
    assert "forward" in m.inner.model.layers[0].__dict__
    torch.testing.assert_close(m(IDX), want)


def test_a_float64_llama_is_refused_naming_its_norms_and_why():
    """HF's Llama RMSNorm computes in float32 even in a float64 model: no convention reproduces it at float64, and
    the refusal said only 'no decoder layer or norm addnorm can patch'."""
    m = build("Llama").double()
    with pytest.raises(ValueError, match=r"its norms \(LlamaRMSNorm \(torch.float64\)\) follow no convention"):
        patch_hf_model(m)


def test_a_forward_whose_decorator_cannot_take_the_rewrite_keeps_its_own():
    """HF's auto_docstring reads the path of the decorated function's source file: applied again to a rewritten
    forward it raised IndexError out of patch_hf_model (GLM-5-next's vision blocks). Such a layer keeps its own
    forward; its norms are still patched."""
    ref = E.Model(E.DocumentedPreNorm, plain_tensor=True)
    m = patch_hf_model(copy.deepcopy(ref))
    assert all("forward" not in layer.__dict__ and "forward" in layer.norm.__dict__ for layer in m.layers)
    ids = torch.randint(0, E.V, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(m(ids), ref(ids), atol=1e-5, rtol=1e-5)
