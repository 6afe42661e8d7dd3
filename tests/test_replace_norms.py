"""addnorm.nn.replace_norms: the norms of any model swapped for addnorm's, the same parameters, the same outputs."""

import pytest
import torch
from torch import nn

import addnorm.nn as ann


class MyLayerNorm(nn.LayerNorm):  # a subclass may change the forward: never swapped
    def forward(self, x):
        return super().forward(x) * 2


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm, self.fc = nn.RMSNorm(d), nn.Linear(d, d)  # eps=None: the dtype's machine epsilon, as torch's

    def forward(self, x):
        return x + self.fc(self.norm(x))


def _model(d=16):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, d), nn.LayerNorm(d), nn.ModuleList([Block(d), Block(d)]),
                      nn.LayerNorm(d, bias=False), nn.LayerNorm(d, elementwise_affine=False),
                      nn.RMSNorm(d, eps=1e-6), MyLayerNorm(d), nn.GroupNorm(1, 4))
    for p in m.parameters():  # not the identity: the weights must be the ones used
        nn.init.normal_(p)
    return m


def _run(m, x):
    h = m[1](m[0](x))
    for block in m[2]:
        h = block(h)
    for norm in m[3:7]:
        h = norm(h)
    return m[7](h.reshape(4, 4, -1))


def test_every_torch_layer_and_rms_norm_is_swapped_keeping_its_parameters():
    m = _model()
    x = torch.randn(4, 8)
    want = _run(m, x)
    params = [id(p) for p in m.parameters()]
    state = {k: v.data_ptr() for k, v in m.state_dict().items()}
    assert ann.replace_norms(m) is m
    assert [type(n) for n in (m[1], m[2][0].norm, m[2][1].norm, m[3], m[4], m[5])] == \
        [ann.LayerNorm, ann.RMSNorm, ann.RMSNorm, ann.LayerNorm, ann.LayerNorm, ann.RMSNorm]
    assert type(m[6]) is MyLayerNorm and type(m[7]) is nn.GroupNorm  # a subclass and another norm: as they were
    assert [id(p) for p in m.parameters()] == params  # the same Parameter objects, in the same order
    assert {k: v.data_ptr() for k, v in m.state_dict().items()} == state  # same keys, same storage
    assert m[3].bias is None and m[4].weight is None and m[2][0].norm.eps is None and m[5].eps == 1e-6
    torch.testing.assert_close(_run(m, x), want, atol=2e-6, rtol=1e-6)


def test_an_optimizer_holding_the_parameters_trains_the_new_modules():
    m = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ann.replace_norms(m)
    m(torch.randn(3, 4)).pow(2).sum().backward()
    before = m[1].weight.detach().clone()
    opt.step()
    assert not torch.equal(m[1].weight, before)


def test_a_shared_norm_stays_shared_and_a_norm_itself_is_returned_replaced():
    norm = nn.LayerNorm(8)
    m = nn.ModuleDict({"a": norm, "b": nn.Sequential(norm)})
    ann.replace_norms(m)
    assert type(m["a"]) is ann.LayerNorm and m["a"] is m["b"][0] and m["a"].weight is norm.weight
    new = ann.replace_norms(nn.RMSNorm(8).eval(), backend="torch")
    assert type(new) is ann.RMSNorm and not new.training and new.backend == "torch"
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got dict"):
        ann.replace_norms({})
