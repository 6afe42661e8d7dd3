"""The mixing-gain figure from a study's finished runs: HC, mHC and mHC-lite against depth and over training."""

import pytest

from addnorm.experiments.study import RunConfig, train_run
from addnorm.experiments.study.data import load_split
from addnorm.report.mixing_figure import COLOURS, draw, mixing_data, mixing_figure


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


def test_the_data_holds_every_widened_run_with_its_series(summaries):
    rows = mixing_data(summaries)
    assert len(rows) == 6 and {r["placement"] for r in rows} == {"hc", "mhc", "mhc_lite"}  # pre left out
    for r in rows:
        assert [t[0] for t in r["series"]] == [4, 8, 12]
        assert r["series"][-1][1:] == (r["final_fwd"], r["final_bwd"])
    lite = [r for r in rows if r["placement"] == "mhc_lite"]
    assert all(abs(r["final_fwd"] - 1) < 1e-5 and abs(r["final_bwd"] - 1) < 1e-5 for r in lite)  # exact


def test_the_figure_reads_at_page_width_with_one_colour_per_placement(summaries, tmp_path):
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt

    path = mixing_figure(mixing_data(summaries), tmp_path / "mixing.png")
    h, w = mpimg.imread(path).shape[:2]
    assert w <= 1000 and h <= 720  # two panels a row
    fig = draw(mixing_data(summaries))
    assert len(fig.axes) == 4
    for ax in fig.axes:  # one colour per placement in every panel (the dotted line at 1 aside)
        drawn = {line.get_color() for line in ax.get_lines() if line.get_linestyle() != ":"}
        assert drawn == set(COLOURS.values())
        assert sorted(ax.get_legend_handles_labels()[1]) == ["hc", "mhc", "mhc_lite"]
    plt.close(fig)
    assert mixing_figure([], tmp_path / "none.png") is None
