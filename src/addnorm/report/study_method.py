"""docs/study.md's Method and Limitations, rendered from two result files and nothing else:
``benchmarks/results/study/method.json`` (the corpus, split, models, optimizer, schedule, grid and budget, written
from the code by ``experiments/study/method.py``) and ``claims.json`` (each claim's published number and setting,
its runs' parameters and tokens, whether it is judged). No number here is typed by hand; the statistics are the
claims file's, pointed at rather than restated.

A paper's scale is read from its claim's published text ("models of 130M to 7B parameters", "1T tokens"): a
number with M, B or T is a parameter count, or a token count where "tokens" follows it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .docs_section import replace_section
from .published import url

START, END = "<!-- study-method:start -->", "<!-- study-method:end -->"
_UNITS = {"M": 1e6, "B": 1e9, "T": 1e12}
# "130M", "1.2B", "7B-70B", "64M-parameter"; "(500B tokens)", "1M training tokens" are token counts
_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)([MBT])(?![A-Za-z])(\s+(?:training\s+)?tokens)?")


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def paper_scale(published: dict | None) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """((smallest, largest) parameters, (smallest, largest) training tokens) named in a claim's published result
    and setting; None for what the text does not state."""
    if not published:
        return None, None
    params, tokens = [], []
    for m in _SIZE.finditer(f"{published['result']} {published['setting']}"):
        (tokens if m.group(3) else params).append(float(m.group(1)) * _UNITS[m.group(2)])
    return ((min(params), max(params)) if params else None), ((min(tokens), max(tokens)) if tokens else None)


def _count(n: float) -> str:
    """Parameters and tokens: 512k, 1.22M, 7B, 1T."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"


def _span(lo: float, hi: float) -> str:
    a, b = _count(lo), _count(hi)
    return a if a == b else f"{a}–{b}"


def _times(x: float) -> str:
    """Two significant digits: 7.4×, 58×, 5,700×, 2,000,000×."""
    return f"{float(f'{x:.2g}'):,.0f}×" if x >= 10 else f"{x:.2g}×"


def ratio_text(paper: tuple[float, float] | None, study: tuple[float, float] | None) -> str:
    """How many times the study's the paper's scale is: the smallest paper against the largest study run, to the
    largest against the smallest ('58×–5,700×'); '—' where either is unknown."""
    if not paper or not study:
        return "—"
    lo, hi = paper[0] / study[1], paper[1] / study[0]
    return _times(lo) if _times(lo) == _times(hi) else f"{_times(lo)}–{_times(hi)}"


def study_params(c: dict) -> tuple[float, float] | None:
    """The (smaller, larger) parameter count of the claim's two sides (each the median of its runs)."""
    n = [s["n_params"] for s in (c["arm"], c["baseline"]) if s.get("n_params")]
    return (min(n), max(n)) if n else None


def _param_gap(c: dict) -> tuple[float, ...]:
    """(smallest, largest) ratio of a paper claim's parameters to its runs', or () where either is unknown."""
    paper, mine = paper_scale(c["published"])[0], study_params(c)
    return (paper[0] / mine[1], paper[1] / mine[0]) if paper and mine and not c["source"].endswith(".txt") else ()


def _list(xs, fmt: str = "{}") -> str:
    return ", ".join(fmt.format(x) for x in xs)


def _steps(p: dict) -> str:
    steps = "/".join(str(s) for s in p["steps"])
    return f"until flat, at most {steps}" if p["until_flat"] else steps


def preset_rows(method: dict) -> list[list[str]]:
    rows = []
    for name, p in method["presets"].items():
        shapes = _list(p["depths"]) + " × " + _list(p["d_models"])
        hours = "—" if p["cpu_hours"] is None else f"{p['cpu_hours']:.2f}" + (" (cap)" if p["until_flat"] else "")
        rows.append([f"`{name}`", str(p["runs"]), shapes, _span(*p["n_params"]), _steps(p),
                     "/".join(_count(t) for t in p["tokens_per_run"]),
                     "/".join(f"{e:.3g}" for e in p["epochs"]), _count(p["total_tokens"]),
                     _list(p["lrs"], "{:g}"), _list(p["warmups"]), _list(p["inits"]), hours])
    return rows


def scale_rows(claims: dict) -> list[list[str]]:
    """One row per paper claim (an arXiv source): the published result and setting, the paper's parameters and
    tokens as its text states them, this study's, and the ratios."""
    rows = []
    for c in claims["claims"]:
        if c["source"].endswith(".txt"):
            continue  # a seed's claim: no paper
        pub = c["published"]
        params, tokens = paper_scale(pub)
        mine = study_params(c)
        said = "—" if pub is None else f"{pub['result']} ({pub['setting']})"
        rows.append([f"`{c['id']}`", f"[{c['source']}]({url(c['source'])})", said,
                     _span(*params) if params else "—", _span(*mine) if mine else "not measured",
                     ratio_text(params, mine), _span(*tokens) if tokens else "—",
                     _count(c["tokens"]) if c["tokens"] else "not measured",
                     ratio_text(tokens, (c["tokens"], c["tokens"]) if c["tokens"] else None)])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(x.replace("|", "\\|") for x in r) + " |" for r in rows])


def _method(m: dict, claims: dict) -> list[str]:
    c, t, b = m["corpus"], m["training"], m["budget"]
    s = c["splits"]
    presets = m["presets"]
    set_hours = sum(presets[p]["cpu_hours"] or 0 for p in b["claim_set"])
    clips = {x for p in presets.values() for x in p["clips"]}
    evals = sorted({x for p in presets.values() for x in p["eval_bytes"]})
    return [
        "## Method", "",
        "Generated by `python benchmarks/study_writeup.py` from `benchmarks/results/study/method.json` (written from "
        "the code: the split itself, the claims presets' models built and counted, the runner's optimizer, the "
        "measured step times) and `claims.json`; a test keeps both current.", "",
        f"**Corpus and tokenization.** {c['source']}, read as bytes: one token per byte, a vocabulary of "
        f"{t['vocab_size']}. Split by file (never bytes of one file in two splits): every {c['held_out_every']}th "
        f"file, sorted by path, is held out. The **test** split is {s['test']['files']} held-out files "
        f"(`{s['test']['first']}` to part of `{s['test']['last']}`), {s['test']['bytes']:,} predicted bytes; the "
        f"**dev** split the next {s['dev']['files']} (`{s['dev']['first']}` to part of `{s['dev']['last']}`), "
        f"{s['dev']['bytes']:,}; the **training** split the other {s['train']['files']} files "
        f"(`{s['train']['first']}` to `{s['train']['last']}`), capped at {c['max_train_bytes']:,} bytes "
        f"({s['train']['bytes']:,} read). Content hash `{c['digest']}`, recorded by every run trained on it. The "
        f"unigram plateau (the training split's byte frequencies): {c['test_unigram_nats']:.3f} nats on the test "
        f"split, {c['dev_unigram_nats']:.3f} on dev.", "",
        f"**Models.** Byte-level GPTs in {t['dtype']}, no dropout ({t['dropout']:g}); the claims presets' shapes "
        "and parameter counts (every distinct model of a preset built and counted) are in the table below.", "",
        f"**Optimizer and schedule.** {t['optimizer']} (β = {_list(t['betas'], '{:g}')}, ε = {t['eps']:g}, weight "
        f"decay {t['weight_decay']:g}), "
        + ("no gradient clipping" if clips == {0.0} else f"gradient clipping at {_list(sorted(clips), '{:g}')}")
        + "; the learning rate rises linearly over the warmup steps, then decays along a cosine to "
        f"{t['final_lr_fraction']:g} × its peak at the last step.", "",
        f"**Learning rates and seeds.** Each claims preset runs seeds {_list(t['claim_seeds'])} at learning rates "
        f"{_list(t['claim_lrs'], '{:g}')} (`claims_mixing` at one: its measure is a gain, not a loss); a claim "
        "tuned by learning rate takes each side at its own best, the lowest mean final dev loss over these seeds. "
        f"A claim paired by seed alone then runs its sides' settings again at seeds "
        f"{_list(claims['confirmation_seeds'])} (`addnorm study --confirm`) and is tested on all "
        f"{len(claims['selection_seeds']) + len(claims['confirmation_seeds'])}: the choice is made on seeds the "
        "confirmation runs cannot move.", "",
        f"**Evaluation.** Every final loss reads the test split whole: its {c['test_bytes']:,} predicted bytes, each "
        f"once, in non-overlapping windows of the run's sequence length ({t['heldout_sequences']} windows a "
        f"forward pass); the dev split ({c['dev_bytes']:,} bytes) is read whole at the end too and picks learning "
        f"rates. During training, {_list(evals, '{:,}')} bytes of fixed dev batches are read every `eval_every` "
        "steps (the curves, and the stopping rule of a run trained until flat).", "",
        "**Intervals and tests.** As the claims file states them (its `method`, printed with its table in \"The "
        "claims file\" below): the tests, the intervals, the minimum detectable effect and Holm's correction are "
        f"computed there, and a claim is judged only with {claims['min_seeds']} seeds or more and final losses on "
        f"at least {claims['min_val_bytes']:,} held-out bytes. The calls of \"The claims, measured\" are "
        "descriptive leads; the claims file's verdicts are the tests.", "",
        f"**Epochs and compute per claims preset.** Tokens per run = steps × batch × sequence length; epochs = "
        f"tokens / the {s['train']['bytes']:,} training bytes. CPU-hours are computed, not measured: "
        f"`experiments/study/budget.py` prices each run from {b['timed_threads']}-thread per-step times measured "
        f"by `benchmarks/bench_study_presets.py` (`{b['times']}`). The claim set ({', '.join(b['claim_set'])}) "
        f"comes to {set_hours:.2f} CPU-hours against a budget of {b['cpu_hours']:g}.", "",
        *_table(["preset", "runs", "depth × d_model", "parameters", "steps", "tokens per run", "epochs",
                 "tokens, all runs", "learning rates", "warmup", "init", "CPU-hours (computed)"], preset_rows(m)),
    ]


def _limitations(m: dict, claims: dict) -> list[str]:
    c, t = m["corpus"], m["training"]
    presets = m["presets"].values()
    params = (min(p["n_params"][0] for p in presets), max(p["n_params"][1] for p in presets))
    every_tokens = [x for p in presets for x in p["tokens_per_run"]]
    every_epochs = [x for p in presets for x in p["epochs"]]
    tokens, epochs = (min(every_tokens), max(every_tokens)), (min(every_epochs), max(every_epochs))
    records = claims["claims"]
    judged = [r["id"] for r in records if r["judged"]]
    unmeasured = [r["id"] for r in records if r["effect"] is None]
    unjudged = [r["id"] for r in records if not r["judged"] and r["effect"] is not None]
    rows = scale_rows(claims)
    gaps = [g for r in records for g in _param_gap(r)] or [float("nan")] * 2
    gaps = (min(gaps), max(gaps))
    return [
        "## Limitations", "",
        f"- **Scale.** The claims presets' models have {_span(*params)} parameters and see {_span(*tokens)} "
        f"tokens a run. Where a paper's text states its scale, its models have {_times(gaps[0])} to "
        f"{_times(gaps[1])} the parameters of the runs that test it (the table below: each claim's published "
        "number and setting, the paper's scale as its text states it, and how many times this study's it is). An "
        "effect that appears only at scale cannot show here, and one seen here need not survive it.",
        f"- **One byte-level corpus of code.** Every run reads one corpus, {c['source']}: Python source, one "
        "token per byte "
        f"(vocabulary {t['vocab_size']}). The papers train on natural-language text with subword tokens (each "
        "several bytes), so their token counts are not bytes and a loss here (nats per byte) is not their "
        "perplexity.",
        f"- **CPU, {t['dtype']}.** The committed runs were trained on CPU in {t['dtype']}, one thread a process "
        "(the commands below); the papers' GPU training in mixed precision, at their batch sizes and sequence "
        "lengths, is not reproduced.",
        f"- **Seeds.** {len(t['claim_seeds'])} seeds a setting, and "
        f"{len(claims['selection_seeds']) + len(claims['confirmation_seeds'])} at a paired claim's chosen settings. "
        f"With all {len(records)} of the claims file's claims under Holm's correction a loss claim needs "
        f"{claims['seeds_to_decide']} pairs, every one agreeing in sign (its preamble, \"The claims file\" below); "
        f"a claim whose confirmation runs are not committed is tested on {len(claims['selection_seeds'])} pairs "
        "and cannot be decided.",
        f"- **Short budgets.** {epochs[0]:.3g}–{epochs[1]:.3g} epochs of the training split a run (a run trained "
        "until flat: at most its cap); what happens over a paper's token budget is not measured.",
        f"- **What is not judged.** {len(judged)} of the claims file's {len(records)} claims are judged. "
        f"Measured but not judged ({len(unjudged)}): " + (", ".join(f"`{i}`" for i in unjudged) or "none")
        + f". Not measured yet ({len(unmeasured)}): " + (", ".join(f"`{i}`" for i in unmeasured) or "none")
        + ". Each record's notes in `claims.json` say why.", "",
        "Each paper claim, its published number and the scale difference (this study's parameters: the two sides' "
        "median counts; tokens: a run's planned budget, a cap for a run trained until flat; \"—\": the claim's "
        "published text states no size):", "",
        *_table(["claim", "paper", "published (setting)", "paper's parameters", "this study's", "ratio",
                 "paper's tokens", "this study's", "ratio"], rows),
    ]


def markdown(method: dict, claims: dict) -> str:
    """The docs/study.md section between START and END."""
    return "\n".join([START, "", *_method(method, claims), "", *_limitations(method, claims), "", END]) + "\n"


def update_docs(docs: Path, results: Path, before: str | None = None) -> bool:
    """Render from ``results``/method.json and claims.json into ``docs`` (in place of the section, else before the
    line ``before``, else at the end); True when the file changed."""
    section = markdown(load(Path(results) / "method.json"), load(Path(results) / "claims.json"))
    return replace_section(Path(docs), START, END, section, before)
