"""Every study figure reads at page width (issue 24): small multiples at most 4 a row, a bounded size, one fixed
colour per placement -- as many colours as placements drawn -- and one legend per figure that names variables."""

import math
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


# ---- issue 37: no arm in another's colour, no unlabelled cell, a zoom where the ends overlap, no empty panel

def _markers(fig, gid=None):
    """(x, y, colour, marker) of every marker drawn without a line (the failures: gid 'failed')."""
    return [(x, y, mcolors.to_hex(line.get_color()), line.get_marker()) for ax in fig.axes for line in ax.lines
            if line.get_linestyle() in ("None", "") and (gid is None or line.get_gid() == gid)
            for x, y in zip(line.get_xdata(), line.get_ydata())]


def test_one_placement_with_several_norms_is_coloured_by_norm_and_its_failures_read_apart():
    """The DyT/Derf audit's rows (all pre-norm): DyT's and Derf's failure crosses were drawn in pre-LN's blue, one
    on another."""
    import matplotlib.pyplot as plt

    rows, _ = _saturation_rows()
    fig = study_figures.lr_figure(rows)
    failed = _markers(fig, "failed")
    assert len(failed) == sum(r["failed"] for r in rows)
    colours = {m[2] for m in failed}
    assert colours == {study_style.norm_colour("dyt"), study_style.norm_colour("derf")}
    assert study_style.colour("pre") not in {c for *_, c, _ in _markers(fig)} | _colours(fig)
    assert len({(x, y) for x, y, *_ in failed}) == len(failed)  # no failure hides another
    assert len({(c, m) for _, _, c, m in failed}) == len({(r["norm"], r["dyt_alpha"]) for r in rows if r["failed"]})
    legend = fig.legends[0]
    assert legend.get_title().get_text() == "colour: norm, line style: α₀"
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:3] == ["dyt", "derf", "layer"] and "no α₀ (not DyT/Derf)" in labels
    norms = [study_style.norm_colour(n) for n in ("dyt", "derf", "layer")]
    assert len(set(norms)) == 3 and study_style.colour("pre") not in norms
    plt.close(fig)


def test_every_heat_map_cell_is_labelled_in_a_colour_that_reads_on_it():
    """A depth at which no learning rate trained was a white cell with white text: nothing to read."""
    import matplotlib.pyplot as plt

    rows = [dict(name=f"{p}-{d}-{lr}", placement=p, norm="layer", depth=d, lr=lr, warmup=100, seed=0,
                 failed=p == "post" and d == 48, final_val_loss=2.5) for p in ("post", "pre") for d in (6, 48)
            for lr in (1e-3, 3e-3)]
    fig = study_figures.max_lr_figure(rows)
    ax = fig.axes[0]
    image = ax.images[0]
    cells = {(round(t.get_position()[0]), round(t.get_position()[1])): t for t in ax.texts}
    assert len(cells) == 4 and all(t.get_text() for t in cells.values())
    for (j, i), t in cells.items():
        v = image.get_array()[i][j]
        face = image.cmap(image.norm(v)) if not hasattr(v, "mask") or not v.mask else image.cmap.get_bad()
        assert t.get_color() == study_figures.text_colour(face)
        assert study_figures.text_colour(face) == ("w" if sum(face[:3]) < 1.2 else "k")
    assert cells[(0, 1)].get_text() == "none" and cells[(0, 1)].get_color() == "k"  # post at 48 layers
    assert mcolors.to_hex(image.cmap.get_bad()) == mcolors.to_hex(study_figures.EMPTY_CELL)
    assert "none: no learning rate of the grid trained" in ax.get_title()
    plt.close(fig)


def _long_rows():
    """The long preset's shape: 8 placements converging to within 0.1 nats over 10000 steps, one DyT far above."""
    rows, curves = [], {}
    for i, p in enumerate(("post", "pre", "sandwich", "deepnorm", "mix", "layerscale", "lns", "mhc")):
        end = 1.33 + 0.01 * i
        rows.append(dict(name=p, placement=p, norm="layer", depth=6, lr=1e-3, warmup=100, seed=0, failed=False,
                         final_val_loss=end))
        curves[p] = [(k, end + (3.3 - end) * math.exp(-k / 800)) for k in range(99, 10000, 100)]
    rows.append(dict(rows[1], name="dyt", norm="dyt", final_val_loss=1.9))
    curves["dyt"] = [(k, 1.9 + 1.4 * math.exp(-k / 2000)) for k in range(99, 10000, 100)]
    return rows, curves


def test_curves_that_end_together_get_a_zoom_on_the_second_half_of_training():
    import matplotlib.pyplot as plt

    rows, curves = _long_rows()
    fig = study_figures.curves_figure(rows, curves)
    whole, zoomed = fig.axes
    assert zoomed.get_title() == "zoom, second half"
    assert zoomed.get_xlim() == (5099, 9999)  # the first evaluation of the second half, to the last
    low, high = zoomed.get_ylim()
    assert low < 1.33 and high < 1.5  # the 8 converging runs; DyT above, off the zoom's scale
    assert (high - low) < 0.2 * (whole.get_ylim()[1] - whole.get_ylim()[0])
    assert _colours(fig) >= {study_style.colour("pre"), study_style.colour("post")}
    apart, _, _ = _rows(placements=("pre", "post"), lrs=(1e-3, 3e-3), seeds=(0,))
    plain = study_figures.curves_figure(apart, _rows(placements=("pre", "post"), lrs=(1e-3, 3e-3), seeds=(0,))[1])
    assert not any("zoom" in ax.get_title() for ax in plain.axes)  # ends that read apart: no zoom
    assert study_figures.zoom(rows[:1], curves) is None
    plt.close("all")


def test_the_gradient_figure_has_first_step_50_and_last_panels_none_empty():
    """A failed run's last step (236, 276) got a panel of its own, with one line in it."""
    import matplotlib.pyplot as plt

    rows, _, profiles = _rows(placements=("pre", "post", "hybrid", "hybrid_star"), lrs=(1e-3,), seeds=(0,))
    profiles["hybrid-0.001-100-0"] = {str(k): [1.0] * 24 for k in (0, 50, 236)}
    profiles["hybrid_star-0.001-100-0"] = {str(k): [2.0] * 24 for k in (0, 50, 276)}
    fig = study_figures.grad_figure(rows, profiles)
    assert [ax.get_title() for ax in fig.axes if ax.lines] == ["step 0", "step 50",
                                                               "last step of each run (a failed run's: earlier)"]
    assert all(len(ax.lines) == 5 for ax in fig.axes)  # pre, post, hybrid, hybrid_star and the DyT row
    assert study_figures.profile_steps({"0": [1.0], "30": [1.0]}) == {"first": 0, "last": 30}
    same = study_figures.grad_figure(*_rows(placements=("pre",), lrs=(1e-3,), seeds=(0,))[::2])
    assert [ax.get_title() for ax in same.axes] == ["step 0", "step 50", "step 499"]
    plt.close("all")
