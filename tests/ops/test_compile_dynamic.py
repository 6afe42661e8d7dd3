"""torch.compile(fullgraph=True, dynamic=True): the modules and functions with their float arguments symbolic.

With dynamic=True Dynamo traces a module's float attributes (eps, weight_offset) and a compiled function's
float arguments as symbolic floats. Python comparisons take those; math.isfinite does not, and a check that
called it (weight_offset's) broke the graph of every LayerNorm: addnorm.nn.LayerNorm, and GPT with mhc, hc,
mhc_lite, lns and denseformer, failed to compile where torch.nn.LayerNorm compiles."""

import pytest
import torch

import addnorm
from addnorm import nn as ann
from addnorm.model import GPT, GPTConfig

D = 8


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 5, D, generator=g) for _ in range(3)] + [torch.randn(D, generator=g) for _ in range(2)]


FUNCTIONS = {
    "layer_norm": lambda x, r, x2, w, b, e: addnorm.layer_norm(x, (D,), w, b, e),
    "rms_norm": lambda x, r, x2, w, b, e: addnorm.rms_norm(x, (D,), w, e),
    "add_layer_norm": lambda x, r, x2, w, b, e: addnorm.add_layer_norm(x, r, D, w, b, eps=e),
    "add_rms_norm": lambda x, r, x2, w, b, e: addnorm.add_rms_norm(x, r, D, w, eps=e),
    "layer_norm_add": lambda x, r, x2, w, b, e: addnorm.layer_norm_add(x, r, D, w, b, eps=e, weight_offset=e),
    "rms_norm_add": lambda x, r, x2, w, b, e: addnorm.rms_norm_add(x, r, D, w, eps=e, weight_offset=e),
    "parallel_add_layer_norm": lambda x, r, x2, w, b, e: addnorm.parallel_add_layer_norm(x, x2, r, D, w, b, eps=e),
    "parallel_add_rms_norm": lambda x, r, x2, w, b, e: addnorm.parallel_add_rms_norm(x, x2, r, D, w, eps=e),
    "tutorial_layer_norm": lambda x, r, x2, w, b, e: addnorm.tutorial_layer_norm(x, w, b, eps=e),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_functions_with_a_symbolic_eps(name):
    torch._dynamo.reset()
    fn, args = FUNCTIONS[name], _inputs()
    got = torch.compile(fn, fullgraph=True, dynamic=True)(*args, 1e-5)
    want = fn(*args, 1e-5)
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want), strict=True):
        torch.testing.assert_close(a, b)


MODULES = {
    "LayerNorm": lambda: ann.LayerNorm(D), "RMSNorm": lambda: ann.RMSNorm(D, eps=1e-6),
    "TutorialLayerNorm": lambda: ann.TutorialLayerNorm(D), "DyT": lambda: ann.DyT(D), "Derf": lambda: ann.Derf(D),
    "AddLayerNorm": lambda: ann.AddLayerNorm(D), "AddRMSNorm": lambda: ann.AddRMSNorm(D, eps=1e-6),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_modules_with_symbolic_float_attributes(name):
    torch._dynamo.reset()
    m = MODULES[name]()
    x, r = _inputs()[:2]
    args = (x, r) if name.startswith("Add") else (x,)
    for a, b in zip(torch.utils._pytree.tree_leaves(torch.compile(m, fullgraph=True, dynamic=True)(*args)),
                    torch.utils._pytree.tree_leaves(m(*args)), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("placement", ["mhc", "lns", "denseformer"])
def test_gpt_compiles_with_dynamic_shapes(placement):
    torch._dynamo.reset()
    m = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=D, placement=placement))
    idx = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.compile(m, fullgraph=True, dynamic=True)(idx), m(idx))
