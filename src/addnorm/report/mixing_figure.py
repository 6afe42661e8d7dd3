"""The mHC claim as a figure: the composite mixing gain (the mHC paper's Amax gain magnitude of the composite
mappings H_res_{L-1} ... H_res_l, diagnostics/mixing.py) of HC, mHC and mHC-lite, from a study's finished runs.

Made only from files: each run's ``summary.json`` (config, ``max_composite_gain_fwd/bwd`` of its last evaluation,
and their largest values at every evaluation as ``gain_curve``), or for a run finished before the summary kept that
curve, its ``metrics.jsonl`` (``composite_gain_fwd/bwd`` per sub-layer at every evaluation). Two rows of panels:
the peak over training of the largest gain against model depth (log axis; forward, backward), and the largest
gain over training at the deepest depth. One colour per placement, and mHC-lite a dashed line with square markers
over mHC's solid one with circles (both sit at 1). The paper's values are marked where they compare like for like:
about 3000 for HC (its peak), 1.6 for mHC's backward (column) gain; mHC's forward gain is 1 by construction, and
the forward panels say why. The paper's numbers are for a 27B model, a scale apart from a study run's."""

from __future__ import annotations

import json
from pathlib import Path

from .study_style import colour

WIDENED = ("hc", "mhc", "mhc_lite")
COLOURS = {p: colour(p) for p in WIDENED}  # the study's fixed placement colours, the same in every figure
STYLES = {"hc": dict(ls="-", marker="o", ms=6, lw=1.6), "mhc": dict(ls="-", marker="o", ms=9, lw=3.0, mfc="none"),
          "mhc_lite": dict(ls="--", marker="s", ms=4, lw=1.4)}  # mHC-lite drawn over mHC, both visible at 1
ORDER = ("mhc", "hc", "mhc_lite")  # drawing order: mHC-lite last, on top of mHC
# the paper's values (arXiv:2512.24880, Figures 3 and 7; a 27B model): (value, which panels, label)
PUBLISHED = ((3000.0, ("fwd", "bwd"), "HC, 27B (paper): ≈3000"), (1.6, ("bwd",), "mHC, 27B (paper): 1.6, backward"))
FORWARD_IS_ONE = ("mHC, mHC-lite: 1 by construction (Sinkhorn ends on the rows:\nevery row of a product of "
                  "row-stochastic H_res sums to 1)")


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
    """Per widened run: its name, placement, depth, seed, the final largest gains, their peaks over training and the
    series (steps done, largest forward gain, largest backward gain) over its evaluations."""
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
                     "peak_fwd": peak(series, "fwd", s["max_composite_gain_fwd"]),
                     "peak_bwd": peak(series, "bwd", s["max_composite_gain_bwd"]), "series": series})
    return rows


def peak(series, key: str, final: float) -> float:
    """The largest of a run's series (``key``: 'fwd' or 'bwd'), its last evaluation's where it has no series."""
    i = 1 if key == "fwd" else 2
    return max([t[i] for t in series], default=final)


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


def _mark_published(ax, key: str) -> None:
    for value, panels, label in PUBLISHED:
        if key in panels:
            ax.axhline(value, color="0.35", lw=0.9, ls=(0, (4, 2)))
            ax.annotate(label, (0.02, value), xycoords=("axes fraction", "data"), xytext=(0, 3),
                        textcoords="offset points", fontsize=7, color="0.25", va="bottom")


def draw(rows: list[dict]):
    """The figure (2 x 2 panels) of ``mixing_data``'s rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    rows = [{**r, **{f"peak_{k}": r.get(f"peak_{k}", peak(r["series"], k, r[f"final_{k}"])) for k in ("fwd", "bwd")}}
            for r in rows]  # entries recorded before the peaks were kept: from their series
    fig, axes = plt.subplots(2, 2, figsize=(9.0, 6.8), squeeze=False)
    placements = [p for p in ORDER if any(r["placement"] == p for r in rows)]
    deepest = max(r["depth"] for r in rows)
    depths = sorted({r["depth"] for r in rows})
    for col, (key, label) in enumerate((("fwd", "forward"), ("bwd", "backward"))):
        ax = axes[0][col]
        for p in placements:
            mine = [r for r in rows if r["placement"] == p]
            ds = sorted({r["depth"] for r in mine})
            means = [sum(r[f"peak_{key}"] for r in mine if r["depth"] == d) /
                     sum(1 for r in mine if r["depth"] == d) for d in ds]
            ax.plot(ds, means, color=COLOURS[p], label=p, zorder=3 if p == "mhc_lite" else 2, **STYLES[p])
            ax.plot([r["depth"] for r in mine], [r[f"peak_{key}"] for r in mine], ".", color=COLOURS[p], alpha=0.5)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(depths))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(d) for d in depths])
        ax.set(xlabel="layers (log scale)", ylabel=f"peak composite gain ({label})", yscale="log",
               title=f"{label}: peak over training, against depth")
        ax = axes[1][col]
        i = 1 if key == "fwd" else 2
        for p in placements:
            for j, r in enumerate(r for r in rows if r["placement"] == p and r["depth"] == deepest):
                if r["series"]:
                    steps = [t[0] for t in r["series"]]
                    style = {k: v for k, v in STYLES[p].items() if k in ("ls", "lw")}
                    ax.plot(steps, [t[i] for t in r["series"]], color=COLOURS[p], label=p if j == 0 else None,
                            zorder=3 if p == "mhc_lite" else 2, **style)
        ax.set(xlabel="step", ylabel=f"largest composite gain ({label})", yscale="log",
               title=f"{label}: over training, {deepest} layers")
    for row in axes:
        for col, key in enumerate(("fwd", "bwd")):
            ax = row[col]
            ax.axhline(1.0, color="0.6", lw=0.8, ls=":")
            _mark_published(ax, key)
            if key == "fwd" and any(p in placements for p in ("mhc", "mhc_lite")):
                ax.text(0.98, 0.55, FORWARD_IS_ONE, transform=ax.transAxes, fontsize=6.5, ha="right", va="center",
                        color="0.25")
            lo, hi = ax.get_ylim()
            ax.set_ylim(min(lo, 0.8), max(hi, 5000.0))  # the paper's 3000 inside every panel
    handles, labels = axes[0][0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda k: WIDENED.index(labels[k]))
    handles, labels = [handles[k] for k in order], [labels[k] for k in order]
    if handles:  # one legend for the figure: the colour (and style) is the placement; points: single seeds
        fig.legend(handles, labels, loc="lower center", ncols=len(labels), fontsize=8, frameon=False,
                   title="placement (points: single seeds; dashed grey: the mHC paper's values at 27B)",
                   title_fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
