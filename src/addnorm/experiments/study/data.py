"""The study's text, split into training and validation by file (never by bytes of one file), with batches
drawn from the step number alone: a resumed run draws exactly the batches an uninterrupted one would."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ...harness.corpus import read_files, text_files
from ...harness.store import digest


@dataclass(frozen=True)
class SplitCorpus:
    train: torch.Tensor  # uint8 bytes
    val: torch.Tensor
    source: str
    train_files: int
    val_files: int
    digest: str  # content hash of both splits
    unigram_nats: float  # validation cross-entropy of the training split's byte frequencies: the plateau

    def batch(self, step: int, batch: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return _take(self.train, batch, seq_len, g)

    def val_batches(self, n: int, batch: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(12345)
        return [_take(self.val, batch, seq_len, g) for _ in range(n)]

    def train_eval_batches(self, n: int, batch: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed batches of the training split, to measure the training loss as the validation loss is measured
        (evaluation mode, the same number of batches): their difference is the generalization gap."""
        g = torch.Generator().manual_seed(54321)
        return [_take(self.train, batch, seq_len, g) for _ in range(n)]


def _take(data, batch, seq_len, g):
    if len(data) <= seq_len + 1:
        raise ValueError(f"{len(data)} bytes are too few for sequences of {seq_len}")
    starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=g)
    chunk = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).long()
    return chunk[:, :-1], chunk[:, 1:]


def _files(path: str | Path | None) -> tuple[list[Path], str]:
    if path is not None and Path(path).is_file():
        raise ValueError(f"--data {path}: a single file cannot be split by file; give a folder of text files")
    return text_files(path)


def load_split(path: str | Path | None = None, max_bytes: int = 4 << 20, val_every: int = 10) -> SplitCorpus:
    """Every ``val_every``-th file (sorted by path) is validation, the rest training."""
    files, source = _files(path)
    if len(files) < 2:
        raise ValueError(f"{source}: need at least 2 text files to split into training and validation")
    val_f = files[val_every - 1::val_every] or files[-1:]
    train_f = [f for f in files if f not in set(val_f)]
    train, val = read_files(train_f, max_bytes), read_files(val_f, max(max_bytes // 8, 1 << 16))
    if len(train) < 4096 or len(val) < 1024:
        raise ValueError(f"{source}: {len(train)} training and {len(val)} validation bytes; need 4096 and 1024")
    t, v = torch.frombuffer(bytearray(train), dtype=torch.uint8).clone(), torch.frombuffer(bytearray(val),
                                                                                          dtype=torch.uint8).clone()
    counts = torch.bincount(t.long(), minlength=256).double() + 1.0
    logp = (counts / counts.sum()).log()
    unigram = -logp[v.long()].mean().item()
    return SplitCorpus(t, v, source, len(train_f), len(val_f), digest(train + b"\0" + val), unigram)


def lr_at(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to lr / 10 at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))
