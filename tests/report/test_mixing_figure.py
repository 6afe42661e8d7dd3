"""The mixing-gain figure from a study's finished runs: HC, mHC and mHC-lite against depth and over training, like
for like with the mHC paper: the peak over training, the backward gain beside its 1.6, HC beside its 3000, why the
forward gain is 1, depth on a log axis, mHC-lite visible over mHC."""

import pytest

from addnorm.experiments.study import RunConfig, train_run
from addnorm.experiments.study.data import load_split
from addnorm.report.mixing_figure import COLOURS, FORWARD_IS_ONE, STYLES, draw, mixing_data, mixing_figure


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    data = load_split(max_bytes=1 << 20)
    out = tmp_path_factory.mktemp("mixing")
    runs = [RunConfig(placement=p, depth=d, d_model=32, heads=2, seq_len=32, batch=4, steps=12, eval_every=4,
                      eval_batches=1, checkpoint_every=12, n_streams=3)
            for p in ("hc", "mhc", "mhc_lite") for d in (1, 2)]
    return [train_run(c, data, out / c.name()) for c in runs] + [train_run(
        RunConfig(depth=1, d_model=32, heads=2, seq_len=32, batch=4, steps=4, eval_every=4, eval_batches=1),
        data, out / "pre")]


def test_the_data_holds_every_widened_run_with_its_series_and_peaks(summaries):
    rows = mixing_data(summaries)
    assert len(rows) == 6 and {r["placement"] for r in rows} == {"hc", "mhc", "mhc_lite"}  # pre left out
    for r in rows:
        assert [t[0] for t in r["series"]] == [4, 8, 12]
        assert r["series"][-1][1:] == (r["final_fwd"], r["final_bwd"])
        assert (r["peak_fwd"], r["peak_bwd"]) == (max(t[1] for t in r["series"]), max(t[2] for t in r["series"]))
    lite = [r for r in rows if r["placement"] == "mhc_lite"]
    assert all(abs(r["final_fwd"] - 1) < 1e-5 and abs(r["final_bwd"] - 1) < 1e-5 for r in lite)  # exact
    for s in summaries[:6]:  # the run's own summary keeps the peaks over training
        assert s["peak_composite_gain_fwd"] == max(c[1] for c in s["gain_curve"])
        assert s["peak_composite_gain_bwd"] == max(c[2] for c in s["gain_curve"])


def _lines(ax):
    return [line for line in ax.get_lines() if len(line.get_xdata()) > 1 and line.get_color() in COLOURS.values()
            and line.get_linestyle() not in ("None", "")]  # the lines, not the seeds' points


def test_the_figure_compares_like_for_like_with_the_paper(summaries, tmp_path):
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    rows = mixing_data(summaries)
    path = mixing_figure(rows, tmp_path / "mixing.png")
    h, w = mpimg.imread(path).shape[:2]
    assert w <= 1000 and h <= 760  # two panels a row
    fig = draw(rows)
    top_fwd, top_bwd, over_fwd, over_bwd = fig.axes[:4]
    for ax in (top_fwd, top_bwd):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        for line in _lines(ax):  # the peak over training, mean over seeds, per depth
            p = next(p for p, c in COLOURS.items() if c == line.get_color())
            for d, y in zip(line.get_xdata(), line.get_ydata()):
                peaks = [r["peak_" + ("fwd" if ax is top_fwd else "bwd")] for r in rows
                         if r["placement"] == p and r["depth"] == d]
                assert y == pytest.approx(sum(peaks) / len(peaks))
    for ax in fig.axes[:4]:  # one colour per placement in every panel; mHC-lite drawn apart from mHC
        assert {line.get_color() for line in _lines(ax)} == set(COLOURS.values())
        style = {next(p for p, c in COLOURS.items() if c == line.get_color()): line.get_linestyle()
                 for line in _lines(ax)}
        assert style["mhc"] != style["mhc_lite"]
        texts = " ".join(t.get_text() for t in ax.texts)
        assert "3000" in texts and ax.get_ylim()[1] > 3000
        assert ("1.6" in texts) == (ax in (top_bwd, over_bwd))  # the paper's mHC figure is the backward gain
        assert (FORWARD_IS_ONE in texts) == (ax in (top_fwd, over_fwd))
    assert STYLES["mhc"]["marker"] != STYLES["mhc_lite"]["marker"]
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["hc", "mhc", "mhc_lite"]
    old = [{k: v for k, v in r.items() if not k.startswith("peak")} for r in rows]  # recorded before the peaks
    assert [line.get_ydata().tolist() for line in _lines(draw(old).axes[0])] == \
        [line.get_ydata().tolist() for line in _lines(top_fwd)]
    plt.close("all")
    assert mixing_figure([], tmp_path / "none.png") is None
