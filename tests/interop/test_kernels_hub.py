"""addnorm's norms as HF `kernels` hub layers: kernels' own rules, kernelize() from the shipped local
repository with no network, exactness against HF's LlamaRMSNorm and torch's LayerNorm, torch.compile."""

import copy
import socket

import pytest
import torch
from torch import nn

kernels = pytest.importorskip("kernels", reason="HF `kernels` not installed (pip install -e '.[kernels]')")
if not hasattr(kernels, "kernelize"):  # without the package, `kernels` resolves to the tests/kernels folder
    pytest.skip("HF `kernels` not installed (pip install -e '.[kernels]')", allow_module_level=True)

import addnorm.functional as AF  # noqa: E402
from addnorm.interop import kernels_hub  # noqa: E402
from addnorm.interop.kernels_hub import LayerNorm, RMSNorm, kernel_mapping, layer_repository  # noqa: E402
from addnorm.kernels.cpu import availability  # noqa: E402
from kernels import Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping  # noqa: E402
from kernels.layer import layer as kernels_layer  # noqa: E402

# the backend addnorm's CPU calls report: its C kernels where they built, else the exact torch composite
CPU_BACKEND = "cpu" if availability().available else "torch"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No network: HF_HUB_OFFLINE, and any socket connection raises; kernels' layer cache starts empty, so
    every kernelize() below loads the repository from disk."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(kernels_layer, "_CACHED_LAYER", {})


@pytest.fixture
def calls(monkeypatch):
    """Counts addnorm's functional calls by name (the layers look them up on addnorm.functional)."""
    seen = {"rms_norm": 0, "layer_norm": 0}
    for name in seen:
        real = getattr(AF, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(AF, name, spy)
    return seen


def kernelized(model, mode=Mode.TRAINING, **mapping_kw):
    out = copy.deepcopy(model)
    with use_kernel_mapping(kernel_mapping(**mapping_kw)):
        # use_fallback=False: a missing mapping, device or mode raises instead of keeping HF's forward
        kernelize(out, mode=mode, device="cpu", use_fallback=False)
    return out


# ------------------------------------------------------------------ kernels' rules and the repository


def test_the_layers_obey_kernels_layer_rules():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    for cls, replaced in ((RMSNorm, LlamaRMSNorm), (LayerNorm, nn.LayerNorm)):
        assert cls.__init__ is nn.Module.__init__
        assert cls.has_backward is True and cls.can_torch_compile is True
        # kernels' own check: stateless, no extra members, the replaced forward's signature
        kernels_layer._validate_layer(check_cls=replaced, cls=cls, repo=layer_repository(cls.__name__))


def test_the_local_repository_loads_from_disk_without_network():
    with pytest.raises(AssertionError, match="network access attempted"):
        socket.create_connection(("127.0.0.1", 9))  # the fixture's guard is live
    meta = kernels.Metadata.read_from_file(kernels_hub.repository_path() / "build/torch-universal/metadata.json")
    assert str(meta.name) == "addnorm-norms" and meta.python_depends == [] and meta.kernel_depends == []
    module = kernels.get_local_kernel(kernels_hub.repository_path())
    assert module.layers.RMSNorm is RMSNorm and module.layers.LayerNorm is LayerNorm
    for name, cls in (("RMSNorm", RMSNorm), ("LayerNorm", LayerNorm)):
        repo = layer_repository(name)
        assert isinstance(repo, kernels.LocalLayerRepository) and repo.load() is cls


def test_kernel_mapping_shapes():
    m = kernel_mapping()
    assert set(m) == {"RMSNorm", "LayerNorm"} and set(m["RMSNorm"]) == {"cpu", "cuda"}
    assert isinstance(m["LayerNorm"]["cpu"], kernels.LocalLayerRepository)
    m = kernel_mapping("cpu", layers="RMSNorm", mode=Mode.INFERENCE)
    assert set(m) == {"RMSNorm"} and set(m["RMSNorm"]["cpu"]) == {Mode.INFERENCE}
    with pytest.raises(ValueError, match="layer_name must be one of"):
        layer_repository("GroupNorm")


# ------------------------------------------------------------------ HF Llama


def test_transformers_marks_llama_rmsnorm_when_it_accepts_this_kernels():
    """transformers marks LlamaRMSNorm with kernels' use_kernel_forward_from_hub("RMSNorm") only where its
    own kernels version window admits the installed kernels (transformers 5.24 asks for >=0.18.2);
    otherwise the class is left unmarked and kernels' replace_kernel_forward_from_hub marks it."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.utils.import_utils import is_kernels_available

    if is_kernels_available():
        assert LlamaRMSNorm.kernel_layer_name == "RMSNorm"
    else:
        assert not hasattr(LlamaRMSNorm, "kernel_layer_name")


@pytest.fixture
def llama_rmsnorm():
    """HF's LlamaRMSNorm, marked "RMSNorm" for kernels: by transformers itself where it accepts this kernels
    version, else with kernels' replace_kernel_forward_from_hub (undone afterwards)."""
    from kernels import replace_kernel_forward_from_hub
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    marked_here = not hasattr(LlamaRMSNorm, "kernel_layer_name")
    if marked_here:
        replace_kernel_forward_from_hub(LlamaRMSNorm, "RMSNorm")
    assert LlamaRMSNorm.kernel_layer_name == "RMSNorm"
    yield LlamaRMSNorm
    if marked_here:
        del LlamaRMSNorm.kernel_layer_name, LlamaRMSNorm.kernel_condition


def tiny_llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).to(dtype)
    with torch.no_grad():  # HF initialises norm weights to ones: make them tell apart
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def test_kernelized_llama_matches_hf_in_logits_and_gradients(llama_rmsnorm, calls):
    hf = tiny_llama()
    ours = kernelized(hf)
    norms = [m for m in ours.modules() if isinstance(m, llama_rmsnorm)]
    assert len(norms) == 5 and all(m.forward.__func__ is RMSNorm.forward for m in norms)
    assert all("forward" not in m.__dict__ for m in hf.modules())  # the original is untouched

    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    ref = hf(input_ids=ids, labels=ids)
    got = ours(input_ids=ids, labels=ids)
    assert calls["rms_norm"] == 5 and AF.last_backend() == CPU_BACKEND  # addnorm's kernel ran every norm
    torch.testing.assert_close(got.logits, ref.logits, rtol=0, atol=1e-5)
    ref.loss.backward()
    got.loss.backward()
    grads = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernelized_llama_half_precision_is_bit_exact(llama_rmsnorm, dtype):
    hf = tiny_llama(dtype).eval()
    ours = kernelized(hf, mode=Mode.INFERENCE)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, hf(input_ids=ids).logits)


@pytest.mark.parametrize(("w_dtype", "x_dtype"), [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                  (torch.float16, torch.float16), (torch.float32, torch.bfloat16)])
def test_rmsnorm_reproduces_llama_rmsnorm(llama_rmsnorm, w_dtype, x_dtype):
    torch.manual_seed(3)
    norm = llama_rmsnorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    norm = norm.to(w_dtype)
    ours = kernelized(nn.Sequential(norm))[0]
    x = (3 * torch.randn(4, 9, 64)).to(x_dtype)
    want, got = norm(x), ours(x)
    assert got.dtype == want.dtype  # a float32 weight beside a bf16 input widens the output, as HF's
    if x_dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(got, want)


# ------------------------------------------------------------------ LayerNorm


@use_kernel_forward_from_hub("LayerNorm")
class HubLayerNorm(nn.LayerNorm):
    pass


@pytest.mark.parametrize("kw", [{}, {"bias": False}, {"elementwise_affine": False}])
@pytest.mark.parametrize("shape", [32, (4, 8)])
def test_kernelized_layernorm_matches_torch(kw, shape, calls):
    torch.manual_seed(4)
    D = 32
    model = nn.Sequential(nn.Linear(16, D), nn.Unflatten(-1, (D,) if shape == 32 else shape),
                          HubLayerNorm(shape, eps=1e-5, **kw), nn.Flatten(-len((D,) if shape == 32 else shape)),
                          nn.Linear(D, 8))
    with torch.no_grad():
        for p in model[2].parameters():
            p.add_(0.3 * torch.randn_like(p))
    ours = kernelized(model)
    assert ours[2].forward.__func__ is LayerNorm.forward
    x = torch.randn(3, 5, 16)
    ref, got = model(x), ours(x)
    assert calls["layer_norm"] == 1 and AF.last_backend() == CPU_BACKEND
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    ref.square().sum().backward()
    got.square().sum().backward()
    for (name, a), b in zip(ours.named_parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-5, msg=name)
    xb = x.bfloat16()
    model_b, ours_b = model.bfloat16(), ours.bfloat16()
    with torch.no_grad():
        assert torch.equal(ours_b[2](model_b[1](model_b[0](xb))), model_b[2](model_b[1](model_b[0](xb))))


# ------------------------------------------------------------------ torch.compile


def test_kernelized_for_torch_compile_runs_fullgraph(llama_rmsnorm):
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(16, 32), llama_rmsnorm(32, eps=1e-6), HubLayerNorm(32), nn.Linear(32, 4))
    ours = kernelized(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE)
    assert ours[1].forward.__func__ is RMSNorm.forward and ours[2].forward.__func__ is LayerNorm.forward
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True)  # inductor; a graph break would raise
    x = torch.randn(6, 16)
    got, ref = compiled(x), model(x)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    got.square().sum().backward()
    ref.square().sum().backward()
    for a, b in zip(ours.parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-5)
