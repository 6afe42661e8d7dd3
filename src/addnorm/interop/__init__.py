"""HuggingFace interop: load/export GPT-2 checkpoints, patch HF models with fused Add & Norm.

Needs the ``hf`` extra (``pip install 'addnorm[hf]'``: transformers, safetensors) only for the
parts that touch HuggingFace objects or files; converting a plain state_dict needs neither.
"""

from .gpt2 import config_from_hf, export_gpt2, from_hf_state_dict, load_gpt2, save_gpt2, to_hf_state_dict
from .auto import AutoAddNormForCausalLM
from .patch import patch_hf_model, unpatch_hf_model

__all__ = ["config_from_hf", "from_hf_state_dict", "to_hf_state_dict", "load_gpt2", "export_gpt2", "save_gpt2",
           "patch_hf_model", "unpatch_hf_model", "AutoAddNormForCausalLM"]
