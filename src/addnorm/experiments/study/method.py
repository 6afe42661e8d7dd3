"""The study's method as data: the text every claims run trains on, the models, the optimizer, the schedule, the
grid and what each claims preset costs -- read from the code's own constants, the split itself, the claims presets'
models (built here) and the measured times (budget.py), never typed by hand.

``benchmarks/study_writeup.py`` writes it as ``benchmarks/results/study/method.json``, from which
``report/study_method.py`` renders docs/study.md's Method and Limitations; a test recomputes it and checks it against
the committed runs (their data's content hash, parameter counts and tokens).

    python -m addnorm.experiments.study.method --out benchmarks/results/study/method.json
"""

from __future__ import annotations

import json
from pathlib import Path

from ...harness.store import atomic_write_text
from .budget import BUDGET_CPU_HOURS, CLAIM_SET, form, load_costs, preset_cost
from .config import CLAIM_LRS, CLAIM_SEEDS, PRESETS, RunConfig, as_study
from .data import DEV_BYTES, HELD_OUT_EVERY, MAX_TRAIN_BYTES, TEST_BYTES, SplitCorpus, load_split, lr_at
from .heldout import SEQUENCES
from .result_files import RESULTS, parse_results_and_out
from .runner import build_model, optimizer

CLAIM_PRESETS = tuple(name for name in PRESETS if name.startswith("claims_"))


def _round(x: float) -> float:
    """12 significant digits: the file is byte-stable across platforms whose last bits differ."""
    return float(f"{x:.12g}")


def n_params(cfg: RunConfig) -> int:
    """The parameters of the model ``cfg`` trains, counted as a run's summary counts them."""
    return sum(p.numel() for p in build_model(cfg).parameters())


def corpus_facts(data: SplitCorpus) -> dict:
    """The split: where the text comes from, its content hash, and per split its files (count, first, last) and
    bytes (training: the bytes trained on; dev and test: the bytes predicted), with the held-out plateaus."""
    splits = {}
    for name, files, n in (("train", data.train_files, len(data.train)), ("dev", data.dev_files, data.dev_bytes),
                           ("test", data.test_files, data.val_bytes)):
        splits[name] = {"files": len(files), "first": files[0], "last": files[-1], "bytes": n}
    return {"source": data.source, "digest": data.digest, "held_out_every": HELD_OUT_EVERY,
            "max_train_bytes": MAX_TRAIN_BYTES, "test_bytes": TEST_BYTES, "dev_bytes": DEV_BYTES,
            "splits": splits, "dev_unigram_nats": _round(data.unigram_nats),
            "test_unigram_nats": _round(data.test_unigram_nats)}


def training_facts() -> dict:
    """The model family and the optimizer every run shares: tokenization, dtype, dropout, AdamW's settings (from the
    runner's own optimizer), the schedule's end (from data.lr_at) and the held-out evaluation's batching."""
    cfg = RunConfig()
    model = build_model(cfg)
    opt = optimizer(model.parameters(), cfg.lr)
    d = opt.defaults
    return {"tokenization": "bytes", "vocab_size": cfg.gpt_config().vocab_size,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "dropout": cfg.gpt_config().dropout,
            "optimizer": type(opt).__name__, "betas": list(d["betas"]), "eps": d["eps"],
            "weight_decay": d["weight_decay"], "amsgrad": d["amsgrad"],
            "final_lr_fraction": _round(lr_at(cfg.steps, 1.0, 0, cfg.steps)),
            "heldout_sequences": SEQUENCES, "claim_lrs": list(CLAIM_LRS), "claim_seeds": list(CLAIM_SEEDS)}


def _values(runs: list[RunConfig], get) -> list:
    return sorted({get(r) for r in runs})


def preset_facts(name: str, train_bytes: int, costs) -> dict:
    """A claims preset: its runs, the axes they span, each distinct model's parameter count (built), the tokens
    of a run (a run trained until flat: its cap), epochs over the training split, and the CPU-hours budget.py
    computes for running it from nothing."""
    runs = as_study(PRESETS[name]).runs()
    models = {}
    for r in runs:
        models.setdefault(form(r), r)
    tokens = [r.steps * r.batch * r.seq_len for r in runs]
    cost = preset_cost(PRESETS[name], costs) if costs is not None else None
    counts = {f: n_params(cfg) for f, cfg in sorted(models.items())}
    return {"runs": len(runs), "placements": _values(runs, lambda r: r.placement_name),
            "norms": _values(runs, lambda r: r.norm), "depths": _values(runs, lambda r: r.depth),
            "d_models": _values(runs, lambda r: r.d_model), "heads": _values(runs, lambda r: r.heads),
            "seq_len": _values(runs, lambda r: r.seq_len), "batch": _values(runs, lambda r: r.batch),
            "steps": _values(runs, lambda r: r.steps), "until_flat": any(r.until_flat for r in runs),
            "warmups": _values(runs, lambda r: r.warmup), "lrs": _values(runs, lambda r: r.lr),
            "seeds": _values(runs, lambda r: r.seed), "inits": _values(runs, lambda r: r.init),
            "clips": _values(runs, lambda r: r.clip), "eval_every": _values(runs, lambda r: r.eval_every),
            "eval_bytes": _values(runs, lambda r: r.eval_batches * r.batch * r.seq_len),
            "tokens_per_run": sorted(set(tokens)),
            "epochs": [_round(t / train_bytes) for t in sorted(set(tokens))],
            "total_tokens": sum(tokens), "n_params": [min(counts.values()), max(counts.values())],
            "models": counts, "cpu_hours": _round(cost.cpu_hours) if cost else None,
            "borrowed": cost.borrowed if cost else None}


def facts(results: Path = RESULTS, data: SplitCorpus | None = None) -> dict:
    """Everything the Method and Limitations sections state, for the default corpus (or ``data``) and the
    measured times beside ``results`` (``results/../study_presets.json``, as the claims file prices presets)."""
    data = load_split() if data is None else data
    times = Path(results).parent / "study_presets.json"
    costs = load_costs(times) if times.exists() else None
    threads = json.loads(times.read_text(encoding="utf-8"))["final_eval"].get("threads") if costs else None
    return {"corpus": corpus_facts(data), "training": training_facts(),
            "budget": {"cpu_hours": BUDGET_CPU_HOURS, "claim_set": list(CLAIM_SET), "timed_threads": threads,
                       "times": "study_presets.json" if costs else None},
            "presets": {name: preset_facts(name, len(data.train), costs) for name in CLAIM_PRESETS}}


def to_json(f: dict) -> str:
    return json.dumps(f, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_results_and_out("method", "Write the study's method facts (method.json) from the code.",
                                 "method.json", argv)
    atomic_write_text(args.out, to_json(facts(args.results)))
    print(f"{args.out} written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
