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


def test_the_probe_compares_a_model_that_returns_a_plain_tensor():
    class Wrong(E.PreNorm):  # the rewrite cannot see that this layer's sum is not what it returns
        def forward(self, x):
            return x + self.fc(self.norm(x)) * 0

    m = E.Model(E.PreNorm, plain_tensor=True)
    m.layers[0].__class__ = Wrong
    m.layers[0].forward = lambda x, _m=m.layers[0]: E.PreNorm.forward(_m, x)  # patched: differs from its class
    with pytest.raises(NotImplementedError, match="changed the model's outputs"):
        patch_hf_model(m)


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
