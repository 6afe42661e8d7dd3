"""The claims table of docs/study.md and of the study's HTML page, rendered from benchmarks/results/study/claims.json
(written by ``python benchmarks/study_claims.py`` from the committed runs): one row per claim with its effect and
95 % interval, exact p, Holm-adjusted p, verdict and minimum detectable effect. Nothing here computes a statistic;
the file is the one source, so the docs and the page cannot disagree with it."""

from __future__ import annotations

import html
import json
from pathlib import Path

from .docs_section import replace_section
from .published import url

START, END = "<!-- claims-table:start -->", "<!-- claims-table:end -->"
HEADER = ["claim", "source", "preset", "arm vs baseline", "n", "effect [95 % interval]", "p", "p (Holm)", "verdict",
          "mde", "published"]
_MEASURE = {"final_val_loss": "final held-out loss, nats", "generalization_gap": "generalization gap, nats",
            "failure_rate": "failure rate", "peak_composite_gain_fwd": "peak forward composite gain",
            "peak_composite_gain_bwd": "peak backward composite gain",
            "eval_mode_gap": "evaluation- minus training-mode validation loss, nats", "future_leak": "future leak"}


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _num(x, fmt: str = "{:.3g}") -> str:
    return "—" if x is None else fmt.format(x)


def _lr(v) -> str:
    return f"lr {v:g}" if isinstance(v, int | float) else "lrs " + "/".join(f"{x:g}" for x in v)


def side_text(side: dict, other: dict) -> str:
    """'lns, xavier, lr 0.003': the placement, its norm where not LayerNorm, a value residual, and the init, depth,
    width and warmup where the two sides differ (what the contrast is about), then the learning rate."""
    parts = [str(side.get("placement"))]
    if side.get("norm") not in (None, "layer"):
        parts[0] += f" {side['norm']}"
    if side.get("value_residual") is True:
        parts[0] += " + value residual"
    for key, fmt in (("init", "{} init"), ("depth", "{} layers"), ("d_model", "d_model {}"), ("warmup", "warmup {}")):
        if key in side and side.get(key) != other.get(key):
            parts.append(fmt.format(side[key]))
    if side.get("lr") is not None:
        parts.append(_lr(side["lr"]))
    return ", ".join(parts)


def _effect(c: dict) -> str:
    if c["effect"] is None:
        return "not measured"
    fmt = "{:+.2f}" if c["measure"] == "failure_rate" else "{:+.3g}"
    ci = f" [{fmt.format(c['ci'][0])}, {fmt.format(c['ci'][1])}]" if c.get("ci") else ""
    return f"{fmt.format(c['effect'])}{ci} ({_MEASURE.get(c['measure'], c['measure'])})"


def _mde(c: dict) -> str:
    if c["p"] is None:
        return "—"
    return "none at 80 %" if c["mde"] is None else _num(c["mde"])


def _n(c: dict) -> str:
    """Seeds; for a failure-rate claim also the runs on each side (a side pools its learning rates)."""
    if c["measure"] == "failure_rate" and c["p"] is not None:
        return f"{c['n_seeds']} ({c['arm']['runs']} vs {c['baseline']['runs']} runs)"
    return str(c["n_seeds"])


def _source_md(source: str) -> str:
    return f"seed `{source}`" if source.endswith(".txt") else f"[arXiv {source}]({url(source)})"


def _published_md(p: dict | None) -> str:
    return "—" if p is None else f"{p['result']} ({p['setting']})"


def _preset_md(c: dict) -> str:
    """The preset that makes the claim's runs, and the directory read where that is another (a legacy one)."""
    read = c.get("results", c["preset"])
    return f"`{c['preset']}`" + (f" (runs read: `{read}`)" if read != c["preset"] else "")


def _verdict_md(c: dict) -> str:
    return f"**{c['verdict']}**" + ("" if c.get("judged", True) else " (not judged)")


def rows(data: dict) -> list[list[str]]:
    """The table's cells, as plain text (markdown links in the source column)."""
    out = []
    for c in data["claims"]:
        out.append([f"**{c['id']}**: {c['statement']}", _source_md(c["source"]), _preset_md(c),
                    f"{side_text(c['arm'], c['baseline'])} vs {side_text(c['baseline'], c['arm'])}",
                    _n(c), _effect(c), _num(c["p"], "{:.2g}"), _num(c["p_holm"], "{:.2g}"),
                    _verdict_md(c), _mde(c), _published_md(c["published"])])
    return out


def counts_text(data: dict) -> str:
    """'32 claims: 1 supported, 0 contradicted, 31 inconclusive; 3 judged (Holm's correction over those 3)'."""
    claims = data["claims"]
    said = ", ".join(f"{sum(c['verdict'] == v for c in claims)} {v}" for v in ("supported", "contradicted",
                                                                               "inconclusive"))
    m = data["holm_family"]
    return f"{len(claims)} claims: {said}; {m} judged (Holm's correction over those {m})"


def _span(seeds: list[int]) -> str:
    return f"{seeds[0]}–{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))


def seeds_text(data: dict) -> str:
    """What it takes to decide a paired claim at all, once every claim of the file is judged, and the seeds the
    file chooses settings on and tests them on."""
    n, m = data.get("seeds_to_decide"), len(data["claims"])
    if n is None:
        return ""
    text = (f"With all {m} claims judged under Holm's correction, the strongest must reach p < 0.05/{m}; the exact "
            f"sign-flip test can only do that with {n} seeds or more, every one agreeing in sign (p = 2/2^{n}). "
            "Five seeds cannot decide any paired claim (p >= 2/32 = 0.0625), whatever the effect.")
    chose, again = data.get("selection_seeds"), data.get("confirmation_seeds")
    if chose and again:
        every = len(chose) + len(again)
        text += (f" So the learning rates (and warmups) are chosen on the dev split with seeds {_span(chose)}, the "
                 f"chosen settings are run again at seeds {_span(again)}, and every claim paired by seed is tested on "
                 f"all {every} seeds at the chosen settings (p down to 2/2^{every}).")
    return text


def markdown(data: dict) -> str:
    """The docs/study.md section between START and END."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = [START, "", "## The claims file", "",
             "Generated from `benchmarks/results/study/claims.json` (itself recomputed from the committed runs by "
             f"`python benchmarks/study_claims.py`; a test keeps both current). {counts_text(data)}.", "",
             data["method"], "", seeds_text(data), "",
             "effect is arm minus baseline; n is the number of seeds (pairs for a loss claim); mde is the smallest "
             "effect the test could detect with 80 % power (\"none at 80 %\": no rate the runs allow); each record "
             "in the file also holds the tokens, tokens per parameter, epochs, held-out bytes (`val_bytes`), whether "
             "the learning-rate grid brackets each tuned side's best (`lr_bracketed`), the command and notes on what "
             "it was measured against. A claim read from a directory measured before the held-out test split (4,096 "
             "bytes per final loss) is shown \"(not judged)\", its notes saying why.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows(data)]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def html_table(data: dict) -> str:
    """The same table as an HTML fragment for the study's page."""
    def esc(s: str) -> str:
        return html.escape(s.replace("**", "").replace("`", ""))

    body = []
    for c, r in zip(data["claims"], rows(data)):
        src = (f"seed {html.escape(c['source'])}" if c["source"].endswith(".txt")
               else f"<a href='{url(c['source'])}'>arXiv {html.escape(c['source'])}</a>")
        cls = {"supported": "ok", "contradicted": "bad"}.get(c["verdict"], "")
        cells = [esc(r[0]), src, *map(esc, r[2:8]), f"<span class='{cls}'>{esc(_verdict_md(c))}</span>",
                 *map(esc, r[9:])]
        body.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    return (f"<h2>The claims file</h2><p class='lead'>{html.escape(counts_text(data))}. "
            f"{html.escape(data['method'])} {html.escape(seeds_text(data))}</p>"
            f"<table><tr>{head}</tr>{''.join(body)}</table>")


def update_docs(docs: Path, claims: Path, before: str | None = None) -> bool:
    """Replace the section between START and END of ``docs`` (else insert it before the line ``before``, else
    append it); True when the file changed."""
    return replace_section(Path(docs), START, END, markdown(load(claims)), before)
