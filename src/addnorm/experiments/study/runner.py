"""One study run: train a byte-level GPT, log every step, evaluate, stop on failure, resume after any crash.

Files in the run's directory (named by the run and its cache key):
    config.json      the RunConfig and the data's content hash
    metrics.jsonl    one line per step: loss, lr, gradient norm before clipping, per-block gradient norm of the
                     block's weights, per-block residual-stream RMS and max|x|, update/weight ratio, and in the
                     first 100 steps the RMS of each norm slot's input (stream.py); val_loss on evaluation steps
    checkpoint.pt    model, optimizer, step, loss history and RNG state (``torch.load(weights_only=True)``);
                     the learning rate is a function of the step and the batches are drawn from the step
                     number, so this is everything a resumed run needs to end bit-identical
    summary.json     the outcome, written last: its presence means the run is finished; beside the losses:
                     tokens seen, parameters, whether and when the validation curve flattened (flat.py),
                     and the last evaluation's saturation (DyT/Derf) and largest composite mixing gain
                     (widened streams) from probe.py, whose per-evaluation values are in metrics.jsonl;
                     the saturation of every evaluation also as ``saturation_curve``, the largest gains of every
                     evaluation as ``gain_curve``, and the per-block gradient norms at steps 0, 50 and the last
                     as ``grad_profile``, the stream's RMS after the last block at the last step
                     (``last_stream_rms``) and per norm slot in the first 100 steps (``early_slot_rms``):
                     everything the report reads, so that a results directory committed
                     with each run's summary.json and config.json alone is reused on another machine (the run
                     is not trained again) and reported whole
Every file is written atomically (temporary file, fsync, rename); metrics are appended line by line and cut
back to the checkpoint's step on resume. A truncated or corrupt file is reported by name and its run redone.

The evaluations during training read fixed batches of the dev split (data.py), and so does every decision (the
stopping rule of ``until_flat``); the final losses read the test and dev splits whole (heldout.py): the summary's
``final_val_loss`` is the test split's, over ``val_bytes`` bytes, beside ``final_dev_loss``, ``dev_bytes`` and the
seconds the test evaluation took (``test_eval_seconds``).

Under ``torchrun`` (a process group initialised: gloo on CPU, nccl on GPU) one run trains data-parallel:
each rank takes its slice of every step's global batch, DDP averages the gradients, the logged loss is the
ranks' mean (the global batch's loss), and rank 0 alone writes files. A run uses the GPU when one is present.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ...model import GPT
from ...nn.scalars import fit_optimizer_state
from ...harness.store import atomic_write, atomic_write_text, read_json
from . import tensorboard as tb
from .config import RunConfig
from .data import SplitCorpus, lr_at
from .flat import flatten_step
from .heldout import final_losses
from .probe import probe
from .stream import EARLY_STEPS, BlockStats, SlotStats, stream_summary

SPIKE_WINDOW = 20
SPIKE_FACTOR = 1.5  # a loss above 1.5x the mean of the previous 20 steps stops the run
SPIKE_PERSIST = 5  # ... for 5 steps in a row, in runs trained until their curve flattens (see _failure)
BETAS = (0.9, 0.98)  # AdamW's, with no weight decay: every run's optimizer (its schedule: data.lr_at)
WEIGHT_DECAY = 0.0


def build_model(cfg: RunConfig) -> GPT:
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.gpt_config())
    if cfg.init == "xavier":  # Xavier-normal Linear weights (DeepNorm keeps its own beta-scaled Xavier)
        for block in model.h:
            if block.placement.residual == "scaled":
                continue
            for m in block.modules():
                if isinstance(m, nn.Linear):
                    nn.init.xavier_normal_(m.weight)
    return model.normalize_()  # nGPT: the re-initialised weights back on the sphere (nothing otherwise)


def optimizer(params, lr: float) -> torch.optim.Optimizer:
    """The optimizer every run trains with (the write-up's method section reads its settings from here)."""
    return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY)


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _save_checkpoint(path: Path, model, opt, step: int, losses: list[float]) -> None:
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
             "losses": torch.tensor(losses, dtype=torch.float64), "rng": torch.get_rng_state()}
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def _read_checkpoint(path: Path, model) -> dict:
    """The checkpoint's contents (``torch.load(weights_only=True)``), its weights loaded into ``model``; raises
    on a missing or damaged file."""
    ck = torch.load(path, weights_only=True, map_location=_device())
    model.load_state_dict(ck["model"])
    return ck


def _load_checkpoint(path: Path, model, opt):
    """(step, losses) from the checkpoint, or (0, []) and a message when there is none or it is corrupt."""
    if not path.exists():
        return 0, [], None
    try:
        ck = _read_checkpoint(path, model)
        opt.load_state_dict(ck["optimizer"])
        fit_optimizer_state(opt)  # a checkpoint from before the learned scalars were (1,)
        torch.set_rng_state(ck["rng"].cpu())
        return int(ck["step"]), ck["losses"].tolist(), None
    except Exception as e:  # noqa: BLE001  (any damage: the run starts again, and says why)
        return 0, [], f"{path}: unreadable checkpoint ({type(e).__name__}); restarting this run"


def _metric_lines(path: Path, before_step: int) -> list[str]:
    """The metrics lines of steps < before_step (a line cut short by a crash is dropped)."""
    if not path.exists():
        return []
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] < before_step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    return keep


def read_metrics(run_dir: Path) -> list[dict]:
    """A run's metrics lines (a line cut short is skipped)."""
    out = []
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


@torch.no_grad()
def evaluate(model, data: SplitCorpus, cfg: RunConfig, split: str = "val") -> float:
    """Mean loss in evaluation mode over the split's fixed batches (``val``: the dev split's, or ``train`` for the
    gap)."""
    model.eval()
    total = 0.0
    fixed = data.dev_batches if split == "val" else data.train_eval_batches
    batches = fixed(cfg.eval_batches, cfg.batch, cfg.seq_len)
    device = next(model.parameters()).device
    for x, y in batches:
        total += model(x.to(device), y.to(device))[1].item()
    model.train()
    return total / len(batches)


@torch.no_grad()
def train_eval_gap(model, data: SplitCorpus, cfg: RunConfig) -> dict:
    """What a norm that mixes positions does in a causal LM, measured on validation batches:

    * ``train_mode_val_loss``: the validation loss computed as training computes it (``model.train()``:
      BatchNorm normalizes with the batch's own statistics), beside the eval-mode one the summary reports;
    * ``future_leak``: in training mode, the largest change of any logit in the first half of the sequences
      when the bytes of the second half are replaced -- a causal model must give exactly 0.
    Running statistics are saved and restored around the measurement."""
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    model.train()
    batches = data.dev_batches(cfg.eval_batches, cfg.batch, cfg.seq_len)
    device = next(model.parameters()).device
    train_loss = sum(model(x.to(device), y.to(device))[1].item() for x, y in batches) / len(batches)
    x = batches[0][0].to(device)
    half = x.shape[1] // 2
    other = x.clone()
    other[:, half:] = (x[:, half:] + 1) % 256
    leak = (model(x)[:, :half] - model(other)[:, :half]).abs().max().item()
    for k, v in model.named_buffers():
        v.copy_(buffers[k])
    model.train()
    return {"train_mode_val_loss": train_loss, "future_leak": leak}


def _failure(losses: list[float], persist: int = 1) -> str | None:
    """"nan", "spike" (the last ``persist`` losses each above SPIKE_FACTOR x the mean of the SPIKE_WINDOW steps
    before them) or None. ``persist`` is 1 for the fixed-length presets, whose runs are judged early in training,
    and SPIKE_PERSIST for runs trained until their curve flattens: near the loss floor a single hard batch is 1.5x
    the mean (in ``long``, the post and sandwich seed-0 runs met one at their 7,556th step, post's 1.88 against a
    20-step mean of 1.225, its gradient norm ordinary and validation unmoved), which is data, not divergence."""
    loss = losses[-1]
    if not math.isfinite(loss):
        return "nan"
    if len(losses) > SPIKE_WINDOW + persist - 1:
        recent = losses[-SPIKE_WINDOW - persist:-persist]
        bound = SPIKE_FACTOR * (sum(recent) / len(recent))
        if all(v > bound for v in losses[-persist:]):
            return "spike"
    return None


def _val_curve(lines) -> list[tuple[int, float]]:
    """(steps done, validation loss) of every evaluation in ``lines`` (metrics dicts)."""
    return [(m["step"] + 1, m["val_loss"]) for m in lines if "val_loss" in m]


def _convergence(val_curve: list, plateau: float) -> dict:
    """Whether and when the validation curve (the summary's (step, loss) pairs) flattened below ``plateau``, the
    unigram loss (flat.py's rule)."""
    at = flatten_step([(s + 1, v) for s, v in val_curve], plateau)
    return {"flattened": at is not None, "flatten_step": at}


def _saturation_curve(lines) -> list[list]:
    """[steps done, {slot: fraction saturated}] of every evaluation in ``lines`` (metrics dicts) that measured the
    DyT/Derf saturation; steps counted as ``_val_curve`` counts them."""
    return [[m["step"] + 1, m["saturation"]] for m in lines if "saturation" in m]


def _gain_curve(lines) -> list[list]:
    """[steps done, largest forward composite gain, largest backward] of every evaluation in ``lines`` that
    measured the widened stream's mixing gains."""
    return [[m["step"] + 1, max(m["composite_gain_fwd"]), max(m["composite_gain_bwd"])]
            for m in lines if "composite_gain_fwd" in m]


def grad_profile(lines) -> dict[str, list[float]]:
    """The per-block gradient norms at the first step, step 50 and the last, from a run's metrics lines."""
    if not lines:
        return {}
    return {str(i): lines[i]["layer_grad_norm"] for i in sorted({0, min(len(lines) - 1, 50), len(lines) - 1})}


def _probe_summary(lines: list[dict]) -> dict:
    """The last evaluation's saturation per slot and its largest composite gains, where the run measured them, the
    saturation of every evaluation (``saturation_curve``), the largest gains of every evaluation (``gain_curve``)
    and their peak over training (``peak_composite_gain_fwd/bwd``: HC's gain rises and falls again)."""
    last = next((m for m in reversed(lines) if "saturation" in m or "composite_gain_fwd" in m), None)
    if last is None:
        return {}
    out = {k: last[k] for k in ("saturation", "alpha") if k in last}
    curve = _saturation_curve(lines)
    if curve:
        out["saturation_curve"] = curve
    if "composite_gain_fwd" in last:
        out["max_composite_gain_fwd"] = max(last["composite_gain_fwd"])
        out["max_composite_gain_bwd"] = max(last["composite_gain_bwd"])
        out["gain_curve"] = _gain_curve(lines)
        out.update(_gain_peaks(out["gain_curve"]))
    return out


def _gain_peaks(curve: list[list]) -> dict:
    return {"peak_composite_gain_fwd": max(c[1] for c in curve), "peak_composite_gain_bwd": max(c[2] for c in curve)}


def _backfill(summary: dict, cfg: RunConfig, data: SplitCorpus, run_dir: Path) -> bool:
    """Add to a finished run's summary what it was finished without: the measures added to summary.json since,
    from its checkpoint, validation curve or metrics -- while those files are still there (a results directory
    committed without them, as summary.json and config.json alone, is reused as it stands). True if it grew."""
    before = set(summary)
    split = "final_train_split_loss" not in summary
    gap = "future_leak" not in summary and summary.get("failure") != "nan"
    if (split or gap) and (run_dir / "checkpoint.pt").exists():
        model = _final_model(cfg, run_dir, summary)
        if split:
            summary.update(_train_split(model, data, cfg, summary["final_val_loss"], summary.get("failure"))
                           if model is not None else
                           {"final_train_split_loss": float("nan"), "generalization_gap": float("nan")})
        if gap and model is not None:
            summary.update(train_eval_gap(model, data, cfg))
    if "flattened" not in summary:
        summary.update(_convergence(summary["val_curve"], data.unigram_nats),
                       tokens_seen=summary["steps_done"] * cfg.batch * cfg.seq_len,
                       n_params=sum(p.numel() for p in build_model(cfg).parameters()))
    # (key, what the run measured for it to exist, how it is made from the metrics)
    curves = [("grad_profile", None, grad_profile), ("saturation_curve", "saturation", _saturation_curve),
              ("gain_curve", "max_composite_gain_fwd", _gain_curve)]
    wanted = [(key, make) for key, needs, make in curves if key not in summary and (needs is None or needs in summary)]
    lines = read_metrics(run_dir) if wanted or "last_stream_rms" not in summary else []
    for key, make in wanted:
        value = make(lines) if lines else None
        if value:
            summary[key] = value
    if "last_stream_rms" not in summary:
        summary.update(stream_summary(lines))
    if summary.get("gain_curve") and "peak_composite_gain_fwd" not in summary:
        summary.update(_gain_peaks(summary["gain_curve"]))
    return set(summary) != before


def _train_split(model, data: SplitCorpus, cfg: RunConfig, final_val: float, failure) -> dict:
    """The final training loss measured as the validation loss is (evaluation mode, fixed batches), and the
    generalization gap: validation minus training."""
    train = evaluate(model, data, cfg, split="train") if failure != "nan" else float("nan")
    return {"final_train_split_loss": train, "generalization_gap": final_val - train}


def _final_model(cfg: RunConfig, run_dir: Path, summary: dict) -> GPT | None:
    """For a run finished before a measure was recorded (the training-split loss, BatchNorm's train-mode loss and
    future leak): the model of its final checkpoint, the one the summary's validation loss was measured on; None
    where that checkpoint is missing, damaged or not the final one (not measurable)."""
    model = build_model(cfg).to(_device())
    try:
        final = int(_read_checkpoint(run_dir / "checkpoint.pt", model)["step"]) == summary.get("steps_done")
    except Exception:  # noqa: BLE001  (missing or damaged: not measurable)
        final = False
    return model if final else None


@dataclass
class _Session:
    """One session of a run: the model and optimizer where its checkpoint left them, and what the run did
    before (its losses, its validation curve); what the session adds is appended to them."""
    model: GPT
    net: nn.Module  # the model, or its DistributedDataParallel wrapper under torchrun
    opt: torch.optim.Optimizer
    params: list[nn.Parameter]  # the trained ones, in the optimizer's order
    device: torch.device
    start: int  # the steps already done
    losses: list[float]
    curve: list[tuple[int, float]]  # (steps done, val loss): the stopping rule's input
    ckpt: Path
    metrics_path: Path
    notes: list[str]
    rank: int
    world: int

    @property
    def lead(self) -> bool:
        return self.rank == 0  # the one process that writes


def train_run(cfg: RunConfig, data: SplitCorpus, run_dir: Path, progress=None, task=None,
              on_step=None, tensorboard: Path | None = None) -> dict:
    """Train (or resume, or reuse) one run; returns its summary. ``on_step(step)`` is called after each step;
    ``tensorboard``: a directory to write the metrics into as TensorBoard scalars too (tensorboard.py)."""
    run_dir = Path(run_dir)
    rank, world = rank_and_world()
    if cfg.batch % world:
        raise ValueError(f"batch {cfg.batch} must be divisible by the number of processes ({world})")
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
    if world > 1:
        dist.barrier()
    key = cfg.key(data.digest)
    summary, why = read_json(run_dir / "summary.json")
    notes = [why] if why else []
    if summary is not None and summary.get("key") == key and "final_val_loss" in summary:
        if rank == 0 and _backfill(summary, cfg, data, run_dir):
            atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1, default=list))
        summary["reused"] = True
        return summary
    s = _resume(cfg, data, run_dir, key, notes, rank, world)
    writer = tb.open_writer(Path(tensorboard) / run_dir.name, s.start) if tensorboard is not None and s.lead else None
    t0 = time.perf_counter()
    failure, flat, loop_seconds = _train(cfg, data, s, writer, progress, task, on_step)
    return _finish(cfg, data, run_dir, key, s, failure, flat, loop_seconds, t0)


def _resume(cfg: RunConfig, data: SplitCorpus, run_dir: Path, key: str, notes: list[str], rank: int,
            world: int) -> _Session:
    """The run's config written, its model and optimizer made and brought to its checkpoint (if any), and its
    metrics cut back to the checkpoint's step: a session that goes on where the last one's checkpoint stands."""
    if rank == 0:
        atomic_write_text(run_dir / "config.json", json.dumps({"config": cfg.__dict__, "data_digest": data.digest,
                                                               "key": key}, indent=1, default=list))
    device = _device()
    model = build_model(cfg).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer(params, cfg.lr)
    ckpt = run_dir / "checkpoint.pt"
    start, losses, why = _load_checkpoint(ckpt, model, opt)
    if why:
        notes.append(why)
    metrics_path = run_dir / "metrics.jsonl"
    kept = _metric_lines(metrics_path, start)
    if rank == 0:
        atomic_write_text(metrics_path, "".join(line + "\n" for line in kept))
    curve = _val_curve(json.loads(line) for line in kept)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                                        else None)
    return _Session(model, net, opt, params, device, start, losses, curve, ckpt, metrics_path, notes, rank, world)


def _train(cfg: RunConfig, data: SplitCorpus, s: _Session, writer, progress, task, on_step):
    """The session's steps, each logged (and written to ``writer``, a TensorBoard writer or None), evaluated and
    probed every ``cfg.eval_every`` steps and checkpointed every ``cfg.checkpoint_every``, until the last step, a
    failure or a flattened curve. Returns (failure or None, whether the curve flattened, the loop's seconds)."""
    # one fixed validation batch for probe.py (saturation of DyT/Derf, mixing gains of a widened stream)
    probe_x = data.dev_batches(1, cfg.batch, cfg.seq_len)[0][0] if cfg.bounded or cfg.widened else None
    position = {id(p): i for i, p in enumerate(s.params)}
    blocks = [torch.tensor([position[id(p)] for p in b.parameters() if p.requires_grad]) for b in s.model.h]
    stats, slots = BlockStats(s.model), SlotStats(s.model)
    persist = SPIKE_PERSIST if cfg.until_flat else 1
    failure = _failure(s.losses, persist) if s.losses else None  # a failure before the crash stands
    # so does a flattening: the run had stopped (not on the unigram plateau: see flat.py)
    flat = cfg.until_flat and flatten_step(s.curve, data.unigram_nats) is not None
    s.model.train()
    loop_t0 = time.perf_counter()
    try:
        with open(s.metrics_path if s.lead else os.devnull, "a") as log:
            for step in range(s.start, cfg.steps if failure is None and not flat else s.start):
                slots.active = step < EARLY_STEPS
                line = _step(cfg, data, s, step, blocks, stats)
                if slots.active:
                    line["slot_rms"] = slots.read()
                failure = _failure(s.losses, persist)
                if not failure and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
                    line["val_loss"] = evaluate(s.model, data, cfg)
                    if probe_x is not None:
                        line.update(probe(s.model, probe_x.to(s.device)))
                    s.curve.append((step + 1, line["val_loss"]))
                    flat = cfg.until_flat and flatten_step(s.curve, data.unigram_nats) is not None
                log.write(json.dumps(line) + "\n")
                log.flush()
                if writer is not None:
                    tb.write_line(writer, line)
                if s.lead and (failure or flat or (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps):
                    if writer is not None:  # the events up to the checkpoint on disk before it: a resume purges
                        writer.flush()  # only what comes after, so nothing before it may still be in a queue
                    _save_checkpoint(s.ckpt, s.model, s.opt, step + 1, s.losses)
                if progress is not None and task is not None:
                    progress.update(task, advance=1, loss=f"{s.losses[-1]:.3f}")
                if on_step is not None:
                    on_step(step)
                if failure or flat:
                    break
    finally:
        stats.remove()
        slots.remove()
        if writer is not None:
            writer.close()
    # the training loop: steps, their logging, validations, checkpoints
    return failure, flat, time.perf_counter() - loop_t0


def _step(cfg: RunConfig, data: SplitCorpus, s: _Session, step: int, blocks: list[torch.Tensor],
          stats: BlockStats) -> dict:
    """One optimizer step on this rank's slice of the step's global batch; its loss appended to ``s.losses``.
    Returns its metrics line: loss, lr, gradient norm before clipping, per-block gradient norms, the residual
    stream's per-block RMS and max|x| (``stats``, from this step's forward), update/weight ratio."""
    lr = lr_at(step, cfg.lr, cfg.warmup, cfg.steps)
    for group in s.opt.param_groups:
        group["lr"] = lr
    part = cfg.batch // s.world
    x, y = data.batch(step, cfg.batch, cfg.seq_len, cfg.seed)  # the global batch; this rank's slice
    x, y = x[s.rank * part:(s.rank + 1) * part].to(s.device), y[s.rank * part:(s.rank + 1) * part].to(s.device)
    _, loss = s.net(x, y)
    loss.backward()
    if s.world > 1:  # the global batch's loss: the mean of the ranks' equal-size slices
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        loss /= s.world
    with torch.no_grad():  # one pass over the gradients gives the total and per-block norms
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in s.params]
        norms = torch.stack(torch._foreach_norm(grads))
        total = torch.linalg.vector_norm(norms)
        layer_grad = torch.stack([torch.linalg.vector_norm(norms[i]) for i in blocks]).tolist()
        grad_norm = total.item()  # before clipping
        if cfg.clip > 0:  # torch's clip_grad_norm_ rule, from the norm already computed
            torch._foreach_mul_(grads, torch.clamp(cfg.clip / (total + 1e-6), max=1.0))
        old = torch._foreach_mul(s.params, 1.0)  # the weights before the step (one foreach copy)
        wn = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(old)))
    s.opt.step()
    s.model.normalize_()  # nGPT: weights back on the sphere after every step (nothing otherwise)
    s.opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        torch._foreach_sub_(old, s.params)  # minus the update
        du = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(old)))
        ratio = (du / wn).item() if wn > 0 else 0.0
    s.losses.append(loss.item())
    rms, mx = stats.read()
    return {"step": step, "loss": s.losses[-1], "lr": lr, "grad_norm": grad_norm, "layer_grad_norm": layer_grad,
            "stream_rms": rms, "stream_max": mx, "update_ratio": ratio}


def _finish(cfg: RunConfig, data: SplitCorpus, run_dir: Path, key: str, s: _Session, failure, flat,
            loop_seconds: float, t0: float) -> dict:
    """The run's outcome once its steps are done: the final validation loss (a NaN model or one on the unigram
    plateau failed), the train/eval gap, the probes' summary from the metrics; written as summary.json."""
    if s.world > 1:
        dist.barrier()  # rank 0's metrics are complete
    lines = read_metrics(run_dir)
    vals = [(m["step"], m["val_loss"]) for m in lines if "val_loss" in m]
    held = final_losses(s.model, data, cfg.seq_len, diverged=failure == "nan")  # the test and dev splits whole
    final_val = held["final_val_loss"]
    if failure is None and not math.isfinite(final_val):  # finite training losses, a model that gives NaN on text
        failure = "nan"
    if failure is None and final_val >= data.test_unigram_nats:
        failure = "plateau"
    gap = train_eval_gap(s.model, data, cfg) if failure != "nan" else {}
    gap.update(_train_split(s.model, data, cfg, final_val, failure))
    losses = s.losses
    summary = {"key": key, "name": cfg.name(), "run_dir": str(run_dir), "config": cfg.__dict__,
               "data_digest": data.digest,
               "steps_done": len(losses), "final_train_loss": losses[-1] if losses else float("nan"),
               **held, **gap, "val_curve": vals, "failed": failure is not None, "failure": failure,
               **_convergence(vals, data.unigram_nats), "stopped_flat": bool(flat),
               "tokens_seen": len(losses) * cfg.batch * cfg.seq_len,
               "n_params": sum(p.numel() for p in s.model.parameters()), **_probe_summary(lines),
               "grad_profile": grad_profile(lines), **stream_summary(lines),
               "unigram_nats": data.unigram_nats, "seconds_this_session": time.perf_counter() - t0,
               "loop_seconds_this_session": loop_seconds,
               "notes": s.notes, "reused": False}
    if s.lead:
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=1, default=list))
    if s.world > 1:
        dist.barrier()
    return summary
