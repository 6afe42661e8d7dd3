"""The study's text, split by file into training, dev and test (never bytes of one file in two splits), with
batches drawn from the step number alone: a resumed run draws exactly the batches an uninterrupted one would.

- **test**: the held-out bytes every final loss is measured on -- the same ``test_bytes`` predicted bytes (262,144
  by default: ``TEST_BYTES``) for every run, read whole as non-overlapping sequences (``heldout.py``), and never
  read by any decision;
- **dev** (the validation split of the metrics: ``val_loss``, ``val_curve``): what every decision reads -- the
  evaluations during training (fixed random batches), the stopping rule of ``until_flat`` (flat.py) and the choice
  of a learning rate (claims.py, on the dev loss at the end, read whole as the test split is);
- **train**: every other file, capped at ``max_bytes``.

The held-out files are every ``held_out_every``-th file (sorted by path; every 10th by default; the last two of a
folder with fewer files). Test takes them in
that order until it holds ``test_bytes + 1`` bytes (the bytes predicted and the context of the first), dev the next
ones until it holds ``dev_bytes + 1``; a held-out file neither needs is training text. The last file of the test
(dev) split may be cut at the split's size; its rest is read by no split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ...harness.corpus import read_files, text_files
from ...harness.store import digest

TEST_BYTES = 262_144  # 256 KiB: the held-out bytes of every final loss; the claims file judges nothing on fewer
DEV_BYTES = 65_536  # 64 KiB: the dev loss at the end, which picks a claim's learning rates
HELD_OUT_EVERY = 10
MAX_TRAIN_BYTES = 4 << 20  # 4 MiB: the training split's cap (the rest of the training files is read by no split)
MIN_DEV_BYTES = 1024  # below this the dev split cannot hold an evaluation batch worth the name


class SplitError(ValueError):
    """A corpus too small for the splits asked of it; ``argument`` names what to change (``test_bytes``, ...)."""

    def __init__(self, argument: str, message: str):
        super().__init__(message)
        self.argument = argument


@dataclass(frozen=True)
class SplitCorpus:
    train: torch.Tensor  # uint8 bytes
    dev: torch.Tensor  # dev_bytes + 1 bytes
    test: torch.Tensor  # test_bytes + 1 bytes
    source: str
    train_files: tuple[str, ...]  # the files of each split, as paths relative to the corpus's folder
    dev_files: tuple[str, ...]
    test_files: tuple[str, ...]
    digest: str  # content hash of the three splits
    unigram_nats: float  # the dev split's cross-entropy under the training split's byte frequencies: the plateau
    #                      of the curves and of the stopping rule
    test_unigram_nats: float  # the same on the test split: the plateau of the final loss (a run at or above it failed)

    @property
    def val_bytes(self) -> int:
        """The bytes each final (test) loss predicts."""
        return len(self.test) - 1

    @property
    def dev_bytes(self) -> int:
        """The bytes the dev loss at the end predicts."""
        return len(self.dev) - 1

    def batch(self, step: int, batch: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return _take(self.train, batch, seq_len, g)

    def dev_batches(self, n: int, batch: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed random batches of the dev split: the evaluations during training."""
        g = torch.Generator().manual_seed(12345)
        return [_take(self.dev, batch, seq_len, g) for _ in range(n)]

    def train_eval_batches(self, n: int, batch: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed batches of the training split, to measure the training loss as the dev loss is measured
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


def _fill(files: list[Path], size: int) -> tuple[list[Path], bytes]:
    """The first of ``files`` whose bytes, concatenated in order, reach ``size`` (all of them when they do not), and
    those bytes cut at ``size``."""
    taken, chunks, got = [], [], 0
    for f in files:
        if got >= size:
            break
        b = f.read_bytes()
        taken.append(f)
        chunks.append(b)
        got += len(b)
    return taken, b"".join(chunks)[:size]


def _tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()


def _unigram(train: torch.Tensor, held: torch.Tensor) -> float:
    """The cross-entropy of the predicted bytes of ``held`` under the training split's byte frequencies (add-one):
    what a model that learned only byte frequencies scores."""
    counts = torch.bincount(train.long(), minlength=256).double() + 1.0
    logp = (counts / counts.sum()).log()
    return -logp[held[1:].long()].mean().item()


def _check_int(name: str, v, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise SplitError(name, f"{name} must be an integer >= {lo}, got {v!r}")


def load_split(path: str | Path | None = None, max_bytes: int = MAX_TRAIN_BYTES, test_bytes: int = TEST_BYTES,
               dev_bytes: int = DEV_BYTES, held_out_every: int = HELD_OUT_EVERY) -> SplitCorpus:
    """The corpus at ``path`` (a folder of text files; default: the Python standard library's ``*.py``) split by
    file into training, dev and test (see the module's docstring). ``SplitError`` naming ``test_bytes`` or
    ``dev_bytes`` where the held-out files are too few for them, with how many bytes they hold and need."""
    for name, v, lo in (("test_bytes", test_bytes, 1), ("dev_bytes", dev_bytes, MIN_DEV_BYTES),
                        ("held_out_every", held_out_every, 2), ("max_bytes", max_bytes, 1)):
        _check_int(name, v, lo)
    files, source = _files(path)
    if len(files) < 3:
        raise SplitError("data", f"{source}: {len(files)} text files; need at least 3 to split into training, dev "
                                 "and test by file")
    held = files[held_out_every - 1::held_out_every] or files[-2:]
    test_f, test = _fill(held, test_bytes + 1)
    held_bytes = sum(f.stat().st_size for f in held)
    if len(test) < test_bytes + 1:
        raise SplitError("test_bytes", f"{source}: the held-out files (one file in {held_out_every}, {len(held)} of "
                                       f"{len(files)}) hold {held_bytes:,} bytes; a test split of {test_bytes:,} "
                                       f"bytes needs {test_bytes + 1:,}, and the dev split {dev_bytes + 1:,} more. "
                                       f"Give more text, or a smaller test split (--test-bytes; the claims file "
                                       f"judges no run measured on fewer than {TEST_BYTES:,} bytes)")
    dev_f, dev = _fill(held[len(test_f):], dev_bytes + 1)
    if len(dev) < dev_bytes + 1:
        raise SplitError("dev_bytes", f"{source}: after the test split's {len(test_f)} files the held-out files "
                                      f"hold {len(dev):,} bytes; the dev split needs {dev_bytes + 1:,}. Give more "
                                      f"text, or a smaller test split (--test-bytes)")
    taken = set(test_f) | set(dev_f)
    train_f = [f for f in files if f not in taken]
    train = read_files(train_f, max_bytes)
    if len(train) < 4096:
        raise SplitError("data", f"{source}: {len(train):,} training bytes; need 4,096")
    t, d, v = _tensor(train), _tensor(dev), _tensor(test)
    root = Path(path) if path is not None else files[0].parent
    names = [tuple(str(f.relative_to(root)) for f in part) for part in (train_f, dev_f, test_f)]
    sizes = f"{len(train)},{len(dev)},{len(test)}".encode()  # the lengths first: three splits, one hash
    return SplitCorpus(t, d, v, source, *names, digest(sizes + b"\0" + train + dev + test), _unigram(t, d),
                       _unigram(t, v))


def lr_at(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to lr / 10 at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))
