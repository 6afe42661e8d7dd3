"""The mHC claim as a figure: the composite mixing gain (the mHC paper's Amax gain magnitude of the products of
the H_res over depth) of HC, mHC and mHC-lite, from a study's finished runs.

Made only from files: each run's ``summary.json`` (config, ``max_composite_gain_fwd/bwd`` of its last evaluation,
and their largest values at every evaluation as ``gain_curve``), or for a run finished before the summary kept that
curve, its ``metrics.jsonl`` (``composite_gain_fwd/bwd`` per sub-layer at every evaluation). Two rows of panels: the
final largest gain against model depth (forward, backward), and the largest gain over training at the deepest
depth (forward, backward). One colour per placement; seeds are separate thin lines or points of that colour.
The paper's numbers at 27B (about 3000 for HC, about 1.6 for mHC) are a scale apart from a study run's."""

from __future__ import annotations

import json
from pathlib import Path

from .study_style import colour

WIDENED = ("hc", "mhc", "mhc_lite")
COLOURS = {p: colour(p) for p in WIDENED}  # the study's fixed placement colours, the same in every figure


def _metrics(run_dir: Path) -> list[dict]:
    out = []
    path = Path(run_dir) / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def mixing_data(summaries: list[dict]) -> list[dict]:
    """Per widened run: its name, placement, depth, seed, the final largest gains and the series (steps done, largest
    forward gain, largest backward gain) over its evaluations."""
    rows = []
    for s in summaries:
        c = s["config"]
        if c["placement"] not in WIDENED or "max_composite_gain_fwd" not in s:
            continue
        series = [tuple(p) for p in s["gain_curve"]] if s.get("gain_curve") else \
            [(m["step"] + 1, max(m["composite_gain_fwd"]), max(m["composite_gain_bwd"]))
             for m in _metrics(Path(s["run_dir"])) if "composite_gain_fwd" in m]
        rows.append({"name": s["name"], "placement": c["placement"], "depth": c["depth"], "seed": c["seed"], "lr": c["lr"],
                     "final_fwd": s["max_composite_gain_fwd"], "final_bwd": s["max_composite_gain_bwd"],
                     "series": series})
    return rows


def mixing_figure(rows: list[dict], path: Path) -> Path | None:
    """Draw ``mixing_data``'s rows into ``path`` (PNG); None when there is no widened run."""
    if not rows:
        return None
    import matplotlib.pyplot as plt

    fig = draw(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw(rows: list[dict]):
    """The figure (2 x 2 panels) of ``mixing_data``'s rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(9.0, 6.4), squeeze=False)
    placements = [p for p in WIDENED if any(r["placement"] == p for r in rows)]
    deepest = max(r["depth"] for r in rows)
    for col, (key, label) in enumerate((("fwd", "forward"), ("bwd", "backward"))):
        ax = axes[0][col]
        for p in placements:
            mine = [r for r in rows if r["placement"] == p]
            depths = sorted({r["depth"] for r in mine})
            means = [sum(r[f"final_{key}"] for r in mine if r["depth"] == d) /
                     sum(1 for r in mine if r["depth"] == d) for d in depths]
            ax.plot(depths, means, "-o", color=COLOURS[p], label=p)
            ax.plot([r["depth"] for r in mine], [r[f"final_{key}"] for r in mine], ".", color=COLOURS[p], alpha=0.5)
        ax.set(xlabel="layers", ylabel=f"largest composite gain ({label})", yscale="log",
               title=f"{label}: end of training, against depth")
        ax = axes[1][col]
        i = 1 if key == "fwd" else 2
        for p in placements:
            for j, r in enumerate(r for r in rows if r["placement"] == p and r["depth"] == deepest):
                if r["series"]:
                    steps = [t[0] for t in r["series"]]
                    ax.plot(steps, [t[i] for t in r["series"]], color=COLOURS[p], lw=1.2,
                            label=p if j == 0 else None)
        ax.set(xlabel="step", ylabel=f"largest composite gain ({label})", yscale="log",
               title=f"{label}: over training, {deepest} layers")
    for ax in axes.flat:
        ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:  # one legend for the figure: the colour is the placement (points: single seeds)
        axes[0][0].legend(handles, labels, fontsize=8, title="placement", title_fontsize=8)
    fig.tight_layout()
    return fig
