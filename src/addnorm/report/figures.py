"""Figures for the tour, drawn from the tour's JSON data (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


def pipeline(data: dict, out: Path) -> str:
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5))
    colors = ["#1f77b4", "#ff7f0e", "#9467bd", "#2ca02c"]
    for ax, st, c in zip(axes.flat, data["stages"], colors):
        ax.hist(st["values"], bins=24, color=c, alpha=0.8)
        ax.set_title(f"{st['name']}\nmean {st['mean']:+.3f}, std {st['std']:.3f}", fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Add & Norm on position {data['position']} ('{data['tokens'][data['position']]}') of a real sentence")
    return _save(fig, out / "pipeline.png")


def wild(data: dict, out: Path) -> str:
    w = data["wild"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.2))
    a.bar(range(len(w["before"])), w["before"], color="#d62728")
    a.set_title(f"before LayerNorm: mean {w['before_mean']:.2f}, std {w['before_std']:.2f}")
    b.bar(range(len(w["after"])), w["after"], color="#2ca02c")
    b.set_title(f"after LayerNorm: mean {w['after_mean']:.2f}, std {w['after_std']:.3f}")
    for ax in (a, b):
        ax.axhline(0, color="k", linewidth=0.6)
        ax.set_xlabel("feature")
    return _save(fig, out / "wild_vector.png")


def seed001(data: dict, out: Path) -> str:
    rows = data["verification"]
    fig, ax = plt.subplots(figsize=(7, 3))
    names = [r["token"] for r in rows]
    ax.bar([i - 0.2 for i in range(len(rows))], [r["input_variance"] for r in rows], 0.4, label="variance before", color="#ff7f0e")
    ax.bar([i + 0.2 for i in range(len(rows))], [r["output_variance"] for r in rows], 0.4, label="variance after", color="#2ca02c")
    ax.set_xticks(range(len(rows)), names)
    ax.set_yscale("log")
    ax.set_title("seed 001: per-position variance before and after LayerNorm (pure Python)")
    ax.legend(fontsize=8)
    return _save(fig, out / "seed001_variance.png")


def batchnorm(data: dict, out: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1, 1.4]})
    # what each normalizes over: a (batch x features) grid, LayerNorm's row vs BatchNorm's column
    import numpy as np

    grid = np.zeros((6, 8))
    a.imshow(grid, cmap="Greys", vmin=0, vmax=1)
    a.add_patch(plt.Rectangle((-0.5, 1.5), 8, 1, fill=True, color="#2ca02c", alpha=0.6, label="LayerNorm: one token, all features"))
    a.add_patch(plt.Rectangle((4.5, -0.5), 1, 6, fill=True, color="#d62728", alpha=0.5, label="BatchNorm: one feature, all tokens"))
    a.set_xlabel("features")
    a.set_ylabel("tokens (batch × positions)")
    a.set_xticks([])
    a.set_yticks([])
    a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), fontsize=8)
    a.set_title("what is normalized together")
    labels = ["other tokens\nin the batch", "padding", "train vs eval"]
    ln_vals = [data["composition"]["layer_batch_a_vs_batch_b_max_diff"], data["padding"]["layer_padded_vs_unpadded_max_diff"],
               data["mode"]["layer_train_vs_eval_max_diff"]]
    bn_vals = [data["composition"]["batch_batch_a_vs_batch_b_max_diff"], data["padding"]["batch_padded_vs_unpadded_max_diff"],
               data["mode"]["batch_train_vs_eval_max_diff"]]
    x = range(len(labels))
    floor = 1e-8
    b.bar([i - 0.2 for i in x], [max(v, floor) for v in ln_vals], 0.4, label="LayerNorm", color="#2ca02c")
    b.bar([i + 0.2 for i in x], [max(v, floor) for v in bn_vals], 0.4, label="BatchNorm", color="#d62728")
    b.set_yscale("log")
    b.set_xticks(list(x), labels)
    b.set_ylabel("max |change| of one token's output")
    b.set_title(f"measured (values ≤ {floor:g} drawn at {floor:g})")
    b.legend(fontsize=8)
    return _save(fig, out / "layernorm_vs_batchnorm.png")


def rms_vs_layer(data: dict, out: Path) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, case in zip(axes, ("real", "shifted")):
        st = data["stats"][case]
        names = list(st)
        for k, (q, c) in enumerate((("row_mean", "#1f77b4"), ("row_std", "#ff7f0e"), ("row_rms", "#2ca02c"))):
            ax.bar([i + (k - 1) * 0.25 for i in range(len(names))], [st[n][q] for n in names], 0.25, label=q, color=c)
        ax.set_xticks(range(len(names)), names)
        ax.axhline(1, color="k", linewidth=0.5, linestyle=":")
        ax.set_title("GPT residual stream" + (" + 0.5" if case == "shifted" else ""))
        ax.legend(fontsize=7)
    return _save(fig, out / "layernorm_vs_rmsnorm.png")


def training(data: dict, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    colors = {"post": "#d62728", "pre": "#1f77b4"}
    for r in data["runs"]:
        label = f"{r['placement']}-norm, warmup {r['warmup']}" + (f" ({r['failure']} at step {r['steps_done']})"
                                                                 if r["failed"] else "")
        ax.plot(range(len(r["train_loss"])), r["train_loss"], color=colors.get(r["placement"], "k"),
                linestyle="-" if r["warmup"] else "--", label=label)
    ax.axhline(data["unigram_nats"], color="k", linewidth=0.6, linestyle=":", label="unigram plateau")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title(f"{data['depth']} layers, d_model {data['d_model']}, lr 3e-3: real runs")
    ax.legend(fontsize=7)
    return _save(fig, out / "training_post_vs_pre.png")


def pitfall(data: dict, out: Path) -> str:
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    xs = [r["input_std"] for r in rows]
    ax.loglog(xs, [r["std_ratio"] for r in rows], "o-", label="tutorial std ÷ torch std", color="#d62728")
    ax.loglog(xs, [r["max_abs_diff"] for r in rows], "s-", label="max |tutorial − torch|", color="#1f77b4")
    ax.axhline(1, color="k", linewidth=0.5, linestyle=":")
    ax.invert_xaxis()
    ax.set_xlabel("input std (rows of D = 768)")
    ax.set_title("unbiased std + eps outside the root vs torch.nn.LayerNorm")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, out / "tutorial_pitfall.png")


def _box(ax, x, y, text, color):
    ax.add_patch(FancyBboxPatch((x - 0.9, y - 0.28), 1.8, 0.56, boxstyle="round,pad=0.05", fc=color, ec="k", lw=1))
    ax.text(x, y, text, ha="center", va="center", fontsize=10)


def _arrow(ax, a, b, **kw):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, lw=1.2, **kw))


def placement_diagrams(out: Path) -> str:
    """Post-norm and pre-norm sub-layers drawn side by side (SVG and PNG)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 5.2))
    for ax, (title, pre) in zip(axes, (("Post-norm: LN(x + F(x))", False), ("Pre-norm: x + F(LN(x))", True))):
        ax.set_xlim(-2.2, 2.2)
        ax.set_ylim(-0.6, 5.2)
        ax.axis("off")
        ax.set_title(title)
        _box(ax, 0, 0, "x (residual stream)", "#eeeeee")
        if pre:
            _box(ax, 0.9, 1.3, "LayerNorm", "#c7e9c0")
            _box(ax, 0.9, 2.5, "F: attention / FFN", "#c6dbef")
            _box(ax, 0, 3.7, "+", "#fdd0a2")
            _box(ax, 0, 4.8, "out", "#eeeeee")
            _arrow(ax, (0.3, 0.3), (0.9, 1.0))
            _arrow(ax, (0.9, 1.6), (0.9, 2.2))
            _arrow(ax, (0.9, 2.8), (0.3, 3.4))
            _arrow(ax, (-0.6, 0.3), (-0.6, 3.4), color="#d62728")
            ax.text(-1.5, 1.9, "identity path:\nuntouched by\nany norm", fontsize=8, color="#d62728", ha="center")
            _arrow(ax, (0, 4.0), (0, 4.5))
        else:
            _box(ax, 0.9, 1.3, "F: attention / FFN", "#c6dbef")
            _box(ax, 0, 2.5, "+", "#fdd0a2")
            _box(ax, 0, 3.7, "LayerNorm", "#c7e9c0")
            _box(ax, 0, 4.8, "out", "#eeeeee")
            _arrow(ax, (0.3, 0.3), (0.9, 1.0))
            _arrow(ax, (0.9, 1.6), (0.3, 2.2))
            _arrow(ax, (-0.6, 0.3), (-0.6, 2.2), color="#d62728")
            ax.text(-1.5, 1.2, "identity path:\nnormalized at\nevery layer", fontsize=8, color="#d62728", ha="center")
            _arrow(ax, (0, 2.8), (0, 3.4))
            _arrow(ax, (0, 4.0), (0, 4.5))
    fig.tight_layout()
    fig.savefig(out / "pre_vs_post_norm.svg")
    return _save(fig, out / "pre_vs_post_norm.png")
