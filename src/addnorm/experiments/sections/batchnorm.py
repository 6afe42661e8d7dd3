"""LayerNorm vs BatchNorm, measured: what each normalizes over, batch size 1, padding, train vs eval."""

from __future__ import annotations

import torch
from torch import nn

from ...nn import LayerNorm


def _bn(d):
    return nn.BatchNorm1d(d, affine=False)


def _apply_bn(bn, x):  # x: (B, T, d) -> statistics per feature over all B*T positions
    return bn(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def run(seed: int = 0, d: int = 32) -> dict:
    g = torch.Generator().manual_seed(seed)
    ln = LayerNorm(d, elementwise_affine=False)
    # token activations with per-token scale differences, as in a real residual stream
    x = torch.randn(8, 12, d, generator=g) * torch.linspace(0.5, 3.0, 12).view(1, 12, 1) + 1.5

    # 1. what each normalizes over
    y_ln, y_bn = ln(x), _apply_bn(_bn(d).train(), x)
    over = {
        "layer_row_mean_max": y_ln.mean(-1).abs().max().item(), "layer_row_std_mean": y_ln.std(-1, unbiased=False).mean().item(),
        "batch_row_mean_max": y_bn.mean(-1).abs().max().item(), "batch_row_std_spread":
            (y_bn.std(-1, unbiased=False).max() - y_bn.std(-1, unbiased=False).min()).item(),
        "batch_feature_mean_max": y_bn.reshape(-1, d).mean(0).abs().max().item(),
        "layer_feature_mean_max": y_ln.reshape(-1, d).mean(0).abs().max().item(),
    }

    # 2. batch size 1 / batch composition: the same token, alone vs in a batch
    token = x[:1, :1]
    bn = _bn(d).train()
    try:
        _apply_bn(bn, token)
        bn_alone = "ran"
    except ValueError as e:  # "Expected more than 1 value per channel when training"
        bn_alone = str(e).split(",")[0]
    in_batch_ln = ln(x)[0, 0]
    other = torch.randn(8, 12, d, generator=g) * 4 - 2
    other[0, 0] = x[0, 0]
    composition = {
        "layer_token_alone_vs_batch_max_diff": (ln(token)[0, 0] - in_batch_ln).abs().max().item(),
        "layer_batch_a_vs_batch_b_max_diff": (ln(other)[0, 0] - in_batch_ln).abs().max().item(),
        "batch_batch_a_vs_batch_b_max_diff": (_apply_bn(_bn(d).train(), other)[0, 0] - y_bn[0, 0]).abs().max().item(),
        "batch_single_token": bn_alone,
    }

    # 3. variable-length sequences, padded with zeros to the longest
    lengths = [12, 9, 5, 3]
    seqs = [torch.randn(n, d, generator=g) + 1.0 for n in lengths]
    padded = torch.zeros(len(lengths), max(lengths), d)
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = s
    unpadded_bn = _apply_bn(_bn(d).train(), torch.cat(seqs)[None])[0]
    pad_bn = _apply_bn(_bn(d).train(), padded)
    real = torch.cat([pad_bn[i, : n] for i, n in enumerate(lengths)])
    real_ln = torch.cat([ln(padded)[i, : n] for i, n in enumerate(lengths)])
    padding = {
        "pad_fraction": 1 - sum(lengths) / (len(lengths) * max(lengths)),
        "batch_padded_vs_unpadded_max_diff": (real - unpadded_bn).abs().max().item(),
        "layer_padded_vs_unpadded_max_diff": (real_ln - ln(torch.cat(seqs))).abs().max().item(),
    }

    # 4. train vs eval: BatchNorm switches to running statistics; LayerNorm has no mode
    bn = _bn(d)
    for _ in range(5):  # a few training batches to fill the running statistics
        _apply_bn(bn.train(), torch.randn(8, 12, d, generator=g) * 2 + 1)
    train_out = _apply_bn(bn.train(), x)
    eval_out = _apply_bn(bn.eval(), x)
    ln_train, ln_eval = ln.train()(x), ln.eval()(x)
    mode = {"batch_train_vs_eval_max_diff": (train_out - eval_out).abs().max().item(),
            "layer_train_vs_eval_max_diff": (ln_train - ln_eval).abs().max().item()}
    return {"d": d, "shape": list(x.shape), "normalizes_over": over, "composition": composition, "padding": padding,
            "mode": mode}
