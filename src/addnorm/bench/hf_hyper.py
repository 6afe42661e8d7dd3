"""HF's hyper-connection decoders -- DeepSeek-V4, HY-V4, Qwen4-exp (``bench.hf_hyper_models``) -- as HF builds them
(``eager``), patched by ``patch_hf_model`` (``patched``) and compiled by ``torch.compile`` (``compile``), side by
side in one process: a training step (forward and backward of the loss; no optimizer) and cached greedy decoding
(tokens/s), each timed over interleaved rounds (every round runs each method once, the first one rotating, so a
drifting machine favours none), reported as the median and the 10th-90th percentile range.

Beside the speedups, the share of the time HF's hyper-connections take, and the patched model's, measured the same
way (``bench.hyper_share``: the modules and the writes, forward and backward, and in decoding), and the speedup that
HF's share bounds: removing the hyper-connections' time altogether would make a step 1 / (1 - share) as fast, and
putting the patched model's hyper-connection time in place of HF's, ``t / (t - hyper_HF + hyper_patched)`` (both from
the instrumented passes). ``torch.compile`` leaves no module boundaries to time, so its share is not measured. A
method that fails -- a compile that raises -- is recorded with its error and the others go on.

    python benchmarks/bench_hf_hyper.py [--hidden 2048] [--layers 2] [--batch 4] [--seq 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from ..harness.store import atomic_write_text
from ..harness.timing import summary_of
from .cpu_cells import conditions
from .hf_hyper_models import FAMILIES, HyperModelConfig, build, hf_config
from .hyper_share import HyperShare, PassShare

METHODS = ("eager", "patched", "compile")
DEFAULT_OUT = "addnorm-results/bench_hf_hyper.json"


@dataclass(frozen=True)
class HyperBenchConfig:
    families: tuple = FAMILIES
    methods: tuple = METHODS
    hidden: int = 2048  # one stream's width (bench.hf_hyper_models)
    layers: int = 2
    vocab: int = 512
    batch: int = 4  # training: batch x seq tokens a step
    seq: int = 256
    decode_batch: int = 1  # decoding: this many sequences, each a prompt then new_tokens greedy steps
    prompt: int = 32
    new_tokens: int = 32
    repeats: int = 10  # interleaved rounds of timing (each method once a round)
    share_repeats: int = 3  # instrumented passes per model for the shares (their median)
    seed: int = 0

    def __post_init__(self):
        for name in ("hidden", "layers", "vocab", "batch", "seq", "decode_batch", "prompt", "new_tokens",
                     "repeats", "share_repeats"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name, valid in (("families", FAMILIES), ("methods", METHODS)):
            got = getattr(self, name)
            bad = [x for x in got if x not in valid]
            if bad or not got or len(set(got)) != len(got):
                raise ValueError(f"{name} must be distinct values of {list(valid)}, got {list(got)}")
        if "eager" not in self.methods:
            raise ValueError(f"methods must include 'eager' (every ratio is to it), got {list(self.methods)}")

    def model(self, family: str) -> HyperModelConfig:
        return HyperModelConfig(family, hidden=self.hidden, layers=self.layers, vocab=self.vocab, seed=self.seed)


def _error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 2000 else text[:1000] + " [...] " + text[-1000:]


def _models(cfg: HyperBenchConfig, family: str) -> tuple[dict, dict]:
    """({method: model}, {method: error}) for a family: the same weights in each."""
    from ..interop import patch_hf_model

    eager = build(cfg.model(family))
    models, errors = {"eager": eager}, {}
    if "patched" in cfg.methods:
        try:
            models["patched"] = patch_hf_model(copy.deepcopy(eager))
        except Exception as e:  # noqa: BLE001  (recorded: the benchmark says why, and times the others)
            errors["patched"] = _error(e)
    if "compile" in cfg.methods:
        models["compile"] = torch.compile(copy.deepcopy(eager))
    return models, errors


def _ids(cfg: HyperBenchConfig, batch: int, seq: int, seed: int) -> torch.Tensor:
    return torch.randint(1, cfg.vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _loss(model, ids):
    return model(input_ids=ids, labels=ids, use_cache=False)


def train_step(model, ids):
    """One training step's function: the seconds of forward and backward of the loss (gradients cleared first,
    untimed)."""
    def step() -> float:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        _loss(model, ids).loss.backward()
        return time.perf_counter() - t0
    return step


@torch.no_grad()  # not inference_mode: the patched model hands a write's read over only outside it
def decode(model, prompt_ids, new_tokens: int, each=None):
    """Greedy decoding with the model's cache: the prompt, then ``new_tokens`` single-token steps. (seconds of the
    steps, the tokens: the prompt's next and each step's). ``each(fn)`` runs a step's forward (the hooks)."""
    each = each or (lambda fn: fn())
    out = model(input_ids=prompt_ids, use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)
    tokens = [tok]
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        cache = out.cache
        out = each(lambda: model(input_ids=tok, cache=cache, use_cache=True))
        tok = out.logits[:, -1:].argmax(-1)
        tokens.append(tok)
    return time.perf_counter() - t0, torch.cat(tokens, 1)


def interleaved(fns: dict, rounds: int) -> dict:
    """{name: Timing} of functions that each return the seconds they measured: one warm-up call each, then
    ``rounds`` rounds of one call each, the first of a round rotating."""
    names = list(fns)
    for name in names:
        fns[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(fns[name]())
    return {name: summary_of(ts) for name, ts in times.items()}


def _timing(t, per: float = 1.0) -> dict:
    return {"median_ms": 1e3 * t.median_s, "p10_ms": 1e3 * t.p10_s, "p90_ms": 1e3 * t.p90_s, "runs": t.runs,
            **({"tokens_per_s": per / t.median_s, "tokens_per_s_p10_p90": [per / t.p90_s, per / t.p10_s]}
               if per != 1.0 else {})}


def check(models: dict, ids, prompt, new_tokens: int, errors: dict) -> dict:
    """Each method against eager: the largest differences of the logits, the loss and the parameters' gradients
    of one step, and whether greedy decoding gives the same tokens. A method that raises here is dropped and its
    error recorded."""
    ref, out = None, {}
    for name in list(models):
        m = models[name]
        try:
            m.zero_grad(set_to_none=True)
            o = _loss(m, ids)
            o.loss.backward()
            grads = [p.grad for p in m.parameters()]
            _, tokens = decode(m, prompt, new_tokens)
        except Exception as e:  # noqa: BLE001  (recorded: the benchmark says why, and times the others)
            errors[name] = _error(e)
            del models[name]
            continue
        got = (o.logits.detach(), o.loss.detach(), grads, tokens)
        if name == "eager":
            ref = got
            continue
        diffs = [(a - b).abs().max().item() for a, b in zip(got[2], ref[2]) if a is not None and b is not None]
        out[name] = {"max_abs_logits": (got[0] - ref[0]).abs().max().item(),
                     "abs_loss": (got[1] - ref[1]).abs().item(), "max_abs_grad": max(diffs, default=0.0),
                     "grads_missing": sum((a is None) != (b is None) for a, b in zip(got[2], ref[2])),
                     "same_tokens": bool(torch.equal(got[3], ref[3]))}
    return out


def _median_share(shares: list[PassShare]) -> PassShare:
    return PassShare(*(statistics.median(getattr(s, f.name) for s in shares) for f in fields(PassShare)))


def shares(model, ids, prompt, new_tokens: int, repeats: int) -> dict:
    """The hyper-connections' share of a training step (forward, backward, both) and of decoding, over
    ``repeats`` instrumented passes (the median of each time)."""
    fwd, bwd, step, dec = [], [], [], []
    with HyperShare(model) as hs:
        for _ in range(repeats):
            model.zero_grad(set_to_none=True)
            out, f, intervals = hs.forward(lambda: _loss(model, ids))
            b = hs.backward(intervals, lambda: out.loss.backward())
            both = PassShare()
            both.add(f)
            both.add(b)
            fwd.append(f)
            bwd.append(b)
            step.append(both)
            d = PassShare()

            def each(fn):
                o, s, _ = hs.forward(fn)
                d.add(s)
                return o

            decode(model, prompt, new_tokens, each)
            dec.append(d)
    return {k: _median_share(v).as_dict() for k, v in (("forward", fwd), ("backward", bwd), ("step", step),
                                                         ("decode", dec))}


def _bounds(share: dict) -> dict:
    """The speedups HF's share sets beside the measured ones, per pass kind."""
    hf, ours = share["eager"], share.get("patched")
    out = {}
    for kind in ("forward", "backward", "step", "decode"):
        s = hf[kind]["share"]
        row = {"hf_share": s, "bound": 1 / (1 - s) if s < 1 else float("inf")}
        if ours is not None:
            t, h, p = hf[kind]["total_ms"], hf[kind]["hyper_ms"], ours[kind]["hyper_ms"]
            row.update(patched_share=ours[kind]["share"],
                       patched_share_over_hf=ours[kind]["share"] / s if s else None,
                       patched_hyper_over_hf=p / h if h else None,
                       predicted=t / (t - h + p) if t - h + p > 0 else None)
        out[kind] = row
    return out


def run_family(cfg: HyperBenchConfig, family: str, log=print) -> dict:
    models, errors = _models(cfg, family)
    hf_cfg, _ = hf_config(cfg.model(family))
    ids = _ids(cfg, cfg.batch, cfg.seq, cfg.seed + 1)
    prompt = _ids(cfg, cfg.decode_batch, cfg.prompt, cfg.seed + 2)
    log(f"{family}: checking {', '.join(models)} against eager")
    checks = check(models, ids, prompt, cfg.new_tokens, errors)
    log(f"{family}: timing a training step, {cfg.repeats} interleaved rounds")
    train = interleaved({n: train_step(m, ids) for n, m in models.items()}, cfg.repeats)
    log(f"{family}: timing decoding, {cfg.repeats} interleaved rounds")
    dec = {}
    for name in list(models):  # a compiled model that decodes in check but raises later: recorded, not fatal
        dec[name] = lambda m=models[name]: decode(m, prompt, cfg.new_tokens)[0]
    try:
        decoding = interleaved(dec, cfg.repeats)
    except Exception as e:  # noqa: BLE001
        errors["decode"] = _error(e)
        decoding = {}
    log(f"{family}: the hyper-connections' share, {cfg.share_repeats} instrumented passes each")
    share = {n: shares(models[n], ids, prompt, cfg.new_tokens, cfg.share_repeats)
             for n in ("eager", "patched") if n in models}
    tokens = cfg.decode_batch * cfg.new_tokens
    result = {
        "family": family, "model": type(models["eager"]).__name__, "methods": list(cfg.methods),
        "parameters_M": sum(p.numel() for p in models["eager"].parameters()) / 1e6,
        "hf_config": {k: v for k, v in hf_cfg.to_dict().items()
                      if isinstance(v, int | float | str | list) and not isinstance(v, bool)},
        "errors": errors, "check": checks,
        "patch_report": getattr(models.get("patched"), "_addnorm_patched", None),
        "train": {n: _timing(t) for n, t in train.items()},
        "decode": {n: _timing(t, tokens) for n, t in decoding.items()},
        "share": share, "bounds": _bounds(share) if "eager" in share else {},
    }
    result["speedup"] = {kind: {n: result[kind]["eager"]["median_ms"] / r["median_ms"]
                                for n, r in result[kind].items() if n != "eager"}
                         for kind in ("train", "decode") if "eager" in result[kind]}
    return result


def _num(v, spec: str = ".3f") -> str:
    return "–" if v is None else format(v, spec)


def _share_cell(s: dict | None) -> str:
    return "–" if s is None else f"{s['share']:.1%} ({s['modules_ms']:.1f} + {s['writes_ms']:.1f} ms)"


def table(results: list[dict]) -> list[str]:
    """The results as markdown: per family, the times and speedups of every method it was asked for, then the
    hyper-connections' shares beside the speedups they bound."""
    lines = ["| model | method | training step, ms (p10–p90) | speedup | decoding, tokens/s (p10–p90) | speedup |",
             "|---|---|---|---|---|---|"]
    for r in results:
        for n in r["methods"]:
            t, d = r["train"].get(n), r["decode"].get(n)
            train = (f"{t['median_ms']:.1f} ({t['p10_ms']:.1f}–{t['p90_ms']:.1f}) | "
                     f"{_num(r['speedup']['train'].get(n, 1.0))}") if t else "failed | –"
            dec = (f"{d['tokens_per_s']:.1f} ({d['tokens_per_s_p10_p90'][0]:.1f}–{d['tokens_per_s_p10_p90'][1]:.1f}) | "
                   f"{_num(r['speedup']['decode'].get(n, 1.0))}") if d else "failed | –"
            lines.append(f"| {r['family']} | {n} | {train} | {dec} |")
    lines += ["", "| model | pass | HF's hyper-connections: share (modules + writes) | patched | patched / HF share | "
                  "bound 1 / (1 − share) | predicted | measured speedup |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        measured = {"step": r["speedup"].get("train", {}).get("patched"),
                    "decode": r["speedup"].get("decode", {}).get("patched")}
        for kind, b in r["bounds"].items():
            lines.append(f"| {r['family']} | {kind} | {_share_cell(r['share']['eager'][kind])} | "
                         f"{_share_cell(r['share'].get('patched', {}).get(kind))} | "
                         f"{_num(b.get('patched_share_over_hf'))} | {_num(b['bound'])} | {_num(b.get('predicted'))} | "
                         f"{_num(measured.get(kind))} |")
    return lines


def machine() -> dict:
    import transformers

    return {**conditions("current"), "transformers": transformers.__version__, "device": "cpu",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_hf_hyper.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = HyperBenchConfig()
    p.add_argument("--families", default=",".join(d.families), help="comma separated, of %(default)s")
    p.add_argument("--methods", default=",".join(d.methods), help="comma separated, of %(default)s (eager needed)")
    for name in ("hidden", "layers", "vocab", "batch", "seq", "decode_batch", "prompt", "new_tokens", "repeats",
                 "share_repeats", "seed"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name),
                       help="default %(default)s")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default=DEFAULT_OUT, help="the JSON file to write (default ./%(default)s)")
    a = p.parse_args(argv)
    try:
        cfg = HyperBenchConfig(
            families=tuple(x for x in a.families.split(",") if x), methods=tuple(x for x in a.methods.split(",") if x),
            **{k: getattr(a, k) for k in ("hidden", "layers", "vocab", "batch", "seq", "decode_batch", "prompt",
                                          "new_tokens", "repeats", "share_repeats", "seed")})
        for fam in cfg.families:
            cfg.model(fam)
    except ValueError as e:
        p.error(str(e))
    if a.threads is not None:
        if a.threads < 1:
            p.error(f"--threads must be a positive integer, got {a.threads}")
        torch.set_num_threads(a.threads)
    out = Path(a.out)
    if out.exists() and out.is_dir():
        p.error(f"--out must be a file path (the JSON), got the directory {out}")
    results = []
    for fam in cfg.families:
        results.append(run_family(cfg, fam, log=lambda s: print(s, file=sys.stderr, flush=True)))
    lines = table(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps({"machine": machine(), "config": asdict(cfg), "results": results,
                                       "table": lines}, indent=1))
    print("\n".join(lines))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
