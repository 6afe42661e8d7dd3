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

from ..store import atomic_write_text
from .html import Page
from .published import PUBLISHED, scale_gap
from .study_stats import bootstrap_mean
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
    """A claim and where its answer is measured."""

    key: str
    text: str
    origin: str  # "seed" (the seeds' claims) or "frontier"
    results: str  # directory under benchmarks/results/study
    measure: str  # "loss" (difference against pre-LN), "failures" (share failed against pre-LN), "gain"
    select: tuple[tuple[str, object], ...]  # axis values that pick the rows (placement, norm, ...)
    figure: str | None  # file under <results>/figures
    published: tuple[str, ...]  # keys of published.PUBLISHED
    command: str


CLAIMS = (
    Claim("post_unstable", "Pre-norm trains more stably than post-norm in a deep network.", "seed", "paper24",
          "failures", (("placement", "post"),), "warmup_lr_failures.png", ("post_diverges",), _PAPER),
    Claim("post_warmup", "Post-norm needs learning-rate warmup; pre-norm needs little or none.", "seed", "study",
          "failures", (("placement", "post"),), "warmup_lr_failures.png", (), _DEFAULT),
    Claim("post_tuned", "Post-norm can end slightly better than pre-norm with careful tuning.", "seed", "study",
          "loss", (("placement", "post"),), "val_loss_vs_lr.png", (), _DEFAULT),
    Claim("no_residual", "Without the residual connection a deep network does not train.", "seed", "study_residual",
          "failures", (("placement", "no_residual"),), None, (), _RESIDUAL),
    Claim("batchnorm", "BatchNorm in place of LayerNorm trains but generalizes poorly.", "seed", "study_norms",
          "loss", (("norm", "batch"),), None, (), _NORMS),
    Claim("rmsnorm", "RMSNorm trains like LayerNorm.", "seed", "study_norms", "loss", (("norm", "rms"),), None, (),
          _NORMS),
    Claim("mixln", "Mix-LN (post-norm in the first quarter of the layers) ends below pre-LN.", "frontier", "paper24",
          "loss", (("placement", "mix"),), "val_loss_vs_lr.png", ("mixln_1b",), _PAPER),
    Claim("lns", "LayerNorm Scaling ends below pre-LN.", "frontier", "frontier", "loss", (("placement", "lns"),),
          "val_loss_vs_lr.png", ("lns_beats_pre",),
          "addnorm study --preset frontier --out benchmarks/results/study/frontier"),
    Claim("depth", "Post-LN stops training as depth grows; pre-LN, DeepNorm, Mix-LN and LNS keep training.",
          "frontier", "depth", "failures", (("placement", "post"),), "depth_placement_max_lr.png",
          ("post_diverges",), "addnorm study --preset depth --out benchmarks/results/study/depth"),
    Claim("mhc_gain", "mHC keeps the composite mixing gain near 1 where HC's grows with depth.", "frontier",
          "mixing", "gain", (("placement", ("hc", "mhc", "mhc_lite")),), "composite_gain.png", ("mhc_gain",),
          "addnorm study --preset mixing --out benchmarks/results/study/mixing"),
    Claim("dyt_budget", "DyT in place of LayerNorm helps at a small token budget.", "frontier", "paper24", "loss",
          (("norm", "dyt"),), "val_loss_vs_lr.png", ("dyt_budget",), _PAPER),
)


def _matches(row: dict, select) -> bool:
    for axis_, want in select:
        have = row.get(axis_)
        if (have not in want) if isinstance(want, tuple) else (have != want):
            return False
    return True


def _where(row: dict, keys: list[str]) -> str:
    fmt = {"lr": "lr {:g}", "warmup": "warmup {}", "depth": "{} layers", "norm": "{}", "placement": "{}",
           "d_model": "d_model {}", "steps": "{} steps"}
    return ", ".join(fmt[k].format(row[k]) for k in keys if row.get(k) is not None)


def _keys(rows: list[dict]) -> list[str]:
    keys = [k for k in ("placement", "norm", "depth", "d_model", "steps", "warmup")
            if len({r.get(k) for r in rows}) > 1]
    return keys + ["lr"]


def answer(claim: Claim, study: dict | None) -> dict:
    """{'measured': bool, 'lines': [str], 'verdict': str, 'n_params', 'tokens'}: the claim's measured answer from
    a study's summary (None: not committed yet)."""
    if study is None:
        return {"measured": False, "lines": [], "verdict": "not measured yet", "n_params": None, "tokens": None}
    runs = [r for r in study["runs"] if _matches(r, claim.select)]
    if claim.measure == "gain":
        lines, verdict = _gain_lines(runs)
    else:
        pairs = [d for d in study.get("pairwise", []) if _matches(d, claim.select)]
        lines, verdict = _pair_lines(pairs, claim.measure)
    params = [r["n_params"] for r in runs if r.get("n_params")]
    tokens = [r["tokens_seen"] for r in runs if r.get("tokens_seen")]
    return {"measured": bool(runs), "lines": lines, "verdict": verdict if runs else "no run of this setting",
            "n_params": params[0] if params else None, "tokens": max(tokens) if tokens else None}


def _pair_lines(pairs: list[dict], measure: str) -> tuple[list[str], str]:
    keys = _keys(pairs)
    lines, calls = [], []
    for d in pairs:
        if measure == "failures":
            call = d["fail_call"]
            value = (f"failed {d['failures']}/{d['seeds']} vs pre-LN {d['pre_failures']}/{d['pre_seeds']} "
                     f"(Fisher's exact test, {p_text(d['fail_p'])})")
        else:
            call = d["call"]
            value = ("final validation loss minus pre-LN's "
                     f"{interval_text(d['diff_mean'], d['diff_low'], d['diff_high'], '{:+.3f}')}"
                     f" (failed {d['failures']}/{d['seeds']} vs {d['pre_failures']}/{d['pre_seeds']})")
        calls.append(call)
        lines.append(f"{_where(d, keys)}: {value} — {call}")
    counts = {c: calls.count(c) for c in dict.fromkeys(calls)}
    verdict = ", ".join(f"{c} at {n} of {len(calls)}" for c, n in counts.items()) or "no comparison with pre-LN"
    return lines, verdict


def _gain_lines(runs: list[dict]) -> tuple[list[str], str]:
    lines = []
    for placement in dict.fromkeys(r["placement"] for r in runs):
        for depth in sorted({r["depth"] for r in runs if r["placement"] == placement}):
            mine = [r for r in runs if r["placement"] == placement and r["depth"] == depth
                    and r.get("max_composite_gain_fwd") is not None]
            if not mine:
                continue
            fwd = bootstrap_mean([r["max_composite_gain_fwd"] for r in mine])
            bwd = bootstrap_mean([r["max_composite_gain_bwd"] for r in mine])
            lines.append(f"{placement}, {depth} layers: largest composite gain forward "
                         f"{interval_text(fwd.mean, fwd.low, fwd.high, '{:.3g}')}, backward "
                         f"{interval_text(bwd.mean, bwd.low, bwd.high, '{:.3g}')} ({len(mine)} runs)")
    return lines, "measured per run (mean over seeds, 95 % interval)" if lines else "no run recorded the gain"


def load(results_root: Path) -> dict[str, dict | None]:
    """{results directory: its summary.json (None where it is not committed)} for every claim's directory."""
    out = {}
    for c in CLAIMS:
        path = Path(results_root) / c.results / "summary.json"
        out[c.results] = json.loads(path.read_text()) if path.exists() else None
    return out


def _scale(a: dict) -> str:
    if not a["n_params"]:
        return ""
    per = f", {a['tokens'] / a['n_params']:.2g} tokens per parameter" if a["tokens"] else ""
    return (f"{a['n_params'] / 1e6:.2g}M parameters, " + (f"{tokens_text(a['tokens'])} tokens" if a["tokens"] else "")
            + per)


def markdown(results_root: Path, link_root: str = "../benchmarks/results/study") -> str:
    """The docs/study.md section (between START and END); figures linked under ``link_root``."""
    studies = load(results_root)
    out = [START, "", "## The claims, measured", "",
           "Generated from the committed results in `benchmarks/results/study/` by "
           "`python benchmarks/study_writeup.py`; every interval is a 95 % percentile bootstrap over seeds, and a "
           "difference is called only where its interval excludes 0 (see the summaries for every setting).", ""]
    for origin, title in (("seed", "The seeds' claims"), ("frontier", "The frontier's claims")):
        out += [f"### {title}", ""]
        for c in (c for c in CLAIMS if c.origin == origin):
            a = answer(c, studies[c.results])
            out += [f"**{c.text}**", ""]
            if not a["measured"]:
                out += [f"- Measured: {a['verdict']} (no `{c.results}/` results committed). To measure it: "
                        f"`{c.command}`."]
            else:
                out += [f"- Measured in `{c.results}/` ({_scale(a)}): {a['verdict']}."]
                out += [f"  - {line}" for line in a["lines"]]
                fig = Path(results_root) / c.results / "figures" / (c.figure or "")
                if c.figure and fig.exists():
                    out += [f"- Figure: [{c.figure}]({link_root}/{c.results}/figures/{c.figure})"]
                out += [f"- Reproduce: `{c.command}` (add `--report-only` to redraw from the results, training "
                        "nothing)."]
            for key in c.published:
                p = PUBLISHED[key]
                out += [f"- Published: {p.result} — {p.citation}, [arXiv {p.arxiv}]({p.url}). "
                        f"{scale_gap(p, a['n_params'], a['tokens'])}."]
            out.append("")
    out.append(END)
    return "\n".join(out) + "\n"


def update_docs(docs: Path, results_root: Path) -> bool:
    """Replace the section between START and END of ``docs`` (or append it); True when the file changed."""
    text = Path(docs).read_text(encoding="utf-8")
    section = markdown(results_root)
    if START in text and END in text:
        new = text[:text.index(START)] + section.rstrip("\n") + text[text.index(END) + len(END):]
    else:
        new = text.rstrip("\n") + "\n\n" + section
    if new != text:
        atomic_write_text(Path(docs), new)
    return new != text


def page(results_root: Path) -> Page:
    """The write-up as an HTML page for ``results_root/index.html`` (figures linked relative to it)."""
    studies = load(results_root)
    p = Page()
    p.add("<h1>addnorm study: the claims, measured</h1><p class='lead'>Each claim with its measured answer (95 % "
          "bootstrap intervals over seeds; a difference called only where the interval excludes 0), its figure, the "
          "published number it is compared with and the command that reproduces it.</p>")
    for i, c in enumerate(CLAIMS):
        a = answer(c, studies[c.results])
        p.add(f"<h2>{html.escape(c.text)}</h2>")
        if not a["measured"]:
            p.add(f"<p class='note'>Not measured yet: <code>{html.escape(c.command)}</code></p>")
        else:
            items = "".join(f"<li>{html.escape(line)}</li>" for line in a["lines"])
            p.add(f"<p>Measured in <a href='{c.results}/index.html'>{c.results}/</a> ({html.escape(_scale(a))}): "
                  f"{p.num(f'claim{i}.verdict', a['verdict'])}.</p><ul>{items}</ul>")
            if c.figure and (Path(results_root) / c.results / "figures" / c.figure).exists():
                p.add(f"<img src='{c.results}/figures/{c.figure}' alt='{html.escape(c.figure)}'>")
            p.add(f"<p>Reproduce: <code>{html.escape(c.command)}</code></p>")
        for key in c.published:
            pub = PUBLISHED[key]
            p.add(f"<p class='note'>Published: {html.escape(pub.result)} — {html.escape(pub.citation)}, "
                  f"<a href='{pub.url}'>arXiv {pub.arxiv}</a>. {html.escape(scale_gap(pub, a['n_params'], a['tokens']))}.</p>")
    return p


def write_page(results_root: Path) -> Path:
    path = Path(results_root) / "index.html"
    atomic_write_text(path, page(results_root).render("addnorm study: the claims, measured"))
    return path
