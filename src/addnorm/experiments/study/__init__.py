"""``addnorm study``: train real models over a grid of placements, norms, depths, learning rates, warmups,
seeds, clipping and inits, and measure what the seeds claim. ``config`` (a run, presets, the grid), ``data``
(the corpus split by file), ``runner`` (one run: resumable, metrics, failure detection), ``grid`` (every run
of a grid, reused or resumed; the study's tables and figures)."""

from .config import PRESETS, RunConfig, Study, StudyGrid
from .grid import run_study
from .runner import train_run

__all__ = ["PRESETS", "RunConfig", "Study", "StudyGrid", "run_study", "train_run"]
