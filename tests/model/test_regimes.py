"""The residual stream's regimes: one per placement family, each with its own parts, and GPT's loop without flags."""

import inspect

import pytest
import torch

from addnorm.model import GPT, GPTConfig, ResidualSubLayer
from addnorm.model.placement import PLACEMENTS, Placement
from addnorm.model.regimes import DenseFormer, NormalizedStream, SingleStream, WidenedStream

TINY = dict(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8)


@pytest.mark.parametrize("placement, regime, inner", [
    ("pre", SingleStream, None), ("post", SingleStream, None), ("mix", SingleStream, None),
    ("hybrid_star", SingleStream, None), ("lns", SingleStream, None),
    ("hc", WidenedStream, None), ("mhc", WidenedStream, None), ("mhc_lite", WidenedStream, None),
    ("denseformer", DenseFormer, SingleStream),
    (Placement("x", stream="mhc", before="layer", dense=True, final_norm=True), DenseFormer, WidenedStream),
    ("ngpt", NormalizedStream, None),
])
def test_each_placement_gets_its_regime(placement, regime, inner):
    m = GPT(GPTConfig(**TINY, placement=placement))
    assert type(m.regime) is regime
    assert inner is None or type(m.regime.inner) is inner


def test_each_regime_adds_its_parts_under_the_names_checkpoints_use():
    keys = {p: set(GPT(GPTConfig(**TINY, placement=p)).state_dict()) for p in ("pre", "mhc", "denseformer", "ngpt")}
    top = {p: {k.split(".")[0] for k in ks} for p, ks in keys.items()}
    assert top["pre"] == top["mhc"] == {"wte", "wpe", "h", "ln_f", "lm_head"}
    assert top["denseformer"] == top["pre"] | {"dwa"} and {"dwa.0.weight", "dwa.1.weight"} <= keys["denseformer"]
    assert top["ngpt"] == {"wte", "h", "lm_head", "s_z"}


def test_gpt_runs_one_loop_for_every_regime():
    """No regime flag in GPT: its forward is the embedding, the regime's enter / after_block / leave around
    the blocks, the final norm."""
    for method in (GPT.__init__, GPT._init_weights, GPT.embed, GPT.hidden_states, GPT.forward, GPT.normalize_):
        code = "\n".join(line.split("#")[0] for line in inspect.getsource(method).splitlines()
                         if not line.strip().startswith(('"""', "nGPT", "it ", "any ")))
        for flag in ("ngpt", "dense", "self.stream", "stream !=", "n_streams", "normalized", "residual ==", "placement =="):
            assert flag not in code, (method.__name__, flag)


def test_a_regime_keeps_no_state_between_calls():
    """DenseFormer's block outputs live in the memory of one forward pass, so calls do not leak into each other."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(**TINY, placement="denseformer"))
    idx = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    first = m(idx)
    m(idx[:, :3])
    assert torch.equal(m(idx), first)


def test_a_residual_sublayer_refuses_the_normalized_form():
    """'normalized' is nGPT's form, built by its own block (model/ngpt.py); a ResidualSubLayer would have added
    the branch as if the form were 'add'."""
    with pytest.raises(ValueError, match="residual='normalized' .* nGPT's own block"):
        ResidualSubLayer(torch.nn.Linear(8, 8), 8, PLACEMENTS["ngpt"])


@pytest.mark.parametrize("placement", ["denseformer", "ngpt"])
def test_a_copied_model_runs_on_its_own_parts(placement):
    """The regime holds the parts it built (DenseFormer's averages, nGPT's s_z): a deepcopy's regime must use the
    copy's, or training the copy would read the original's weights."""
    import copy

    m = GPT(GPTConfig(**TINY, placement=placement))
    c = copy.deepcopy(m)
    idx = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        part = c.dwa[1].weight if placement == "denseformer" else c.s_z.weight
        part.add_(1.0)
    assert not torch.equal(c(idx), m(idx))
