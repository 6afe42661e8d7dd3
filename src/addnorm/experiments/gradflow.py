"""Gradient flow and activation statistics through deep stacks, per placement, measured.

For each placement a GPT of ``depth`` blocks (byte-level vocabulary, small width so that 48-200
layers run on a laptop CPU) is built with the same seed and fed the same real batch from the
corpus; one forward/backward at initialisation is recorded with ``addnorm.diagnostics`` (and,
with ``steps > 0``, the first training steps with AdamW). Results are files in a directory, one
JSON per placement named by a hash of everything that determines it, so a re-run with the same
arguments reuses them and an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.markup import escape

from .. import diagnostics
from ..diagnostics import plots
from ..model import GPT, GPTConfig
from ..harness.corpus import load_corpus
from ..harness.store import atomic_write_text, digest, read_json
from ..model.placement import NAMES, PLACEMENTS

DEFAULT_PLACEMENTS = ("no_residual", "none", "post", "pre", "sandwich", "deepnorm", "rezero")
NORM_KINDS = ("layer", "rms", "dyt", "derf")


class ConfigError(ValueError):
    """An invalid configuration value; ``field`` names it (the command line maps it to its option)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class GradflowConfig:
    placements: tuple[str, ...] = DEFAULT_PLACEMENTS
    depth: int = 48  # blocks in the stack
    d_model: int = 256  # wide enough that a branch's output is not negligible next to eps at GPT-2's init
    n_head: int = 4
    seq_len: int = 64
    batch: int = 8
    norm: str = "layer"
    steps: int = 0  # training steps recorded after initialisation (AdamW)
    lr: float = 3e-4
    seed: int = 0
    data: str | None = None  # None: the standard library's sources
    n_streams: int | None = None  # widened placements (hc, mhc, mhc_lite): the stream's width (None: 4)
    value_residual: bool = False  # ResFormer's value residual in every placement

    def __post_init__(self):
        if not self.placements:
            raise ConfigError("placements", "must name at least one placement")
        bad = [p for p in self.placements if p not in NAMES]
        if bad:
            raise ConfigError("placements", f"unknown placement(s) {bad}; valid: {', '.join(NAMES)}")
        for name in ("depth", "d_model", "n_head", "seq_len", "batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, f"must be an integer >= 1, got {v!r}")
        if self.seq_len > GPTConfig.block_size:  # past it the run sat at 0/1 on a (T x T) attention per head
            raise ConfigError("seq_len", f"must be at most the model's context, {GPTConfig.block_size} positions "
                                         f"(GPTConfig.block_size, GPT-2's), got {self.seq_len}")
        if self.d_model % self.n_head:
            raise ConfigError("d_model", f"{self.d_model} must be divisible by the number of heads ({self.n_head})")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ConfigError("steps", f"must be an integer >= 0, got {self.steps!r}")
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError("lr", f"must be a finite number > 0, got {self.lr!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("seed", f"must be an integer >= 0, got {self.seed!r}")
        if self.norm not in NORM_KINDS:
            raise ConfigError("norm", f"must be one of {NORM_KINDS}, got {self.norm!r}")
        if self.n_streams is not None and (isinstance(self.n_streams, bool) or not isinstance(self.n_streams, int)
                                           or self.n_streams < 1):
            raise ConfigError("n_streams", f"must be an integer >= 1, got {self.n_streams!r}")

    def run_key(self, placement: str, data_digest: str) -> str:
        """Everything that changes a run's result: the configuration (not the data's path) and the data's
        content hash."""
        d = asdict(self)
        d["placements"] = placement
        d["data"] = data_digest
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class PlacementResult:
    placement: str
    records: list[dict] = field(repr=False)
    losses: list[float]
    seconds: float

    def profile(self, quantity: str, step: int = 0, sites: tuple[str, ...] = ("attn", "block")) -> list[float]:
        """Per block; by default the first sub-layer site (the stream entering the block)."""
        return diagnostics.depth_profile(self.records, quantity, sites, step)

    def norm_outputs(self, step: int = 0) -> tuple[list[float], list[float]]:
        rows = [r for r in self.records if r["step"] == step and r["quantity"] in ("norm_out_mean", "norm_out_std")]
        means = [r["value"] for r in rows if r["quantity"] == "norm_out_mean"]
        stds = [r["value"] for r in rows if r["quantity"] == "norm_out_std"]
        return means, stds


def model_config(cfg: GradflowConfig, placement: str, vocab_size: int) -> GPTConfig:
    """The GPT of one placement: nGPT takes no norm kind, only widened placements take n_streams."""
    widened = PLACEMENTS[placement].widened if placement in PLACEMENTS else False
    ngpt = placement in PLACEMENTS and PLACEMENTS[placement].residual == "normalized"
    return GPTConfig(vocab_size=vocab_size, block_size=cfg.seq_len, n_layer=cfg.depth, n_head=cfg.n_head,
                     n_embd=cfg.d_model, placement=placement, norm=None if ngpt else cfg.norm,
                     n_streams=cfg.n_streams if widened else None, value_residual=cfg.value_residual)


def run_placement(cfg: GradflowConfig, placement: str, corpus) -> PlacementResult:
    import time

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model = GPT(model_config(cfg, placement, corpus.vocab_size))
    g = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr) if cfg.steps else None
    losses = []
    with diagnostics.record(model) as rec:
        for step in range(cfg.steps + 1):
            x, y = corpus.batch(cfg.batch, cfg.seq_len, g) if step > 0 else corpus.batch(cfg.batch, cfg.seq_len,
                                                                                         torch.Generator().manual_seed(cfg.seed))
            model.zero_grad(set_to_none=True)
            _, loss = model(x, y)
            loss.backward()
            losses.append(loss.item())
            if step < cfg.steps:
                rec.next_step()
                opt.step()
                model.normalize_()  # nGPT: weights back on the sphere (nothing for other placements)
    return PlacementResult(placement, rec.records, losses, time.perf_counter() - t0)


def summarize(result: PlacementResult) -> dict:
    g = result.profile("grad_norm")
    pg = result.profile("param_grad_norm", sites=("block",))  # the whole block's parameters
    rms = result.profile("stream_rms")
    finite = [v for v in g if math.isfinite(v) and v > 0]
    return {
        "placement": result.placement,
        "grad_first": g[0] if g else float("nan"),
        "grad_last": g[-1] if g else float("nan"),
        "grad_first_over_last": (g[0] / g[-1]) if g and g[-1] else float("nan"),
        "grad_max_over_min": (max(finite) / min(finite)) if finite else float("nan"),
        # inside the stack (block 1 on): block 0's input is the embedding, whose scale (~0.03) makes a
        # post-norm first block look special for reasons that have nothing to do with depth
        "grad_second_over_last": (g[1] / g[-1]) if len(g) > 1 and g[-1] else float("nan"),
        "param_grad_last_over_second": (pg[-1] / pg[1]) if len(pg) > 1 and pg[1] else float("nan"),
        "param_grad_first": pg[0] if pg else float("nan"),
        "param_grad_last": pg[-1] if pg else float("nan"),
        "param_grad_last_over_first": (pg[-1] / pg[0]) if pg and pg[0] else float("nan"),
        "stream_rms_first": rms[0] if rms else float("nan"),
        "stream_rms_last": rms[-1] if rms else float("nan"),
        "loss_init": result.losses[0],
        "loss_final": result.losses[-1],
        "seconds": result.seconds,
    }


def run_gradflow(cfg: GradflowConfig, out_dir: Path, progress=None) -> dict:
    """Run (or reuse) every placement, then write figures and the table. Returns the summary."""
    out_dir = Path(out_dir)
    runs = out_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus(cfg.data)
    data_digest = digest(corpus.data.numpy().tobytes())
    task = progress.add_task("gradflow", total=len(cfg.placements)) if progress else None
    results: dict[str, PlacementResult] = {}
    reused, redone, files = [], [], {}
    for p in cfg.placements:
        f = runs / f"{p}-{cfg.run_key(p, data_digest)}.json"
        files[p] = f.name
        if progress:
            progress.update(task, description=f"{p} (depth {cfg.depth})")
        d, why = read_json(f)
        if d is not None and not all(k in d for k in ("records", "losses", "seconds")):
            d, why = None, f"{f}: incomplete (no records, losses or seconds); redoing it"
        if d is not None:
            results[p] = PlacementResult(p, d["records"], d["losses"], d["seconds"])
            reused.append(p)
        else:
            if why:
                redone.append(why)
                if progress:
                    progress.console.print(f"[yellow]{escape(why)}[/yellow]")
            r = run_placement(cfg, p, corpus)
            atomic_write_text(f, json.dumps({"config": asdict(cfg), "data_digest": data_digest, "placement": p,
                                             "records": r.records, "losses": r.losses, "seconds": r.seconds}))
            results[p] = r
        if progress:
            progress.advance(task)
    summary = {"config": asdict(cfg), "corpus": corpus.source, "data_digest": data_digest, "reused": reused,
               "redone": redone, "run_files": files,
               "placements": [summarize(results[p]) for p in cfg.placements]}
    figures = write_figures(cfg, results, out_dir)
    summary["figures"] = [f.name for f in figures]
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=1))
    atomic_write_text(out_dir / "summary.md", summary_markdown(summary))
    return summary


def write_figures(cfg: GradflowConfig, results: dict[str, PlacementResult], out_dir: Path) -> list[Path]:
    depth = f"{cfg.depth} blocks, d={cfg.d_model}, at initialisation"
    figs = [
        plots.depth_profiles({p: r.profile("grad_norm") for p, r in results.items()}, out_dir / "grad_norm_vs_depth.png",
                             title=f"‖∂loss/∂stream‖ entering each block ({depth})", ylabel="gradient norm"),
        plots.depth_profiles({p: r.profile("stream_rms") for p, r in results.items()}, out_dir / "stream_rms_vs_depth.png",
                             title=f"residual-stream RMS entering each block ({depth})", ylabel="RMS"),
    ]
    means, stds = {}, {}
    for p, r in results.items():
        m, s = r.norm_outputs()
        if m:
            means[p], stds[p] = m, s
    if means:
        figs.append(plots.norm_output_stats(means, stds, out_dir / "norm_output_stats.png", title=depth))
    if cfg.steps:
        for p, r in results.items():
            figs.append(plots.over_steps({s: r.profile("grad_norm", s) for s in range(cfg.steps + 1)},
                                         out_dir / f"grad_norm_over_steps_{p}.png",
                                         title=f"{p}: gradient norm vs depth over the first {cfg.steps} steps",
                                         ylabel="gradient norm"))
            figs.append(plots.over_steps({s: r.profile("stream_rms", s) for s in range(cfg.steps + 1)},
                                         out_dir / f"stream_rms_over_steps_{p}.png",
                                         title=f"{p}: residual-stream RMS vs depth over the first {cfg.steps} steps",
                                         ylabel="RMS"))
    # an earlier run's figures of this command that this run did not draw (other placements, or steps then and
    # none now) would stand beside the new summary as if they were its own; other files are left alone
    drawn = {Path(f).name for f in figs}
    for pattern in ("grad_norm_vs_depth.png", "stream_rms_vs_depth.png", "norm_output_stats.png",
                    "grad_norm_over_steps_*.png", "stream_rms_over_steps_*.png"):
        for stale in out_dir.glob(pattern):
            if stale.name not in drawn:
                stale.unlink(missing_ok=True)
    return figs


def summary_markdown(summary: dict) -> str:
    c = summary["config"]
    lines = [f"Gradient flow at initialisation: depth {c['depth']}, d_model {c['d_model']}, {c['norm']} norm, "
             f"batch {c['batch']}x{c['seq_len']} bytes of {summary['corpus']}, seed {c['seed']}.", "",
             "| placement | ‖g‖ first block | ‖g‖ last block | first ÷ last | block 1 ÷ last | max ÷ min "
             "| ‖∇W‖ last ÷ block 1 | stream RMS first → last | loss |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in summary["placements"]:
        lines.append(f"| {r['placement']} | {r['grad_first']:.3g} | {r['grad_last']:.3g} | {r['grad_first_over_last']:.3g} "
                     f"| {r['grad_second_over_last']:.3g} | {r['grad_max_over_min']:.3g} | {r['param_grad_last_over_second']:.3g} "
                     f"| {r['stream_rms_first']:.3g} → {r['stream_rms_last']:.3g} "
                     f"| {r['loss_init']:.3f} → {r['loss_final']:.3f} |")
    return "\n".join(lines) + "\n"
