"""The study's figures, from its rows (one per finished run), validation curves ({run name: [(step, loss)]}),
per-block gradient profiles ({run name: {step: [norm per block]}}) and the DyT/Derf runs' saturation curves
({run name: [(step, {slot: fraction saturated})]}), drawn in study_style's conventions: a colour
per placement, a line style per variant (norm, width, option), small multiples for where the runs were trained
(learning rate, warmup, depth, ...), one legend per figure.

Each ``*_figure`` returns a matplotlib Figure (None when there is nothing to draw), so tests can read its lines;
``write`` saves them under a directory."""

from __future__ import annotations

import math
from pathlib import Path

from ..harness.store import atomic_write
from . import study_style as style
from .study_tables import axis, axis_text

WHAT = ("norm", "n_streams", "value_residual", "dyt_alpha", "embed_scale")  # with the placement: what a series is
WHERE = ("lr", "warmup", "depth", "d_model", "steps", "clip", "init")  # how it was trained: a panel
_FORMAT = {"lr": "lr {}", "warmup": "warmup {}", "depth": "L{}", "d_model": "d{}", "steps": "{} steps",
           "clip": "clip {}", "init": "{} init", "norm": "{}", "n_streams": "n={}", "value_residual": "value residual {}",
           "dyt_alpha": "α {}", "embed_scale": "embedding ×{}", "placement": "{}"}


# what a line style stands for, as a legend names it
_AXIS_NAMES = {"norm": "norm", "n_streams": "streams", "value_residual": "value residual", "dyt_alpha": "α₀",
               "embed_scale": "embedding scale",
               "depth": "depth", "d_model": "width", "steps": "steps", "warmup": "warmup", "clip": "clipping",
               "init": "init", "lr": "learning rate", "placement": "placement"}


def _varying(rows, axes) -> list[str]:
    return [a for a in axes if len({axis(r, a) for r in rows}) > 1]


def _label(r: dict, axes: list[str]) -> str:
    return ", ".join(_FORMAT[a].format(axis_text(a, axis(r, a))) for a in axes)


def _sort_key(rows, axes):
    def key(label):
        r = next(r for r in rows if _label(r, axes) == label)
        return tuple((0, axis(r, a)) if isinstance(axis(r, a), int | float) else (1, str(axis(r, a))) for a in axes)
    return key


class _Series:
    """Who is drawn how: the placements (colours) and variants (line styles; a failed run's marker) of a set of
    rows. Rows of one placement and several norms (the DyT/Derf audit) are coloured by norm instead: a colour never
    says 'pre-LN' of a run that is not."""

    def __init__(self, rows: list[dict], what_extra: tuple[str, ...] = ()):
        what = _varying(rows, WHAT + what_extra)
        one_placement = len({r["placement"] for r in rows}) == 1
        self.by = "norm" if one_placement and "norm" in what else "placement"
        self.what = [a for a in what if a != self.by]
        self.colours = list(dict.fromkeys(r[self.by] for r in rows))
        self.placements = self.colours if self.by == "placement" else []
        variants = [self.variant(r) for r in rows]
        self.styles = style.styles(variants)
        self.markers = {v: style.FAIL_MARKERS[i % len(style.FAIL_MARKERS)] for i, v in enumerate(self.styles)}

    def variant(self, r: dict) -> str:
        """What tells the row's series apart beyond its colour; alpha0 only for a DyT/Derf norm (the others
        carry the default, which means nothing for them)."""
        bounded = r.get("norm") in ("dyt", "derf") and r.get("placement") != "ngpt"
        return _label(r, [a for a in self.what if a != "dyt_alpha" or bounded])

    def colour(self, r: dict) -> str:
        return style.colour(r["placement"]) if self.by == "placement" else style.norm_colour(r["norm"])

    def kw(self, r: dict) -> dict:
        return {"color": self.colour(r), "ls": self.styles[self.variant(r)]}

    def fail_marker(self, r: dict) -> str:
        return self.markers[self.variant(r)] if len(self.styles) > 1 else "x"

    def legend(self, fig, extra=(), title=None, markers: bool = False):
        style.legend(fig, self.colours, self.styles, extra, title,
                     ", ".join(_AXIS_NAMES.get(a, a) for a in self.what) or "variant", colour_name=self.by,
                     colour_of=style.colour if self.by == "placement" else style.norm_colour,
                     markers=self.markers if markers else None,
                     default_label="no α₀ (not DyT/Derf)" if "dyt_alpha" in self.what else "default")


def _panels(rows: list[dict], axes_: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the axes that vary among ``axes_``, the panels' labels in order)."""
    where = _varying(rows, axes_)
    labels = sorted({_label(r, where) for r in rows}, key=_sort_key(rows, where))
    return where, labels


def curves_figure(rows: list[dict], curves: dict[str, list]):
    """Validation loss against step: a panel per training setting, a line per run (seeds: lines of one colour
    and style), an x where a run failed; beside a panel whose runs end too close together to read apart at its
    scale, a zoom on the last half of training (``zoom``)."""
    from matplotlib.lines import Line2D

    rows = [r for r in rows if curves.get(r["name"])]
    if not rows:
        return None
    where, labels = _panels(rows, WHERE)
    zooms = {p: zoom([r for r in rows if _label(r, where) == p], curves) for p in labels}
    panels = [(p, z) for p in labels for z in ((None, zooms[p]) if zooms[p] else (None,))]
    series = _Series(rows)
    fig, axes = style.subplots(len(panels), sharey=not any(zooms.values()))
    for ax, (panel, z) in zip(axes, panels):
        for r in rows:
            if _label(r, where) != panel:
                continue
            steps, vals = zip(*curves[r["name"]])
            line = ax.plot(steps, vals, lw=1.0, alpha=0.8, **series.kw(r))[0]
            if r["failed"]:
                ax.plot(steps[-1], vals[-1], "x", color=line.get_color(), ms=6)
        title = panel if z is None else f"{panel + ': ' if panel else ''}zoom, second half"
        if z is not None:
            ax.set_xlim(z[0], max(s for r in rows if _label(r, where) == panel for s, _ in curves[r["name"]]))
            ax.set_ylim(z[1], z[2])
        if title:
            ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    whole = [ax for ax, (_, z) in zip(axes, panels) if z is None]
    if any(zooms.values()):  # the panels that are not zooms keep one scale
        lo, hi = min(ax.get_ylim()[0] for ax in whole), max(ax.get_ylim()[1] for ax in whole)
        for ax in whole:
            ax.set_ylim(lo, hi)
    axes[0].set_ylabel("validation loss (nats/byte)", fontsize=8)
    series.legend(fig, [(Line2D([], [], color="0.3", marker="x", ls=""), "run failed (last evaluation)")],
                  "Validation loss during training; one line per seed")
    return fig


ZOOM_NEAR = 0.1  # a zoom shows the runs that trained and end within 10 % of the best run's final loss ...
ZOOM_WHEN = 0.01  # ... where their ends lie closer together on average than this share of the panel's range


def zoom(rows: list[dict], curves: dict[str, list]) -> tuple[float, float, float] | None:
    """(first step, low, high) of a zoom on the end of training for the runs of one panel, or None where their ends
    read apart without one: the last half of the steps, the loss range of the runs that trained and end near the
    best (within ZOOM_NEAR), when their final losses lie closer together on average (their span over the gaps
    between them) than ZOOM_WHEN of the panel's range: many lines ending in one band."""
    ok = [r for r in rows if not r["failed"] and _finite(curves[r["name"]][-1][1])]
    if len(ok) < 2:
        return None
    best = min(curves[r["name"]][-1][1] for r in ok)
    near = [r for r in ok if curves[r["name"]][-1][1] <= best + ZOOM_NEAR * abs(best)]
    every = [v for r in rows for _, v in curves[r["name"]] if _finite(v)]
    ends = [curves[r["name"]][-1][1] for r in near]
    span = max(every) - min(every)
    if len(near) < 2 or span <= 0 or (max(ends) - min(ends)) / (len(ends) - 1) >= ZOOM_WHEN * span:
        return None
    half = max(s for r in near for s, _ in curves[r["name"]]) / 2
    start = min(s for r in near for s, _ in curves[r["name"]] if s >= half)  # an evaluation's step
    vals = [v for r in near for s, v in curves[r["name"]] if s >= start and _finite(v)]
    pad = 0.05 * (max(vals) - min(vals)) or 0.01
    return start, min(vals) - pad, max(vals) + pad


SLOT_TITLES = {"attn": "attention norm", "mlp": "FFN norm", "final": "final norm"}  # probe.py's slots, in order
# what else tells two DyT/Derf runs of one norm apart: a line style; a training setting (WHERE) with at most
# MAX_SHADES values, the first that varies (the learning rate, in the dyt preset), is a shade of the norm's colour
_SATURATION_STYLE = ("placement", "dyt_alpha", "embed_scale", "n_streams", "value_residual")


def saturation_figure(rows: list[dict], saturation: dict[str, list]):
    """The fraction of DyT/Derf inputs saturated (|z| > 2 with z = alpha * x (+ shift for Derf), probe.py: the
    measure of Verma 2026) against step: a panel per norm slot (attention, FFN, final), a colour per norm, a line
    style per alpha0 (and whatever else tells the runs apart), a shade per learning rate, a line per seed, an x
    where a run failed. None when no run recorded a saturation curve."""
    from matplotlib.lines import Line2D

    rows = [r for r in rows if saturation.get(r["name"])]
    if not rows:
        return None
    order = list(SLOT_TITLES)
    slots = sorted({slot for r in rows for _, at in saturation[r["name"]] for slot in at},
                   key=lambda s: (order.index(s) if s in order else len(order), s))
    norms = list(dict.fromkeys(r["norm"] for r in rows))
    vary = _varying(rows, _SATURATION_STYLE + WHERE)
    by_shade = [a for a in vary if a in WHERE and len({axis(r, a) for r in rows}) <= style.MAX_SHADES][:1]
    by_style = [a for a in vary if a not in by_shade]
    shades = sorted({_label(r, by_shade) for r in rows}, key=_sort_key(rows, by_shade))
    styles = style.styles(sorted({_label(r, by_style) for r in rows}, key=_sort_key(rows, by_style)))

    def kw(r):
        return {"color": style.shade(style.norm_colour(r["norm"]), shades.index(_label(r, by_shade)), len(shades)),
                "ls": styles[_label(r, by_style)]}

    fig, axes = style.subplots(len(slots))
    for ax, slot in zip(axes, slots):
        for r in rows:
            points = [(step, at[slot]) for step, at in saturation[r["name"]] if slot in at]
            if not points:
                continue
            steps, vals = zip(*points)
            ax.plot(steps, vals, lw=1.1, alpha=0.9, **kw(r))
            if r["failed"]:
                ax.plot(steps[-1], vals[-1], "x", color=kw(r)["color"], ms=6)
        ax.set_title(SLOT_TITLES.get(slot, slot), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylim(-0.03, 1.03)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("fraction of inputs saturated (|z| > 2)", fontsize=8)
    extra = [(Line2D([], [], color="0.3", marker="x", ls=""), "run failed (last evaluation)")] \
        if any(r["failed"] for r in rows) else []
    style.legend(fig, norms, styles, extra, "DyT/Derf inputs saturated during training (|αx| > 2); one line per seed",
                 ", ".join(_AXIS_NAMES.get(a, a) for a in by_style) or "variant", colour_name="norm",
                 colour_of=style.norm_colour, shades=shades,
                 shade_name=", ".join(_AXIS_NAMES.get(a, a) for a in by_shade))
    return fig


def lr_figure(rows: list[dict]):
    """Final validation loss against learning rate (Wortsman et al. 2023's view): a line through the means of
    the runs that trained with their bootstrap intervals (nominal 95 %; the min–max range at 3 seeds), every run
    a dot, failures at the top in their series' colour and variant's marker, spread sideways (by FAIL_DODGE
    decades a series) so that the failures of several series at one learning rate do not hide each other."""
    from matplotlib.lines import Line2D

    from .study_stats import bootstrap_mean

    if len({r["lr"] for r in rows}) < 2 or not rows:
        return None
    where, panels = _panels(rows, tuple(a for a in WHERE if a != "lr"))
    series = _Series(rows)
    finite = [r["final_val_loss"] for r in rows if _finite(r["final_val_loss"])]
    top = (max(finite) if finite else 1.0) * 1.03
    fig, axes = style.subplots(len(panels))
    for ax, panel in zip(axes, panels):
        mine = [r for r in rows if _label(r, where) == panel]
        keys = list(dict.fromkeys((r["placement"], r["norm"], series.variant(r)) for r in mine))
        failing = [k for k in keys if any(r["failed"] for r in mine if (r["placement"], r["norm"], series.variant(r)) == k)]
        for key in keys:
            rs = [r for r in mine if (r["placement"], r["norm"], series.variant(r)) == key]
            kw = series.kw(rs[0])
            ok = [r for r in rs if not r["failed"] and _finite(r["final_val_loss"])]
            xs = sorted({r["lr"] for r in ok})
            cis = [bootstrap_mean([r["final_val_loss"] for r in ok if r["lr"] == x]) for x in xs]
            if xs:
                err = [[c.mean - (c.low if c.has_interval else c.mean) for c in cis],
                       [(c.high if c.has_interval else c.mean) - c.mean for c in cis]]
                ax.errorbar(xs, [c.mean for c in cis], yerr=err, capsize=2, lw=1.3, **kw)
                ax.plot([r["lr"] for r in ok], [r["final_val_loss"] for r in ok], ".", color=kw["color"], ms=3)
            bad = [r for r in rs if r["failed"]]
            if bad:
                shift = 10 ** (FAIL_DODGE * (failing.index(key) - (len(failing) - 1) / 2))
                ax.plot([r["lr"] * shift for r in bad], [r["final_val_loss"] if _finite(r["final_val_loss"]) and
                                                         r["final_val_loss"] < top else top for r in bad],
                        ls="", marker=series.fail_marker(rs[0]), color=kw["color"], ms=7, mew=1.4, gid="failed")
        ax.set_xscale("log")
        if panel:
            ax.set_title(panel, fontsize=9)
        ax.set_xlabel("learning rate", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("final validation loss", fontsize=8)
    several = len(series.styles) > 1
    series.legend(fig, [(Line2D([], [], color="0.3", marker="x", ls=""),
                         "run failed (its variant's marker)" if several else "run failed"),
                        (Line2D([], [], color="0.3", marker=".", ls=""), "one run"),
                        (Line2D([], [], color="0.3", marker="|", ls="-"),
                         "mean, bootstrap interval (3 seeds: min–max)")],
                  "Final validation loss against learning rate", markers=several)
    return fig


FAIL_DODGE = 0.012  # decades between the failure markers of two series at one learning rate (log axis)


def grad_figure(rows: list[dict], profiles: dict[str, dict]):
    """Per-block gradient norm against depth: a panel for the first step, step 50 and the last step (each run's
    own: a run that failed stopped early, and is drawn at its last step beside the others rather than in a panel of
    its own), a line per placement and variant, from the first seed at the learning rate where most runs trained;
    no panel is empty."""
    have = [r for r in rows if profiles.get(r["name"])]
    if not have:
        return None
    lrs = sorted({r["lr"] for r in have})
    lr = max(lrs, key=lambda x: (sum(not r["failed"] for r in have if r["lr"] == x), x))
    first = min(r["seed"] for r in have)
    chosen = [r for r in have if r["lr"] == lr and r["seed"] == first]
    series = _Series(chosen, what_extra=tuple(a for a in WHERE if a != "lr"))
    picked = {r["name"]: profile_steps(profiles[r["name"]]) for r in chosen}
    panels = [k for k in ("first", "50", "last") if any(k in p for p in picked.values())]
    fig, axes = style.subplots(len(panels))
    for ax, panel in zip(axes, panels):
        at = set()
        for r in chosen:
            if panel in picked[r["name"]]:
                step = picked[r["name"]][panel]
                at.add(step)
                g = profiles[r["name"]].get(str(step)) or profiles[r["name"]].get(step)
                ax.semilogy(range(len(g)), g, marker=".", ms=3, lw=1.2, **series.kw(r))
        ax.set_title(f"step {at.pop()}" if len(at) == 1 else
                     "last step of each run (a failed run's: earlier)", fontsize=9)
        ax.set_xlabel("block", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("gradient norm of the block's weights", fontsize=8)
    series.legend(fig, title=f"Per-block gradient norm, lr {lr:g}, seed {first}")
    return fig


def profile_steps(profile: dict) -> dict[str, int]:
    """The steps of a run's gradient profile ({step: norms}) a panel shows: 'first', '50' (where recorded, and not
    the first or last) and 'last' (the run's own last step: a failed run's is early)."""
    steps = sorted(int(s) for s, g in profile.items() if g)
    if not steps:
        return {}
    out = {"first": steps[0], "last": steps[-1]}
    if 50 in steps[1:-1]:
        out["50"] = 50
    return out


def text_colour(rgba) -> str:
    """Black or white, whichever reads on a cell of this colour (WCAG relative luminance; NaN: black)."""
    def lin(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(c) for c in rgba[:3])
    return "w" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.179 else "k"


EMPTY_CELL = "0.85"  # a heat map's cell without a value (NaN): light grey, apart from the scale's palest yellow


def _heatmap(fig, ax, values, xs, ys, fmt, title, xlabel, ylabel, scale, vmin=None, vmax=None):
    """Every cell coloured and labelled, a cell without a value (NaN) too: grey, with ``fmt``'s text for NaN in a
    colour that reads on it (white text on the default transparent 'bad' colour was invisible)."""
    import matplotlib

    cmap = matplotlib.colormaps["YlOrRd"].with_extremes(bad=EMPTY_CELL)
    im = ax.imshow(values, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(range(len(xs)), [f"{x:g}" if isinstance(x, float) else str(x) for x in xs], fontsize=7,
                  rotation=30 if len(xs) > 5 else 0)
    ax.set_yticks(range(len(ys)), [str(y) for y in ys], fontsize=7)
    for i in range(len(ys)):
        for j in range(len(xs)):
            ax.text(j, i, fmt(values[i][j]), ha="center", va="center", fontsize=7,
                    color=text_colour(im.cmap(im.norm(values[i][j]))))
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.046).set_label(scale, fontsize=8)


def failure_map_figure(rows: list[dict]):
    """Share of runs failed, warmup x learning rate, a panel per post/pre setting."""
    from .study_tables import variants

    lrs, warmups = sorted({r["lr"] for r in rows}), sorted({r["warmup"] for r in rows})
    panel = variants(rows, without=("warmup",))
    panels = sorted({panel[id(r)] for r in rows if r["placement"] in ("post", "pre")})
    if not panels or len(lrs) * len(warmups) < 2:
        return None
    fig, axes = style.subplots(len(panels), sharey=False)
    for ax, p in zip(axes, panels):
        cell = {(w, lr): [r["failed"] for r in rows if panel[id(r)] == p and r["warmup"] == w and r["lr"] == lr]
                for w in warmups for lr in lrs}
        vals = [[sum(cell[w, lr]) / len(cell[w, lr]) if cell[w, lr] else math.nan for lr in lrs] for w in warmups]
        _heatmap(fig, ax, vals, lrs, warmups, lambda v: "—" if v != v else f"{v:.0%}",
                 f"{p}: share of runs failed", "learning rate", "warmup steps", "share of runs failed",
                 vmin=0.0, vmax=1.0)
    fig.tight_layout()
    return fig


def max_lr_figure(rows: list[dict]):
    """The largest learning rate that trained (any seed), depth x placement."""
    from .study_tables import variants

    lrs, depths = sorted({r["lr"] for r in rows}), sorted({r["depth"] for r in rows})
    if len(lrs) < 2:
        return None
    column = variants(rows, without=("depth",))
    placements = list(dict.fromkeys(column[id(r)] for r in rows))
    vals = [[max([r["lr"] for r in rows if r["depth"] == d and column[id(r)] == p and not r["failed"]],
                 default=math.nan) for p in placements] for d in depths]
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(min(13.0, 0.9 * len(placements) + 2.5), max(4.0, 0.5 * len(depths) + 2.4)))
    _heatmap(fig, ax, [[math.log10(v) if v == v else math.nan for v in r] for r in vals], placements, depths,
             lambda v: "none" if v != v else f"{10 ** v:.0e}", "largest learning rate that trained (any seed); "
             "none: no learning rate of the grid trained", "placement", "depth", "log10 learning rate")
    ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    return fig


def _finite(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


FIGURES = (("val_loss_curves.png", "validation loss curves, a panel per training setting"),
           ("val_loss_vs_lr.png", "final validation loss against learning rate, 95 % intervals, failures marked"),
           ("warmup_lr_failures.png", "share of runs failed, warmup x learning rate, post vs pre"),
           ("depth_placement_max_lr.png", "largest learning rate that trained, depth x placement"),
           ("grad_norm_vs_depth.png", "per-block gradient norm against depth at chosen steps"),
           ("saturation_over_training.png", "fraction of DyT/Derf inputs saturated (|αx| > 2) per norm slot over "
                                            "training"),
           # drawn by report/mixing_figure.py for the widened-stream runs (HC, mHC, mHC-lite)
           ("composite_gain.png", "largest composite mixing gain of HC, mHC and mHC-lite, forward and backward, "
                                  "against depth and over training"))
# a caption shown under the figure on the study's page, where the alt text above is not enough
CAPTIONS = {"saturation_over_training.png": (
    "Saturation of the DyT/Derf norms at each evaluation: the fraction of a slot's inputs whose argument z = α·x "
    "(+ s for Derf) has |z| > 2, where tanh'(2) = 0.07 and erf'(2)/erf'(0) = 0.02, so that little gradient passes "
    "— the measure of Verma 2026 (arXiv:2604.23434), on one fixed validation batch in evaluation mode. A panel per "
    "norm slot (attention, FFN, final), a colour per norm, one line per run.")}


def figures(rows: list[dict], curves: dict, profiles: dict, saturation: dict | None = None) -> dict[str, object]:
    """{file name: Figure} of every figure the data allows."""
    made = {"val_loss_curves.png": curves_figure(rows, curves), "val_loss_vs_lr.png": lr_figure(rows),
            "warmup_lr_failures.png": failure_map_figure(rows), "depth_placement_max_lr.png": max_lr_figure(rows),
            "grad_norm_vs_depth.png": grad_figure(rows, profiles),
            "saturation_over_training.png": saturation_figure(rows, saturation or {})}
    return {k: v for k, v in made.items() if v is not None}


def write(rows: list[dict], curves: dict, profiles: dict, out_dir: Path, saturation: dict | None = None) -> list[Path]:
    """Save every figure the data allows as PNG under ``out_dir`` (atomically: shards may share it)."""
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    paths = []
    if not rows:
        return paths
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, fig in figures(rows, curves, profiles, saturation).items():
        path = out_dir / name
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=style.DPI, format="png"))
        plt.close(fig)
        paths.append(path)
    return paths
