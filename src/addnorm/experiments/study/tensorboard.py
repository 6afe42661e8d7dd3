"""The per-step metrics of a study run as TensorBoard scalars (``addnorm study --tensorboard DIR``), beside the
JSONL that stays the record: one event directory per run, named as the run's directory is, so a TensorBoard
pointed at DIR compares runs as litgpt's and torchtitan's logs do. A resumed run opens its writer with
``purge_step`` at the checkpoint's step, so TensorBoard drops the events the crash left after it."""

from __future__ import annotations

from pathlib import Path

MISSING = ("needs the tensorboard package (torch.utils.tensorboard writes through it): "
           "pip install tensorboard, or the addnorm[tensorboard] extra")


def available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def open_writer(log_dir: Path, purge_step: int):
    """A ``SummaryWriter`` for one run; raises ImportError with ``MISSING`` when the package is absent."""
    if not available():
        raise ImportError(MISSING)
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step if purge_step > 0 else None)


def scalars(line: dict) -> dict[str, float]:
    """A metrics line as TensorBoard tags: scalars as they are, per-block lists as ``name/block_i``, per-slot
    dicts as ``name/slot``, nested as deep as the line nests them (a slot's per-layer list: ``name/slot/block_i``)."""
    out = {}
    for k, v in line.items():
        if k != "step":
            _flatten(k, v, out)
    return out


def _flatten(tag: str, v, out: dict[str, float]) -> None:
    if isinstance(v, list):
        for i, x in enumerate(v):
            _flatten(f"{tag}/block_{i}", x, out)
    elif isinstance(v, dict):
        for s, x in v.items():
            _flatten(f"{tag}/{s}", x, out)
    elif isinstance(v, int | float) and not isinstance(v, bool):
        out[tag] = float(v)


def write_line(writer, line: dict) -> None:
    for tag, value in scalars(line).items():
        writer.add_scalar(tag, value, global_step=line["step"])
