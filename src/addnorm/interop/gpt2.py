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
# save_gpt2 of a bias-free GPT writes zero biases (a complete GPT-2 checkpoint) and this config.json flag,
# so that load_gpt2 rebuilds the bias-free model
_BIAS_FLAG = "addnorm_bias"


_REQUIRED = ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd")


def config_from_hf(hf_config) -> GPTConfig:
    """A GPTConfig from a transformers GPT2Config (or its dict / config.json contents)."""
    c = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    if c.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"config is for model_type {c['model_type']!r}; load_gpt2 reads GPT-2 checkpoints "
                         "(model_type 'gpt2')")
    missing = [k for k in _REQUIRED if k not in c]
    if missing:
        raise ValueError(f"GPT-2 config is missing {missing}; a GPT2Config has {list(_REQUIRED)} "
                         "(pass GPT2Config().to_dict(), a config.json, or a GPTConfig)")
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
                     eps=c.get("layer_norm_epsilon", 1e-5), placement="pre",
                     bias=bool(c.get(_BIAS_FLAG, True)), tie_weights=c.get("tie_word_embeddings", True))


def _hf_to_ours(key: str) -> str | None:
    k = key.removeprefix("transformer.")
    if _IGNORED.match(k):
        return None
    k = re.sub(r"^h\.(\d+)\.ln_1\.", r"h.\1.attn.norm_before.", k)
    k = re.sub(r"^h\.(\d+)\.ln_2\.", r"h.\1.mlp.norm_before.", k)
    k = re.sub(r"^h\.(\d+)\.attn\.(c_attn|c_proj)\.", r"h.\1.attn.fn.\2.", k)
    k = re.sub(r"^h\.(\d+)\.mlp\.(c_fc|c_proj)\.", r"h.\1.mlp.fn.\2.", k)
    return k


def from_hf_state_dict(sd: dict[str, torch.Tensor], tie_weights: bool = True,
                       names: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Rename and transpose an HF GPT-2 state_dict (GPT2LMHeadModel or GPT2Model) into GPT's keys.

    A tied model with no ``lm_head.weight`` gets the token embedding as its head; an untied one must
    have its own. ``names``, if given, is filled with {our key: the checkpoint's key} for error messages.
    """
    out = {}
    for key, t in sd.items():
        ours = _hf_to_ours(key)
        if ours is None:
            continue
        if key.endswith(_TRANSPOSED):
            t = t.t()
        out[ours] = t.contiguous()
        if names is not None:
            names[ours] = key
    if "lm_head.weight" not in out and "wte.weight" in out:
        if not tie_weights:
            raise ValueError("the checkpoint has no lm_head.weight but the config is untied (tie_word_embeddings="
                             "False): its output head is missing; pass the full GPT2LMHeadModel checkpoint")
        out["lm_head.weight"] = out["wte.weight"]
    return out


def to_hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """GPT's parameters under GPT2LMHeadModel's keys (Conv1D layout)."""
    c = model.config
    if any(b.placement.name != "pre" or b.placement.before != "layer" for b in model.h) or model.ln_f is None:
        raise ValueError("only pre-norm LayerNorm models (GPT-2's architecture) can be exported to GPT-2")
    out = {}
    for key, t in model.state_dict().items():
        k = _hf_name(key)
        if k.endswith(_TRANSPOSED):
            t = t.t()
        out[k] = t.detach().clone().contiguous()
    if not c.bias:  # GPT-2 has biases everywhere: a bias-free model's are zeros
        for key, t in list(out.items()):
            if key.endswith(".weight") and not key.endswith(("wte.weight", "wpe.weight", "lm_head.weight")):
                bias_key = key.removesuffix(".weight") + ".bias"
                n = t.shape[1] if key.endswith(_TRANSPOSED) else t.shape[0]
                out.setdefault(bias_key, torch.zeros(n, dtype=t.dtype))
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
    """One weights file; a file that cannot be read is named in the error."""
    try:
        if path.suffix == ".safetensors":
            try:
                from safetensors.torch import load_file
            except ImportError as e:
                raise ImportError("reading .safetensors needs the hf extra: pip install 'addnorm[hf]'") from e
            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001  (safetensors, pickle and zip errors all mean: not a readable checkpoint)
        raise ValueError(f"could not read {path}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                         " (a truncated or corrupt file?)") from None


_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_SINGLES = ("model.safetensors", "pytorch_model.bin")


def _read_directory(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """A save_pretrained directory: one weights file, or shards listed by an index's weight_map."""
    for index in _INDEXES:
        if (path / index).exists():
            try:
                weight_map = json.loads((path / index).read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"could not read {path / index}: {type(e).__name__}: {e}") from None
            sd = {}
            for shard in sorted(set(weight_map.values())):
                if not (path / shard).exists():
                    raise FileNotFoundError(f"{path / index} lists {shard}, which is not in {path}")
                sd.update(_read_weights(path / shard))
            return sd, str(path / index)
    for name in _SINGLES:
        if (path / name).exists():
            return _read_weights(path / name), str(path / name)
    raise FileNotFoundError(f"{path} has none of {list(_SINGLES + _INDEXES)}")


def _source(source, config):
    """(state_dict, config, where) from any accepted source."""
    if isinstance(source, GPT):
        raise TypeError("source is already an addnorm GPT; load_gpt2 reads HuggingFace GPT-2 checkpoints")
    if isinstance(source, torch.nn.Module):
        hf_config = getattr(source, "config", None)
        if hf_config is None or not hasattr(hf_config, "to_dict"):
            raise TypeError(f"source is a {type(source).__name__}, not a HuggingFace GPT-2 model; pass a "
                            "GPT2LMHeadModel / GPT2Model, its state_dict(), a weights file or a save_pretrained "
                            "directory")
        return source.state_dict(), (hf_config.to_dict() if config is None else config), type(source).__name__
    if isinstance(source, dict):
        return source, config, "the state_dict"
    if not isinstance(source, str | Path):
        raise TypeError(f"source must be a GPT-2 model, a state_dict, or a path; got {type(source).__name__}")
    path = Path(source)
    if path.is_dir():
        if config is None and (path / "config.json").exists():
            try:
                config = json.loads((path / "config.json").read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"could not read {path / 'config.json'}: {e}") from None
        sd, where = _read_directory(path)
        return sd, config, where
    if path.exists():
        return _read_weights(path), config, str(path)
    raise FileNotFoundError(f"no checkpoint at {path}")


def load_gpt2(source, config: GPTConfig | dict | None = None) -> GPT:
    """Load a HuggingFace GPT-2 checkpoint into GPT.

    ``source``: an in-memory ``GPT2LMHeadModel``/``GPT2Model``, a state_dict, a ``.safetensors``/``.bin``
    file, or a directory written by ``save_pretrained`` (config.json + model.safetensors or
    pytorch_model.bin, or shards listed by model.safetensors.index.json). ``config`` (a GPTConfig, or an
    HF config dict) is needed unless the model or the directory carries one. Errors name the
    checkpoint's own keys and file.
    """
    sd, config, where = _source(source, config)
    if config is None:
        raise ValueError("config is required to load a bare state_dict or weights file (GPTConfig or GPT2Config dict)")
    cfg = config if isinstance(config, GPTConfig) else config_from_hf(config)
    model = GPT(cfg)
    names: dict[str, str] = {}
    ours = from_hf_state_dict(sd, cfg.tie_weights, names)
    if not cfg.bias:  # save_gpt2's bias-free models: the checkpoint's zero biases are not parameters here
        nonzero = [names[k] for k, t in ours.items() if k.endswith(".bias") and k not in model.state_dict()
                   and torch.count_nonzero(t)]
        if nonzero:
            raise ValueError(f"{where} says the model has no biases ({_BIAS_FLAG}=false) but {nonzero[:3]} are not zero")
        ours = {k: t for k, t in ours.items() if not (k.endswith(".bias") and k not in model.state_dict())}
    expected = model.state_dict()
    wrong = [f"{names.get(k, k)} {tuple(t.shape)} (expected {tuple(expected[k].shape)})" for k, t in ours.items()
             if k in expected and t.shape != expected[k].shape]
    missing = [_hf_name(k) for k in expected if k not in ours]
    unexpected = [names.get(k, k) for k in ours if k not in expected]
    if wrong or missing or unexpected:
        parts = [f"shapes {wrong[:3]}" if wrong else "", f"missing {missing[:5]}" if missing else "",
                 f"unexpected {unexpected[:5]}" if unexpected else ""]
        raise ValueError(f"{where} does not match the config: " + "; ".join(p for p in parts if p))
    model.load_state_dict(ours)
    return model


def _hf_name(key: str) -> str:
    """Our key as a GPT2LMHeadModel checkpoint names it."""
    k = re.sub(r"^h\.(\d+)\.attn\.norm_before\.", r"h.\1.ln_1.", key)
    k = re.sub(r"^h\.(\d+)\.mlp\.norm_before\.", r"h.\1.ln_2.", k)
    k = re.sub(r"^h\.(\d+)\.(attn|mlp)\.fn\.", r"h.\1.\2.", k)
    return k if k == "lm_head.weight" else "transformer." + k


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
    if not model.config.bias:
        cfg[_BIAS_FLAG] = False  # the zero biases written above are not part of the model: load_gpt2 drops them
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d
