"""Load a HuggingFace causal LM and patch it in one call, as Liger's ``AutoLigerKernelForCausalLM`` does:

    from addnorm.interop import AutoAddNormForCausalLM
    model = AutoAddNormForCausalLM.from_pretrained("path/to/checkpoint", torch_dtype=torch.bfloat16)

The model is transformers' own class (``AutoModelForCausalLM`` picks it), patched in place by
``patch_hf_model``: its ``save_pretrained`` writes a plain HF checkpoint that loads without addnorm.
"""

from __future__ import annotations

from .patch import patch_hf_model


def _auto():
    try:
        from transformers import AutoModelForCausalLM
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("AutoAddNormForCausalLM needs transformers: pip install 'addnorm[hf]'") from e
    return AutoModelForCausalLM


class AutoAddNormForCausalLM:
    """``AutoModelForCausalLM`` followed by ``patch_hf_model``. Not instantiable; use the class methods."""

    def __init__(self, *args, **kwargs):
        raise TypeError("AutoAddNormForCausalLM is not instantiated: use AutoAddNormForCausalLM.from_pretrained(...) "
                        "or .from_config(...)")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, verify: bool = True, **kwargs):
        """``AutoModelForCausalLM.from_pretrained(...)`` (every argument passed on), then patched."""
        model = _auto().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        return patch_hf_model(model, verify=verify)

    @classmethod
    def from_config(cls, config, *args, verify: bool = True, **kwargs):
        """``AutoModelForCausalLM.from_config(config, ...)``, then patched."""
        model = _auto().from_config(config, *args, **kwargs)
        return patch_hf_model(model, verify=verify)
