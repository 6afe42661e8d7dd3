"""Every study figure reads at page width (issue 24): small multiples at most 4 a row, a bounded size, one fixed
colour per placement -- as many colours as placements drawn -- and one legend per figure that names variables."""

import struct

import matplotlib.colors as mcolors
import pytest

from addnorm.model.placement import NAMES
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


# ---- the DyT/Derf saturation over training (Verma 2026's measure, probe.py): a panel per norm slot

ALPHAS = ("0.2", "0.5", "0.8/0.2/0.2", "2", "8")  # the dyt preset's alpha0 axis, as rows hold it


def _saturation_rows(lrs=(1e-3, 3e-3), seeds=(0,)):
    """The dyt preset's shape: DyT and Derf over alpha0 and learning rate, LayerNorm beside them (no curve)."""
    rows, saturation = [], {}
    for norm in ("dyt", "derf"):
        for a in ALPHAS:
            for lr in lrs:
                for s in seeds:
                    name = f"pre-{norm}-a{a}-{lr}-{s}"
                    rows.append(dict(name=name, placement="pre", norm=norm, dyt_alpha=a, depth=6, warmup=50,
                                     init="xavier", clip=0.0, lr=lr, seed=s, failed=a in ("0.2", "0.5"),
                                     final_val_loss=3.2))
                    saturation[name] = [[k, {"attn": 0.3 + 0.001 * k * (norm == "dyt"), "mlp": 0.4 + lr * 50,
                                             "final": min(1.0, 0.9 + k / 2000)}] for k in range(50, 401, 50)]
    for lr in lrs:
        rows.append(dict(rows[0], name=f"pre-layer-{lr}", norm="layer", dyt_alpha="0.5", lr=lr, failed=False))
    return rows, saturation


def test_the_saturation_figure_has_a_panel_per_slot_a_colour_per_norm_and_a_shade_per_learning_rate(tmp_path):
    import itertools

    import matplotlib.pyplot as plt
    import numpy as np

    rows, saturation = _saturation_rows()
    fig = study_figures.saturation_figure(rows, saturation)
    assert [ax.get_title() for ax in fig.axes] == ["attention norm", "FFN norm", "final norm"]
    assert len({round(ax.get_position().x0, 3) for ax in fig.axes}) == 3  # one row
    assert all(ax.get_ylim()[0] <= 0.0 and 1.0 <= ax.get_ylim()[1] <= 1.05 for ax in fig.axes)
    drawn = [line for ax in fig.axes for line in ax.lines if line.get_marker() in ("None", "")]
    assert len(drawn) == 3 * len(saturation)  # every DyT/Derf run in every panel, LayerNorm in none
    assert list(drawn[0].get_xdata()) == list(range(50, 401, 50))
    shades = {study_style.shade(study_style.norm_colour(n), i, 2) for n in ("dyt", "derf") for i in (0, 1)}
    assert _colours(fig) == shades
    worst = min(float(np.linalg.norm(_lab(a) - _lab(b))) for a, b in itertools.combinations(shades, 2))
    assert worst >= study_style.MIN_SHADE_DELTA_E
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    legend = fig.legends[0]
    assert legend.get_title().get_text() == "colour: norm, line style: α₀, shade: learning rate"
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["dyt", "derf", *(f"α {a}" for a in ALPHAS), "lr 0.001", "lr 0.003",
                      "run failed (last evaluation)"]
    one_lr = study_figures.saturation_figure(*_saturation_rows(lrs=(1e-3,), seeds=(0, 1)))
    assert _colours(one_lr) == {study_style.norm_colour("dyt"), study_style.norm_colour("derf")}
    assert one_lr.legends[0].get_title().get_text() == "colour: norm, line style: α₀"  # seeds: no entry of their own
    paths = study_figures.write(rows, {}, {}, tmp_path, saturation)
    assert tmp_path / "saturation_over_training.png" in paths
    w, h = _png_size(tmp_path / "saturation_over_training.png")
    assert 1000 < w <= 2000 and h <= 2000 and 0.5 <= w / h <= 3.5, (w, h)
    plt.close(fig)
    plt.close(one_lr)


def test_the_saturation_figure_is_drawn_only_for_runs_with_a_saturation_curve():
    import matplotlib.pyplot as plt

    rows, curves, profiles = _rows(placements=("pre",), lrs=(1e-3, 3e-3), seeds=(0,))  # a DyT row, no curve
    assert study_figures.saturation_figure(rows, {}) is None
    for saturation in (None, {"pre-dyt": []}):
        figs = study_figures.figures(rows, curves, profiles, saturation)
        assert figs and "saturation_over_training.png" not in figs
        for fig in figs.values():
            plt.close(fig)
    assert "saturation_over_training.png" in dict(study_figures.FIGURES)  # the page shows it, with its caption
    assert "Verma 2026" in study_figures.CAPTIONS["saturation_over_training.png"]


def test_the_norm_colours_are_far_apart_in_cielab():
    import itertools

    import numpy as np

    colours = study_style.NORM_COLOURS
    assert min(float(np.linalg.norm(_lab(colours[a]) - _lab(colours[b])))
               for a, b in itertools.combinations(colours, 2)) >= study_style.MIN_DELTA_E
