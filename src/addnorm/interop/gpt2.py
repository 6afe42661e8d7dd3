"""HuggingFace GPT-2 checkpoints <-> addnorm.model.GPT, exactly.

HF stores GPT-2's projections as ``Conv1D`` with weights of shape (in, out); addnorm uses
``nn.Linear`` (out, in), so those four matrices per block are transposed. Everything else maps
by name:

    transformer.wte / wpe                 -> wte / wpe
    transformer.h.{i}.ln_1                -> h.{i}.attn.norm_before
    transformer.h.{i}.attn.c_attn|c_proj  -> h.{i}.attn.fn.c_attn|c_proj   (transposed)
    transformer.h.{i}.ln_2                -> h.{i}.mlp.norm_before
    transformer.h.{i}.mlp.c_fc|c_proj     -> h.{i}.mlp.fn.c_fc|c_proj      (transposed)
    transformer.ln_f                      -> ln_f
    lm_head.weight                        -> lm_head.weight (tied to wte)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..model.config import GPTConfig
from ..model.gpt import GPT

_ACTIVATION = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_IGNORED = re.compile(r"^h\.\d+\.attn\.(masked_)?bias$")  # causal-mask buffers of older transformers


def config_from_hf(hf_config) -> GPTConfig:
    """A GPTConfig from a transformers GPT2Config (or its dict / config.json contents)."""
    c = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    act = c.get("activation_function", "gelu_new")
    if act not in _ACTIVATION:
        raise ValueError(f"activation_function {act!r} is not supported; supported: {sorted(_ACTIVATION)}")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if c.get(flag):
            raise ValueError(f"GPT-2 configs with {flag}=True are not supported by addnorm.model.GPT")
    if not c.get("scale_attn_weights", True):
        raise ValueError("GPT-2 configs with scale_attn_weights=False are not supported")
    return GPTConfig(vocab_size=c["vocab_size"], block_size=c["n_positions"], n_layer=c["n_layer"], n_head=c["n_head"],
                     n_embd=c["n_embd"], d_ff=c.get("n_inner"), activation=_ACTIVATION[act], norm="layer",
                     eps=c.get("layer_norm_epsilon", 1e-5), placement="pre", bias=True,
                     tie_weights=c.get("tie_word_embeddings", True))


def _hf_to_ours(key: str) -> str | None:
    k = key.removeprefix("transformer.")
    if _IGNORED.match(k):
        return None
    k = re.sub(r"^h\.(\d+)\.ln_1\.", r"h.\1.attn.norm_before.", k)
    k = re.sub(r"^h\.(\d+)\.ln_2\.", r"h.\1.mlp.norm_before.", k)
    k = re.sub(r"^h\.(\d+)\.attn\.(c_attn|c_proj)\.", r"h.\1.attn.fn.\2.", k)
    k = re.sub(r"^h\.(\d+)\.mlp\.(c_fc|c_proj)\.", r"h.\1.mlp.fn.\2.", k)
    return k


def from_hf_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename and transpose an HF GPT-2 state_dict (GPT2LMHeadModel or GPT2Model) into GPT's keys."""
    out = {}
    for key, t in sd.items():
        ours = _hf_to_ours(key)
        if ours is None:
            continue
        if key.endswith(_TRANSPOSED):
            t = t.t()
        out[ours] = t.contiguous()
    if "lm_head.weight" not in out and "wte.weight" in out:
        out["lm_head.weight"] = out["wte.weight"]
    return out


def to_hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """GPT's parameters under GPT2LMHeadModel's keys (Conv1D layout)."""
    c = model.config
    if any(b.placement.name != "pre" or b.placement.before != "layer" for b in model.h) or model.ln_f is None:
        raise ValueError("only pre-norm LayerNorm models (GPT-2's architecture) can be exported to GPT-2")
    out = {}
    for key, t in model.state_dict().items():
        k = re.sub(r"^h\.(\d+)\.attn\.norm_before\.", r"h.\1.ln_1.", key)
        k = re.sub(r"^h\.(\d+)\.mlp\.norm_before\.", r"h.\1.ln_2.", k)
        k = re.sub(r"^h\.(\d+)\.(attn|mlp)\.fn\.", r"h.\1.\2.", k)
        if k.endswith(_TRANSPOSED):
            t = t.t()
        out[k if k == "lm_head.weight" else "transformer." + k] = t.detach().clone().contiguous()
    if c.tie_weights:
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def export_gpt2(model: GPT) -> tuple[dict[str, torch.Tensor], dict]:
    """(HF state_dict, GPT2Config kwargs) for ``GPT2LMHeadModel(GPT2Config(**cfg)).load_state_dict(sd)``."""
    c = model.config
    act = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}[c.activation]
    cfg = dict(vocab_size=c.vocab_size, n_positions=c.block_size, n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd,
               n_inner=c.d_ff, activation_function=act, layer_norm_epsilon=c.eps, tie_word_embeddings=c.tie_weights,
               resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout)
    return to_hf_state_dict(model), cfg


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError as e:
            raise ImportError("reading .safetensors needs the hf extra: pip install 'addnorm[hf]'") from e
        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def load_gpt2(source, config: GPTConfig | dict | None = None) -> GPT:
    """Load a HuggingFace GPT-2 checkpoint into GPT.

    ``source``: a state_dict, a ``.safetensors``/``.bin`` file, or a directory written by
    ``save_pretrained`` (config.json + model.safetensors or pytorch_model.bin). ``config`` (a
    GPTConfig, or an HF config dict) is needed unless the directory has a config.json.
    """
    if isinstance(source, dict):
        sd = source
    else:
        path = Path(source)
        if path.is_dir():
            if config is None and (path / "config.json").exists():
                config = json.loads((path / "config.json").read_text())
            files = [path / n for n in ("model.safetensors", "pytorch_model.bin") if (path / n).exists()]
            if not files:
                raise FileNotFoundError(f"{path} has neither model.safetensors nor pytorch_model.bin")
            sd = _read_weights(files[0])
        elif path.exists():
            sd = _read_weights(path)
        else:
            raise FileNotFoundError(f"no checkpoint at {path}")
    if config is None:
        raise ValueError("config is required to load a bare state_dict or weights file (GPTConfig or GPT2Config dict)")
    cfg = config if isinstance(config, GPTConfig) else config_from_hf(config)
    model = GPT(cfg)
    try:
        missing, unexpected = model.load_state_dict(from_hf_state_dict(sd), strict=False)
    except RuntimeError as e:  # shape mismatches
        detail = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise ValueError(f"checkpoint does not match the config: {detail}") from None
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


def save_gpt2(model: GPT, directory) -> Path:
    """Write config.json + model.safetensors that ``GPT2LMHeadModel.from_pretrained`` loads."""
    try:
        from safetensors.torch import save_file
    except ImportError as e:
        raise ImportError("writing .safetensors needs the hf extra: pip install 'addnorm[hf]'") from e
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    sd, cfg = export_gpt2(model)
    if model.config.tie_weights:
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}  # tied: stored once
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(cfg, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d
