"""How every study figure looks, so that they read alike at page width: one fixed colour per placement (the same
in every figure; the DyT/Derf saturation figure colours norms instead, and its legend says so), line styles for
what else tells two series apart (and shades of the colour for a third variable, at most MAX_SHADES values), at
most 4 panels a row, one legend per figure that names variables rather than runs, and a bounded size."""

from __future__ import annotations

import math
import zlib

# one colour per placement, fixed across figures; chosen to stay apart on white (matplotlib's 10-colour cycle
# would repeat after 10 and give two placements one colour), at least MIN_DELTA_E apart in CIELAB: the placements
# drawn together (deepnorm and mix, mhc and mhc_lite, pre and denseformer, rezero and ngpt) differ in hue
PLACEMENT_COLOURS = {
    "post": "#d62728", "pre": "#1f77b4", "sandwich": "#2ca02c", "pre_post": "#98df8a", "deepnorm": "#9467bd",
    "rezero": "#8c564b", "layerscale": "#e377c2", "none": "#7f7f7f", "hc": "#bcbd22", "mhc": "#17becf",
    "mhc_lite": "#00008b", "lns": "#ff7f0e", "denseformer": "#fb9a99", "hybrid": "#637939",
    "hybrid_star": "#fdbf6f", "ngpt": "#1b9e77", "no_residual": "#000000", "mix": "#ff00ff", "attn_res": "#8b008b",
}
MIN_DELTA_E = 25.0  # CIE76 distance of any two placement colours (tests/report/test_study_figures.py checks it)
# for a placement this map does not name (one placement per layer, 'post+pre+...'): picked by a stable hash
SPARE_COLOURS = ("#fdae6b", "#6baed6", "#9c9ede", "#d6616b", "#a1d99b", "#ce6dbd")
# a figure whose colours are norms rather than placements (the DyT/Derf saturation figure, and any figure of one
# placement with several norms; its legend says so): at least MIN_DELTA_E apart in CIELAB, LayerNorm the dark grey
# of a reference, no norm in the blue of pre-LN (a pre-norm placement with LayerNorm)
NORM_COLOURS = {"dyt": "#d95f02", "derf": "#7570b3", "layer": "#404040", "rms": "#1b9e77", "batch": "#e7298a"}
MAX_SHADES = 3  # shades of one colour for a third variable (a learning rate): more would not read apart
SHADE_MIX = 0.5  # the lightest shade: this much of the way from the colour to white
MIN_SHADE_DELTA_E = 15.0  # CIE76 distance of any two colours such a figure draws, shades included (tested)
LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)), (0, (3, 1, 3, 5)))
# a failed run's marker, one per variant (in LINE_STYLES' order), so that failures of two variants of one colour
# read apart where they fall on one point
FAIL_MARKERS = ("x", "+", "1", "2", "3", "4", "|", "_")

MAX_COLUMNS = 4
PANEL_SIZE = (3.4, 2.7)  # inches per panel: four in a row span a page (about 1500 px at DPI)
SINGLE_SIZE = (6.4, 4.8)  # a figure of one panel: half a page wide, room for its legend
DPI = 110


def colour(placement: str) -> str:
    if placement in PLACEMENT_COLOURS:
        return PLACEMENT_COLOURS[placement]
    return SPARE_COLOURS[zlib.crc32(placement.encode()) % len(SPARE_COLOURS)]


def norm_colour(norm: str) -> str:
    return NORM_COLOURS.get(norm) or SPARE_COLOURS[zlib.crc32(norm.encode()) % len(SPARE_COLOURS)]


def shade(hex_colour: str, i: int, n: int) -> str:
    """The i-th of n shades of a colour: the colour itself (i = 0) to SHADE_MIX of the way to white (i = n - 1)."""
    import matplotlib.colors as mcolors

    t = SHADE_MIX * i / (n - 1) if n > 1 else 0.0
    return mcolors.to_hex(tuple(c + (1.0 - c) * t for c in mcolors.to_rgb(hex_colour)))


def styles(variants: list[str]) -> dict[str, object]:
    """A line style per variant (what tells two series of one placement apart: the norm, a width, an option);
    the empty variant (the default) is solid."""
    order = sorted(dict.fromkeys(variants), key=lambda v: v != "")  # else in the order met (the grid's)
    return {v: LINE_STYLES[i % len(LINE_STYLES)] for i, v in enumerate(order)}


def grid_shape(n: int) -> tuple[int, int]:
    """(rows, columns) of n small multiples, wrapping at MAX_COLUMNS."""
    cols = max(1, min(MAX_COLUMNS, n))
    return math.ceil(n / cols), cols


def subplots(n: int, sharey: bool = True):
    """A figure of n panels wrapping at 4 a row, sized per panel; unused axes removed. Returns (fig, axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = grid_shape(n)
    size = SINGLE_SIZE if n == 1 else (PANEL_SIZE[0] * cols + 0.4, PANEL_SIZE[1] * rows + 0.9)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, sharey=sharey)
    flat = list(axes.flat)
    for ax in flat[n:]:
        fig.delaxes(ax)
    return fig, flat[:n]


def legend(fig, placements: list[str], variants: dict[str, object], extra=(), title: str | None = None,
           variant_name: str = "variant", colour_name: str = "placement", colour_of=colour,
           shades: list[str] = (), shade_name: str = "shade", markers: dict[str, str] | None = None,
           default_label: str = "default") -> None:
    """One legend for the whole figure, below the panels: a colour per placement (or per what ``colour_of``
    colours, named ``colour_name``: 'norm'), a line style per variant (when there is more than one;
    ``variant_name`` names what they vary in: 'norm', 'depth', ...), a shade per entry of ``shades`` (darkest
    first; ``shade_name`` names them: 'learning rate'), and ``extra`` (handle, label) pairs such as what a marker
    means, ``markers`` a marker per variant (drawn on its line style's entry); then the layout, leaving room for it
    and for the figure's ``title``; ``default_label`` names the empty variant."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colour_of(p), lw=2) for p in placements]
    labels = list(placements)
    if len(variants) > 1:
        for v, ls in variants.items():
            handles.append(Line2D([], [], color="0.3", ls=ls, lw=1.5, marker=(markers or {}).get(v), ms=6))
            labels.append(v or default_label)
    if len(shades) > 1:
        for i, label in enumerate(shades):
            handles.append(Line2D([], [], color=shade("#404040", i, len(shades)), lw=2))
            labels.append(label)
    for h, label in extra:
        handles.append(h)
        labels.append(label)
    # entries about 1.6 in wide, or as wide as the longest label needs (0.5 in of handle, ~0.055 in a character)
    entry = max(1.6, 0.5 + 0.055 * max(map(len, labels)))
    ncols = max(1, min(len(labels), int(fig.get_figwidth() / entry)))
    fig.legend(handles, labels, loc="lower center", ncols=ncols, fontsize=8, frameon=False,
               title=f"colour: {colour_name}" + (f", line style: {variant_name}" if len(variants) > 1 else "")
               + (f", shade: {shade_name}" if len(shades) > 1 else ""), title_fontsize=8)
    rows = math.ceil(len(labels) / ncols)
    fig.set_figheight(fig.get_figheight() + 0.2 * rows)  # the legend's rows below the panels, not in them
    top = 1.0
    if title:
        fig.suptitle(title, fontsize=10)
        top = 1.0 - 0.35 / fig.get_figheight()
    fig.tight_layout(rect=(0, min(0.45, (0.28 + 0.2 * rows) / fig.get_figheight()), 1, top))
