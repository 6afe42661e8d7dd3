"""Figures from diagnostics records (matplotlib, headless): depth profiles and their evolution over steps."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"no_residual": "#d62728", "none": "#ff7f0e", "post": "#9467bd", "pre": "#2ca02c", "sandwich": "#17becf",
          "deepnorm": "#8c564b", "rezero": "#e377c2", "pre_post": "#7f7f7f", "layerscale": "#bcbd22", "mix": "#1f77b4"}


def _save(fig, path) -> Path:
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _lines(series: dict, colors: dict, path, *, title: str, ylabel: str, xlabel: str, log: bool, marker: str | None) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for label, values in series.items():
        ax.plot(range(len(values)), values, marker=marker, markersize=2.5, linewidth=1.5, label=label,
                color=colors.get(label))
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, path)


def depth_profiles(profiles: dict[str, list[float]], path, *, title: str, ylabel: str, log: bool = True) -> Path:
    """One line per run (e.g. per placement): value vs block index."""
    return _lines(profiles, COLORS, path, title=title, ylabel=ylabel, xlabel="block (0 = input side)", log=log, marker="o")


def norm_output_stats(means: dict[str, list[float]], stds: dict[str, list[float]], path, *, title: str) -> Path:
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name in means:
        a.plot(means[name], label=name, color=COLORS.get(name), linewidth=1.4)
        b.plot(stds[name], label=name, color=COLORS.get(name), linewidth=1.4)
    a.set_title("norm output: mean over features")
    b.set_title("norm output: std over features")
    for ax in (a, b):
        ax.set_xlabel("norm layer (in order)")
        ax.grid(True, alpha=0.3)
    b.legend(fontsize=8, ncol=2)
    fig.suptitle(title)
    return _save(fig, path)


def over_steps(per_step: dict[int, list[float]], path, *, title: str, ylabel: str, log: bool = True) -> Path:
    """Depth profiles at several training steps, darker = later."""
    steps = sorted(per_step)
    cmap = plt.get_cmap("viridis")
    series = {f"step {s}": per_step[s] for s in steps}
    colors = {f"step {s}": cmap(i / max(1, len(steps) - 1)) for i, s in enumerate(steps)}
    return _lines(series, colors, path, title=title, ylabel=ylabel, xlabel="block", log=log, marker=None)
