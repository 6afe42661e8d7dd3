"""Every study figure reads at page width (issue 24): small multiples at most 4 a row, a bounded size, one fixed
colour per placement -- as many colours as placements drawn -- and one legend per figure that names variables."""

import struct

import matplotlib.colors as mcolors
import pytest

from addnorm.placement import NAMES
from addnorm.report import study_figures, study_style

PLACEMENTS = ("post", "pre", "sandwich", "deepnorm", "mix", "rezero", "layerscale", "hc", "mhc", "mhc_lite", "lns",
              "ngpt")  # 12: more than matplotlib's 10-colour cycle


def _rows(placements=PLACEMENTS, lrs=(3e-4, 1e-3, 3e-3, 1e-2), seeds=(0, 1, 2), warmups=(100,)):
    rows, curves, profiles = [], {}, {}
    for i, p in enumerate(placements):
        for lr in lrs:
            for w in warmups:
                for s in seeds:
                    name = f"{p}-{lr}-{w}-{s}"
                    failed = p == "post" and lr > 1e-3
                    loss = 3.3 if failed else 2.0 + 0.05 * i + 0.01 * s
                    rows.append(dict(name=name, placement=p, norm="layer", depth=24, warmup=w, init="xavier",
                                     clip=0.0, lr=lr, seed=s, failed=failed, final_val_loss=loss))
                    curves[name] = [(k, 3.5 - (3.5 - loss) * k / 500) for k in range(49, 500, 50)]
                    profiles[name] = {str(k): [0.1 * (j + 1) for j in range(24)] for k in (0, 50, 499)}
    first = rows[0]
    rows.append(dict(first, name="pre-dyt", placement="pre", norm="dyt", failed=True, final_val_loss=3.2))
    curves["pre-dyt"], profiles["pre-dyt"] = curves[first["name"]], profiles[first["name"]]
    return rows, curves, profiles


def _colours(fig) -> set[str]:
    return {mcolors.to_hex(line.get_color()) for ax in fig.axes for line in ax.lines if len(line.get_xdata())}


def _png_size(path):
    w, h = struct.unpack(">II", path.read_bytes()[16:24])
    return w, h


def test_the_colour_map_gives_every_placement_its_own_colour():
    colours = [study_style.colour(p) for p in NAMES]
    assert len(set(colours)) == len(NAMES) > 10
    assert study_style.colour("post+pre") == study_style.colour("post+pre")  # a per-layer list: stable
    assert study_style.colour("post+pre") not in colours


@pytest.mark.parametrize("warmups", [(100,), (0, 100)])
def test_every_figure_wraps_at_four_panels_has_one_legend_and_a_colour_per_placement(tmp_path, warmups):
    rows, curves, profiles = _rows(warmups=warmups)
    figs = study_figures.figures(rows, curves, profiles)
    assert {"val_loss_curves.png", "val_loss_vs_lr.png", "grad_norm_vs_depth.png", "depth_placement_max_lr.png"} \
        <= set(figs)
    for name, fig in figs.items():
        panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
        columns = {round(ax.get_position().x0, 3) for ax in panels}
        assert len(columns) <= 4, name
        if name in ("val_loss_curves.png", "val_loss_vs_lr.png", "grad_norm_vs_depth.png"):
            assert _colours(fig) == {study_style.colour(p) for p in PLACEMENTS}, name
            assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes), name
            entries = len(fig.legends[0].get_texts())
            assert entries <= len(PLACEMENTS) + 2 + 3, f"{name}: {entries} legend entries, one per run?"
    paths = study_figures.write(rows, curves, profiles, tmp_path)
    for path in paths:
        w, h = _png_size(path)
        assert w <= 2000 and h <= 2000 and 0.5 <= w / h <= 3.5, f"{path.name}: {w}x{h}"
    curves_fig = _png_size(tmp_path / "val_loss_curves.png")
    assert curves_fig[0] > 1000  # 4 learning rates (x 2 warmups): a full row of panels


def test_the_variant_gets_a_line_style_not_a_colour():
    rows, curves, profiles = _rows(placements=("pre", "post"), lrs=(1e-3, 3e-3), seeds=(0,))
    rows += [dict(r, name=r["name"] + "-rms", norm="rms") for r in rows if r["norm"] == "layer"]
    curves.update({r["name"]: curves[r["name"].removesuffix("-rms")] for r in rows if r["name"].endswith("-rms")})
    fig = study_figures.curves_figure(rows, curves)
    assert _colours(fig) == {study_style.colour("pre"), study_style.colour("post")}
    styles = {line.get_linestyle() for ax in fig.axes for line in ax.lines if line.get_marker() in ("None", "")}
    assert len(styles) == 3  # layer, dyt, rms
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"layer", "dyt", "rms"} <= set(labels)


def test_nothing_to_draw_gives_no_figure(tmp_path):
    rows, curves, profiles = _rows(placements=("pre",), lrs=(1e-3,), seeds=(0,))
    assert study_figures.lr_figure(rows) is None  # one learning rate
    assert study_figures.curves_figure(rows, {}) is None and study_figures.grad_figure(rows, {}) is None
    assert study_figures.write([], {}, {}, tmp_path / "none") == []


def _lab(hex_colour):
    import numpy as np

    rgb = np.array(mcolors.to_rgb(hex_colour))
    rgb = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ rgb
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_placement_colours_are_far_apart_in_cielab():
    """Distinct hex strings are not enough: DeepNorm and Mix-LN were two purples, mHC and mHC-lite two cyans."""
    import itertools

    import numpy as np

    colours = study_style.PLACEMENT_COLOURS
    worst = min((float(np.linalg.norm(_lab(colours[a]) - _lab(colours[b]))), a, b)
                for a, b in itertools.combinations(colours, 2))
    assert worst[0] >= study_style.MIN_DELTA_E, worst


def test_the_legend_names_what_the_line_styles_vary_in():
    """The mixing study's line styles are depths: the legend says 'depth', not 'variant'."""
    rows, curves, profiles = _rows(placements=("hc", "mhc"), lrs=(1e-3,), seeds=(0,))
    rows = [r for r in rows if r["norm"] == "layer"]
    rows += [dict(r, name=r["name"] + "-L6", depth=6) for r in rows]
    profiles.update({r["name"]: profiles[r["name"].removesuffix("-L6")] for r in rows if r["name"].endswith("-L6")})
    fig = study_figures.grad_figure(rows, profiles)
    assert fig.legends[0].get_title().get_text() == "colour: placement, line style: depth"
    fig = study_figures.curves_figure(*_rows(placements=("pre", "post"), lrs=(1e-3, 3e-3), seeds=(0,))[:2])
    assert fig.legends[0].get_title().get_text() == "colour: placement, line style: norm"


def test_heat_map_numbers_read_on_dark_and_light_cells():
    """Black on YlOrRd's dark red was unreadable: the text colour follows the cell's luminance."""
    import matplotlib

    cmap = matplotlib.colormaps["YlOrRd"]
    assert study_figures.text_colour(cmap(1.0)) == "w"  # the darkest red
    assert study_figures.text_colour(cmap(0.0)) == "k"  # the palest yellow
    assert study_figures.text_colour((float("nan"),) * 3 + (1.0,)) == "k"
