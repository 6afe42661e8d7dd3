"""The study's write-up: each claim (the seeds' and the frontier's) with its measured answer and intervals, its
figure, the published number it is compared with (and how far apart the scales are), and the command that
reproduces it -- generated from the committed results directories (``benchmarks/results/study/<dir>/
summary.json``), as a section of docs/study.md and as an HTML page beside the results.

A claim whose results directory is not committed yet says so and gives the command that makes it."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

from ..harness.store import atomic_write_text
from . import claims_table
from .docs_section import replace_section
from .html import Page
from .published import PUBLISHED, scale_gap, url
from .study_stats import bootstrap_mean, failure_call
from .study_tables import interval_text, p_text, tokens_text

START, END = "<!-- study-writeup:start -->", "<!-- study-writeup:end -->"
_PAPER = "addnorm study --preset paper --out benchmarks/results/study/paper24"
_DEFAULT = "addnorm study --preset default --out benchmarks/results/study/study"
_RESIDUAL = ("addnorm study --preset quick --placements no_residual,pre --depths 12 --lrs 1e-3 --warmups 100 "
             "--seeds 0,1,2 --steps 400 --out benchmarks/results/study/study_residual")
_NORMS = ("addnorm study --preset quick --placements pre --norms layer,rms,batch --depths 6 --lrs 1e-3 --warmups 100 "
          "--seeds 0,1,2 --steps 400 --out benchmarks/results/study/study_norms")


@dataclass(frozen=True)
class Claim:
    """A claim, where its answer is measured, and which calls reproduce it."""

    key: str
    text: str
    origin: str  # "seed" (the seeds' claims) or "frontier"
    results: str  # directory under benchmarks/results/study
    measure: str  # "loss" (difference against pre-LN), "equivalence" (the loss difference inside a margin),
    #               "failures" (counts against pre-LN), "gap" (generalization gap against pre-LN), "gain"
    select: tuple[tuple[str, object], ...]  # axis values that pick the rows (placement, norm, ...)
    figure: str | None  # file under <results>/figures
    published: tuple[str, ...]  # keys of published.PUBLISHED
    command: str
    holds: tuple[str, ...] = ()  # the calls that agree with the claim ('better', 'fails more', 'larger gap', ...)
    against: tuple[str, ...] = ()  # the calls that contradict it
    of: tuple[tuple[str, object], ...] = ()  # the rows (among select's) whose calls decide; default: all


_FAILS = ("fails more",)
_DEPTH = "addnorm study --preset depth --out benchmarks/results/study/depth"
_FRONTIER = "addnorm study --preset frontier --out benchmarks/results/study/frontier"
_LONG = "addnorm study --preset long --out benchmarks/results/study/long"
_WIDE = "addnorm study --preset wide --out benchmarks/results/study/wide"
CLAIMS = (
    Claim("post_unstable", "Pre-norm trains more stably than post-norm in a deep network.", "seed", "paper24",
          "failures", (("placement", "post"),), "warmup_lr_failures.png", ("post_diverges",), _PAPER,
          _FAILS, ("fails less",)),
    Claim("post_warmup", "Post-norm needs learning-rate warmup; pre-norm needs little or none.", "seed", "study",
          "failures", (("placement", "post"),), "warmup_lr_failures.png", (), _DEFAULT, _FAILS, ("fails less",),
          (("warmup", 0),)),
    Claim("post_tuned", "Post-norm can end slightly better than pre-norm with careful tuning.", "seed", "study",
          "loss", (("placement", "post"),), "val_loss_vs_lr.png", (), _DEFAULT, ("better",), ("worse",)),
    Claim("no_residual", "Without the residual connection a deep network does not train.", "seed", "study_residual",
          "failures", (("placement", "no_residual"),), None, (), _RESIDUAL, _FAILS, ("fails less",)),
    Claim("batchnorm", "BatchNorm in place of LayerNorm trains but generalizes poorly.", "seed", "study_norms",
          "gap", (("norm", "batch"),), None, (), _NORMS, ("larger gap",), ("smaller gap",)),
    Claim("rmsnorm", "RMSNorm trains like LayerNorm.", "seed", "study_norms", "equivalence", (("norm", "rms"),), None,
          (), _NORMS, ("equivalent",), ("not equivalent",)),
    Claim("mixln", "Mix-LN (post-norm in the first quarter of the layers) ends below pre-LN.", "frontier", "paper24",
          "loss", (("placement", "mix"),), "val_loss_vs_lr.png", ("mixln_1b",), _PAPER, ("better",), ("worse",)),
    Claim("lns", "LayerNorm Scaling ends below pre-LN.", "frontier", "frontier", "loss", (("placement", "lns"),),
          "val_loss_vs_lr.png", ("lns_beats_pre",), _FRONTIER, ("better",), ("worse",)),
    Claim("depth", "Post-LN stops training as depth grows, where pre-LN keeps training.", "frontier", "depth",
          "failures", (("placement", "post"),), "depth_placement_max_lr.png", ("post_diverges",), _DEPTH, _FAILS,
          ("fails less",)),
    Claim("depth_others", "DeepNorm, Mix-LN and LayerNorm Scaling keep training as depth grows, as pre-LN does.",
          "frontier", "depth", "failures", (("placement", ("deepnorm", "mix", "lns")),),
          "depth_placement_max_lr.png", (), _DEPTH, ("not distinguishable", "fails less"), ("fails more",)),
    Claim("mhc_gain", "mHC keeps the composite mixing gain near 1 where HC's grows with depth.", "frontier",
          "mixing", "gain", (("placement", ("hc", "mhc", "mhc_lite")),), "composite_gain.png", ("mhc_gain",),
          "addnorm study --preset mixing --out benchmarks/results/study/mixing"),
    Claim("denseformer", "DenseFormer ends below pre-LN at the same depth.", "frontier", "frontier", "loss",
          (("placement", "denseformer"),), "val_loss_vs_lr.png", ("denseformer",), _FRONTIER, ("better",),
          ("worse",)),
    # the paper trains HybridNorm at Megatron's init ("gpt2" here): its comparisons at that init decide; the
    # Xavier rows are shown beside them (at 24 layers they plateau as post-LN does), and the stability claim below
    # hears every init
    Claim("hybridnorm", "HybridNorm ends below pre-LN.", "frontier", "frontier", "loss",
          (("placement", ("hybrid", "hybrid_star")),), "val_loss_vs_lr.png", ("hybridnorm",), _FRONTIER, ("better",),
          ("worse",), (("init", "gpt2"),)),
    Claim("hybridnorm_stable", "HybridNorm trains as reliably as pre-LN in a deep network, where post-LN does not.",
          "frontier", "frontier", "failures", (("placement", ("hybrid", "hybrid_star")),), "val_loss_vs_lr.png",
          ("hybridnorm",), _FRONTIER, ("not distinguishable", "fails less"), ("fails more",)),
    Claim("ngpt", "nGPT ends below pre-LN at the same step budget (it trains faster).", "frontier", "frontier", "loss",
          (("placement", "ngpt"),), "val_loss_vs_lr.png", ("ngpt",), _FRONTIER, ("better",), ("worse",)),
    Claim("value_residual", "A value residual ends below pre-LN without one.", "frontier", "frontier", "loss",
          (("value_residual", True),), "val_loss_vs_lr.png", ("value_residual",), _FRONTIER, ("better",),
          ("worse",)),
    Claim("derf", "Derf in place of LayerNorm ends below pre-LN.", "frontier", "frontier", "loss", (("norm", "derf"),),
          "val_loss_vs_lr.png", ("derf",), _FRONTIER, ("better",), ("worse", "fails more")),
    Claim("dyt_budget", "DyT in place of LayerNorm helps at a small token budget.", "frontier", "paper24", "loss",
          (("norm", "dyt"),), "val_loss_vs_lr.png", ("dyt_budget",), _PAPER, ("better",), ("worse", "fails more")),
    # `long`: the same claims 20 times further (10,000 steps against 500, at 6 layers), trained until flat
    Claim("mixln_long", "Mix-LN ends below pre-LN at a 20 times longer token budget.", "frontier", "long", "loss",
          (("placement", "mix"),), "val_loss_curves.png", ("mixln_1b",), _LONG, ("better",), ("worse",)),
    Claim("lns_long", "LayerNorm Scaling ends below pre-LN at a 20 times longer token budget.", "frontier", "long",
          "loss", (("placement", "lns"),), "val_loss_curves.png", ("lns_beats_pre",), _LONG, ("better",), ("worse",)),
    Claim("mhc_long", "mHC (4 streams) ends below pre-LN at a 20 times longer token budget.", "frontier", "long",
          "loss", (("placement", "mhc"),), "val_loss_curves.png", (), _LONG, ("better",), ("worse", "fails more")),
    Claim("dyt_long", "DyT in place of LayerNorm ends worse at a larger token budget (the second half of the "
          "published sign flip).", "frontier", "long", "loss",
          (("norm", "dyt"),), "val_loss_curves.png", ("dyt_budget",), _LONG, ("worse", "fails more"), ("better",)),
    # `wide`: four times the width (d_model 256 against 64, 12 layers, 1000 steps)
    Claim("post_wide", "Post-LN stops training at d_model 256 (12 layers), where pre-LN trains.", "frontier", "wide",
          "failures", (("placement", "post"),), "val_loss_curves.png", ("post_diverges",), _WIDE, _FAILS,
          ("fails less",)),
    Claim("mixln_wide", "Mix-LN ends below pre-LN at four times the width.", "frontier", "wide", "loss",
          (("placement", "mix"),), "val_loss_curves.png", ("mixln_1b",), _WIDE, ("better",), ("worse",)),
    Claim("lns_wide", "LayerNorm Scaling ends below pre-LN at four times the width.", "frontier", "wide", "loss",
          (("placement", "lns"),), "val_loss_curves.png", ("lns_beats_pre",), _WIDE, ("better",), ("worse",)),
    Claim("mhc_wide", "mHC (4 streams) ends below pre-LN at four times the width.", "frontier", "wide", "loss",
          (("placement", "mhc"),), "val_loss_curves.png", (), _WIDE, ("better",), ("worse", "fails more")),
)

METHOD = ("every interval is the exact percentile bootstrap of the mean over seeds (nominal 95 %), which with 3 seeds "
          "is the min–max range of the seeds' values (it covers their median with probability 75 %, not 95 %), and "
          "a loss or gap difference is called only where that interval excludes 0 (for a difference paired over 3 "
          "seeds: every seed agrees in sign, p = 0.25 by the sign-flip test), with no multiple-comparison control, "
          "so the calls below are leads and the tested verdicts are the claims file's, above; failure counts are "
          "compared by Fisher's exact test (two-sided) and called only at p < 0.05, per setting and pooled over a "
          "placement's settings (3 of 3 failed against 0 of 3 gives p = 0.1: not called, however clear it looks; a "
          "bootstrap of 0/1 outcomes would give it a zero-width interval)")

# runs from before phi's random init (or any where mHC and mHC-lite end equal): what their gain of 1 shows
MHC_SYMMETRY = ("mHC's and mHC-lite's losses agree run for run, the sign that their n streams started as copies of "
                "the embedding and stayed identical (every stream receives the same gradient when phi starts at 0), "
                "so H_res mixes identical streams and a product of doubly (or row-) stochastic matrices has gain 1 "
                "by construction: these runs do not test the paper's claim")


# "trains like": the final validation loss within this many nats of pre-LN's (about 2.5 % of the losses the
# study's short runs end at), shown by the whole 95 % interval of the difference lying inside +-margin (a test
# of equivalence; a difference that is merely not distinguishable from 0 shows nothing)
EQUIVALENCE_MARGIN = 0.05


def equivalence_call(low, high, margin: float = EQUIVALENCE_MARGIN) -> str:
    if low is None or high is None:
        return "no loss to compare"
    if -margin <= low and high <= margin:
        return "equivalent"
    if low > margin or high < -margin:
        return "not equivalent"
    return "not shown equivalent"


def _matches(row: dict, select) -> bool:
    for axis_, want in select:
        have = row.get(axis_)
        if (have not in want) if isinstance(want, tuple) else (have != want):
            return False
    return True


def _where(row: dict, keys: list[str]) -> str:
    fmt = {"lr": "lr {:g}", "warmup": "warmup {}", "depth": "{} layers", "norm": "{}", "placement": "{}",
           "d_model": "d_model {}", "steps": "{} steps", "init": "{} init"}
    return ", ".join(fmt[k].format(row[k]) for k in keys if row.get(k) is not None)


def _keys(rows: list[dict]) -> list[str]:
    keys = [k for k in ("placement", "norm", "init", "depth", "d_model", "steps", "warmup")
            if len({r.get(k) for r in rows}) > 1]
    return keys + ["lr"]


def answer(claim: Claim, study: dict | None) -> dict:
    """{'measured': bool, 'lines': [str], 'verdict': str, 'n_params': (smallest, largest) of the runs, 'tokens',
    'calls': the calls that decide (see ``reproduced``)}: the claim's measured answer from a study's summary
    (None: not committed yet)."""
    if study is None:
        return {"measured": False, "lines": [], "verdict": "not measured yet", "n_params": None, "tokens": None,
                "calls": []}
    runs = [r for r in study["runs"] if _matches(r, claim.select)]
    if claim.measure == "gain":
        lines, verdict, calls = *_gain_lines(runs), []
    else:
        pairs = [d for d in study.get("pairwise", []) if _matches(d, claim.select)]
        lines, verdict, calls = _pair_lines(pairs, claim)
    params = [r["n_params"] for r in runs if r.get("n_params")]
    tokens = [r["tokens_seen"] for r in runs if r.get("tokens_seen")]
    return {"measured": bool(runs), "lines": lines, "verdict": verdict if runs else "no run of this setting",
            "n_params": (min(params), max(params)) if params else None, "tokens": max(tokens) if tokens else None,
            "runs": runs, "calls": calls, "partial": _partial(study)}


def _unmeasured_why(claim: Claim, a: dict) -> str:
    """Why a claim has no measured answer: its results directory is not committed, or (a preset committed before
    it finished) none of the runs it needs is among those committed yet."""
    if a.get("partial"):
        return f"none of its runs is among those committed in `{claim.results}/` yet -- {a['partial']}"
    return f"no `{claim.results}/` results committed"


def _partial(study: dict) -> str:
    """'' for a finished study; else what it holds -- 'partial: 96 of 170 runs recorded' -- for a results
    directory committed before every run of its preset finished (the claims read the runs it holds)."""
    missing = len(study.get("missing") or [])
    if not missing:
        return ""
    return f"partial: {len(study['runs'])} of {len(study['runs']) + missing} runs recorded"


def _pooled(pairs: list[dict]) -> list[tuple[str, int, int, int, int, float, str]]:
    """Per placement (and norm): the failures of its settings and of pre-LN's at the same settings, summed, and
    Fisher's exact test of the sums: (label, failed, runs, pre failed, pre runs, p, call)."""
    out = []
    for label in dict.fromkeys(_label(d) for d in pairs):
        mine = [d for d in pairs if _label(d) == label]
        k, n = sum(d["failures"] for d in mine), sum(d["seeds"] for d in mine)
        kb, nb = sum(d["pre_failures"] for d in mine), sum(d["pre_seeds"] for d in mine)
        out.append((label, k, n, kb, nb, *failure_call(k, n, kb, nb)))
    return out


def _label(d: dict) -> str:
    """What a pooled failure count is over: a placement (and its norm, and its init where that is not the study's
    Xavier default -- an init can decide whether a form trains at all, so inits are never pooled together)."""
    label = d["placement"] if d.get("norm", "layer") == "layer" else f"{d['placement']} {d['norm']}"
    return label if d.get("init", "xavier") == "xavier" else f"{label} ({d['init']} init)"


def _pair_lines(pairs: list[dict], claim: Claim) -> tuple[list[str], str, list[str]]:
    keys = _keys(pairs)
    lines, calls = [], []
    for d in pairs:
        if claim.measure == "failures":
            call = d["fail_call"]
            value = (f"failed {d['failures']}/{d['seeds']} vs pre-LN {d['pre_failures']}/{d['pre_seeds']} "
                     f"(Fisher's exact test, {p_text(d['fail_p'])})")
        elif claim.measure == "gap":
            call = d.get("gap_call", "no gap to compare")
            value = ("generalization gap (validation minus training-split loss) minus pre-LN's "
                     f"{interval_text(d.get('gap_diff_mean'), d.get('gap_diff_low'), d.get('gap_diff_high'), '{:+.3f}')}"
                     "; final validation loss minus pre-LN's "
                     f"{interval_text(d['diff_mean'], d['diff_low'], d['diff_high'], '{:+.3f}')} ({d['call']})")
        elif claim.measure == "equivalence":
            call = equivalence_call(d["diff_low"], d["diff_high"])
            value = ("final validation loss minus pre-LN's "
                     f"{interval_text(d['diff_mean'], d['diff_low'], d['diff_high'], '{:+.3f}')}, against a margin of "
                     f"±{EQUIVALENCE_MARGIN:g} nats")
        else:
            call = d["call"]
            value = ("final validation loss minus pre-LN's "
                     f"{interval_text(d['diff_mean'], d['diff_low'], d['diff_high'], '{:+.3f}')}"
                     f" (failed {d['failures']}/{d['seeds']} vs {d['pre_failures']}/{d['pre_seeds']})")
        calls.append(call)
        lines.append(f"{_where(d, keys)}: {value} — {call}")
    counts = {c: calls.count(c) for c in dict.fromkeys(calls)}
    verdict = ", ".join(f"{c} at {n} of {len(calls)}" for c, n in counts.items()) or "no comparison with pre-LN"
    deciding = [d for d in pairs if _matches(d, claim.of)]
    decide = [c for d, c in zip(pairs, calls) if _matches(d, claim.of)]
    if claim.measure in ("failures", "loss", "equivalence"):
        for label, k, n, kb, nb, p, call in _pooled(pairs):
            settings = sum(_label(d) == label for d in pairs)
            if settings > 1:
                lines.append(f"pooled over {label}'s {settings} settings: failed {k}/{n} vs pre-LN {kb}/{nb} (Fisher's "
                             f"exact test, {p_text(p)}) — {call}")
        pooled = [c for *_, c in _pooled(deciding)]
        # failures: the pooled test decides; a loss claim also hears it where it names failing more ('against')
        decide = pooled if claim.measure == "failures" else decide + [c for c in pooled if c in claim.against]
        if claim.measure in ("loss", "equivalence") and "fails more" in pooled and "fails more" not in claim.against:
            decide.append("also fails more")  # neither agrees nor contradicts; said beside the verdict
    return lines, verdict, decide


def _gain(r: dict, key: str) -> float:
    """A run's composite gain (``key``: 'fwd' or 'bwd'): its peak over training where recorded (HC's rises and falls
    again), else its last evaluation's."""
    peak = r.get(f"peak_composite_gain_{key}")
    return r[f"max_composite_gain_{key}"] if peak is None else peak


def _gain_lines(runs: list[dict]) -> tuple[list[str], str]:
    lines = []
    for placement in dict.fromkeys(r["placement"] for r in runs):
        for depth in sorted({r["depth"] for r in runs if r["placement"] == placement}):
            mine = [r for r in runs if r["placement"] == placement and r["depth"] == depth
                    and r.get("max_composite_gain_fwd") is not None]
            if not mine:
                continue
            fwd = bootstrap_mean([_gain(r, "fwd") for r in mine])
            bwd = bootstrap_mean([_gain(r, "bwd") for r in mine])
            what = ("peak composite gain over training" if all(r.get("peak_composite_gain_fwd") is not None
                                                                for r in mine) else "largest composite gain")
            lines.append(f"{placement}, {depth} layers: {what} forward "
                         f"{interval_text(fwd.mean, fwd.low, fwd.high, '{:.3g}')}, backward "
                         f"{interval_text(bwd.mean, bwd.low, bwd.high, '{:.3g}')} ({len(mine)} runs)")
    return lines, "measured per run (mean over seeds, 95 % interval)" if lines else "no run recorded the gain"


NOT_MEASURED, REPRODUCED, NOT_REPRODUCED = "not measured at this scale", "reproduced", "not reproduced"


def reproduced(claim: Claim, a: dict) -> list[tuple[str, str, str]]:
    """[(subject, NOT_MEASURED / REPRODUCED / NOT_REPRODUCED, why)]: whether the measured answer agrees with the
    claim (and the published result compared with it) at the study's scale; subject '' for the whole claim."""
    if not a["measured"]:
        return [("", NOT_MEASURED, _unmeasured_why(claim, a))]
    if claim.measure == "gain":
        return _gain_reproduced(a["runs"])
    extra = "; it also fails more often than pre-LN, pooled over its settings" if "also fails more" in a["calls"] else ""
    calls = [c for c in a["calls"] if c != "also fails more"]
    agree = sum(c in claim.holds for c in calls)
    contra = sum(c in claim.against for c in calls)
    said = f"{agree} of {len(calls)} deciding comparisons agree with it, {contra} contradict it{extra}"
    if agree and not contra:
        return [("", REPRODUCED, said)]
    if contra:
        return [("", NOT_REPRODUCED, said + ("; mixed" if agree else ""))]
    return [("", NOT_REPRODUCED, f"no comparison reaches a call; {said}")]


def _gain_reproduced(runs: list[dict]) -> list[tuple[str, str, str]]:
    hc = {}
    for r in runs:
        if r["placement"] == "hc" and r.get("max_composite_gain_fwd") is not None:
            hc.setdefault(r["depth"], []).append(_gain(r, "fwd"))
    means = [sum(v) / len(v) for _, v in sorted(hc.items())]
    grows = len(means) > 1 and all(b > a for a, b in zip(means, means[1:])) and means[0] > 1
    hc_line = ("HC", REPRODUCED if grows else NOT_REPRODUCED,
               f"its peak forward gain over training grows with depth ({' → '.join(f'{m:.3g}' for m in means)} at "
               f"{', '.join(str(d) for d in sorted(hc))} layers), in the paper's direction, far below its 3000 at 27B"
               if grows else "its peak forward gain over training does not grow with depth here")
    if _streams_stayed_copies(runs):
        return [hc_line, ("mHC", NOT_MEASURED, f"the gain of 1 measured for mHC and mHC-lite is no test: {MHC_SYMMETRY}")]
    constrained = [_gain(r, "bwd") for r in runs if r["placement"] in ("mhc", "mhc_lite")
                   and r.get("max_composite_gain_bwd") is not None]
    if not constrained:
        return [hc_line, ("mHC", NOT_MEASURED, "no mHC or mHC-lite run recorded the gain")]
    top = max(constrained)
    ok = top <= 1.05 and grows
    return [hc_line, ("mHC", REPRODUCED if ok else NOT_REPRODUCED,
                      f"mHC's and mHC-lite's backward (column) gain is at most {top:.3g} at every depth while "
                      "their streams differ (their losses are not equal run by run) and HC's grows; their forward "
                      "gain is 1 by construction (Sinkhorn ends on the rows), so the backward gain is the one the "
                      "paper's 1.6 (finite Sinkhorn rounds at 27B) measures: a product of doubly stochastic matrices "
                      "exceeds 1 only by Sinkhorn's column tolerance, which this checks in training")]


def _streams_stayed_copies(runs: list[dict]) -> bool:
    """Whether mHC and mHC-lite ended at the same loss, run for run (depth, seed): the sign that their streams
    stayed copies of one stream (their H_res then acts on identical rows, and the two forms compute the same)."""
    by = {}
    for r in runs:
        if r["placement"] in ("mhc", "mhc_lite") and r.get("final_val_loss") is not None:
            by.setdefault((r["depth"], r["seed"]), {})[r["placement"]] = r["final_val_loss"]
    pairs = [v for v in by.values() if len(v) == 2]
    return bool(pairs) and sum(abs(v["mhc"] - v["mhc_lite"]) < 1e-5 for v in pairs) > len(pairs) // 2


def _status_lines(claim: Claim, a: dict) -> list[tuple[str, str, str]]:
    """[(label, status, why)] as the write-up prints them: 'Published result (HC)', 'Claim'."""
    head = "Published result" if claim.published else "Claim"
    return [(f"{head} ({subject})" if subject else head, status, why) for subject, status, why in reproduced(claim, a)]


def load(results_root: Path) -> dict[str, dict | None]:
    """{results directory: its summary.json (None where it is not committed)} for every claim's directory."""
    out = {}
    for c in CLAIMS:
        path = Path(results_root) / c.results / "summary.json"
        out[c.results] = _with_peaks(json.loads(path.read_text())) if path.exists() else None
    return out


def _with_peaks(study: dict) -> dict:
    """The study with each widened run's peak composite gains over training, from its ``mixing`` series, where its
    row does not record them (rows written before the peaks were kept)."""
    series = {m.get("name") or (m["placement"], m["depth"], m["seed"], m["lr"]): m["series"]
              for m in study.get("mixing", []) if m.get("series")}
    for r in study.get("runs", []):
        got = series.get(r.get("name")) or series.get((r.get("placement"), r.get("depth"), r.get("seed"), r.get("lr")))
        if got and r.get("peak_composite_gain_fwd") is None:
            r["peak_composite_gain_fwd"] = max(t[1] for t in got)
            r["peak_composite_gain_bwd"] = max(t[2] for t in got)
    return study


def _scale(a: dict) -> str:
    """'0.33M–1.6M parameters, 410k tokens, 0.26–1.2 tokens per parameter': the range across the claim's runs."""
    if not a["n_params"]:
        return ""
    lo, hi = a["n_params"]

    def span(a_: str, b_: str) -> str:  # one number where the range rounds to one (QKV norms add a few weights)
        return a_ if a_ == b_ else f"{a_}–{b_}"

    params = span(f"{lo / 1e6:.2g}M", f"{hi / 1e6:.2g}M")
    out = f"{params} parameters"
    if a["tokens"]:
        per = span(f"{a['tokens'] / hi:.2g}", f"{a['tokens'] / lo:.2g}")
        out += f", {tokens_text(a['tokens'])} tokens, {per} tokens per parameter"
    return out


def _refs_md(p) -> str:
    return "; ".join(f"{c}, [arXiv {a}]({url(a)})" for c, a in p.refs)


def _refs_html(p) -> str:
    return "; ".join(f"{html.escape(c)}, <a href='{url(a)}'>arXiv {a}</a>" for c, a in p.refs)


def markdown(results_root: Path, link_root: str = "../benchmarks/results/study") -> str:
    """The docs/study.md section (between START and END); figures linked under ``link_root``."""
    studies = load(results_root)
    out = [START, "", "## The claims, measured", "",
           "Generated from the committed results in `benchmarks/results/study/` by "
           f"`python benchmarks/study_writeup.py`; {METHOD}. Each claim ends with whether it is reproduced at this "
           "scale, not reproduced, or not measured at this scale (see the summaries for every setting).", ""]
    for origin, title in (("seed", "The seeds' claims"), ("frontier", "The frontier's claims")):
        out += [f"### {title}", ""]
        for c in (c for c in CLAIMS if c.origin == origin):
            a = answer(c, studies[c.results])
            out += [f"**{c.text}**", ""]
            if not a["measured"]:
                out += [f"- Measured: {a['verdict']} ({_unmeasured_why(c, a)}). To measure it: `{c.command}`."]
            else:
                out += [f"- Measured in `{c.results}/` ({'; '.join(filter(None, (_scale(a), a['partial'])))}): "
                        f"{a['verdict']}."]
                out += [f"  - {line}" for line in a["lines"]]
                fig = Path(results_root) / c.results / "figures" / (c.figure or "")
                if c.figure and fig.exists():
                    out += [f"- Figure: [{c.figure}]({link_root}/{c.results}/figures/{c.figure})"]
                out += [f"- Reproduce: `{c.command}` (add `--report-only` to redraw from the results, training "
                        "nothing)."]
            for key in c.published:
                p = PUBLISHED[key]
                out += [f"- Published: {p.result} — {_refs_md(p)}. {scale_gap(p, a['n_params'], a['tokens'])}."]
            out += [f"- {label}: **{status}** — {why}." for label, status, why in _status_lines(c, a)]
            out.append("")
    out.append(END)
    return "\n".join(out) + "\n"


def update_docs(docs: Path, results_root: Path) -> bool:
    """Replace the section between START and END of ``docs`` (or append it); True when the file changed."""
    return replace_section(Path(docs), START, END, markdown(results_root))


def page(results_root: Path) -> Page:
    """The write-up as an HTML page for ``results_root/index.html`` (figures linked relative to it)."""
    studies = load(results_root)
    p = Page()
    p.add("<h1>addnorm study: the claims, measured</h1><p class='lead'>Each claim with its measured answer, its "
          "figure, the published number it is compared with, whether it is reproduced at this scale, and the command "
          f"that reproduces it: {html.escape(METHOD)}.</p>")
    claims = Path(results_root) / "claims.json"
    if claims.exists():  # the tested verdicts, from the claims file (benchmarks/study_claims.py)
        p.add(claims_table.html_table(claims_table.load(claims)))
    for i, c in enumerate(CLAIMS):
        a = answer(c, studies[c.results])
        p.add(f"<h2>{html.escape(c.text)}</h2>")
        if not a["measured"]:
            p.add(f"<p class='note'>Not measured yet ({html.escape(_unmeasured_why(c, a))}): "
                  f"<code>{html.escape(c.command)}</code></p>")
        else:
            items = "".join(f"<li>{html.escape(line)}</li>" for line in a["lines"])
            scale = "; ".join(filter(None, (_scale(a), a["partial"])))
            p.add(f"<p>Measured in <a href='{c.results}/index.html'>{c.results}/</a> ({html.escape(scale)}): "
                  f"{p.num(f'claim{i}.verdict', a['verdict'])}.</p><ul>{items}</ul>")
            if c.figure and (Path(results_root) / c.results / "figures" / c.figure).exists():
                p.add(f"<img src='{c.results}/figures/{c.figure}' alt='{html.escape(c.figure)}'>")
            p.add(f"<p>Reproduce: <code>{html.escape(c.command)}</code></p>")
        for key in c.published:
            pub = PUBLISHED[key]
            p.add(f"<p class='note'>Published: {html.escape(pub.result)} — {_refs_html(pub)}. "
                  f"{html.escape(scale_gap(pub, a['n_params'], a['tokens']))}.</p>")
        for j, (label, status, why) in enumerate(_status_lines(c, a)):
            p.add(f"<p>{html.escape(label)}: <strong>{p.num(f'claim{i}.reproduced{j}', status)}</strong> — "
                  f"{html.escape(why.replace('`', ''))}.</p>")
    return p


def write_page(results_root: Path) -> Path:
    path = Path(results_root) / "index.html"
    atomic_write_text(path, page(results_root).render("addnorm study: the claims, measured"))
    return path
