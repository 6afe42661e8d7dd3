"""Text to train and measure on, with nothing to download.

The default corpus is the Python standard library's own source code -- every Python installation
has it -- read as bytes (a 256-symbol vocabulary). ``--data`` points at any file or folder of text
instead. Batches are drawn deterministically from a seed.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".json", ".csv", ".html", ".c", ".h", ".toml", ".cfg", ".ini")


@dataclass(frozen=True)
class Corpus:
    data: torch.Tensor  # (n,) uint8 bytes
    source: str  # where it came from, for reports
    files: int

    @property
    def vocab_size(self) -> int:
        return 256

    def batch(self, batch_size: int, seq_len: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, next-byte targets), each (batch_size, seq_len) int64, from random offsets."""
        if len(self.data) <= seq_len + 1:
            raise ValueError(f"corpus of {len(self.data)} bytes is too short for seq_len={seq_len}")
        starts = torch.randint(0, len(self.data) - seq_len - 1, (batch_size,), generator=generator)
        chunks = torch.stack([self.data[s:s + seq_len + 1] for s in starts.tolist()]).long()
        return chunks[:, :-1], chunks[:, 1:]


def read_files(files: list[Path], max_bytes: int) -> bytes:
    """The files' bytes, concatenated in order, up to max_bytes (unreadable files skipped)."""
    out, total = [], 0
    for f in files:
        try:
            b = f.read_bytes()
        except OSError:
            continue
        out.append(b)
        total += len(b)
        if total >= max_bytes:
            break
    return b"".join(out)[:max_bytes]


def text_files(path: str | Path | None = None) -> tuple[list[Path], str]:
    """(files, source): the standard library's sources (default), or a user's file / folder of text files,
    sorted (the same bytes on every machine run); FileNotFoundError for a path that does not exist."""
    if path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        return (sorted(p for p in root.glob("*.py") if p.is_file()),
                f"Python {sysconfig.get_python_version()} standard library ({root.name}/*.py)")
    root = Path(path)
    if root.is_file():
        return [root], str(root)
    if root.is_dir():
        return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES), str(root)
    raise FileNotFoundError(f"--data {root}: no such file or directory")


def load_corpus(path: str | Path | None = None, max_bytes: int = 4 << 20) -> Corpus:
    """The standard library's sources (default), or a user's file / folder of text files."""
    files, source = text_files(path)
    if not files:
        raise ValueError(f"no text files found under {source}")
    raw = read_files(files, max_bytes)
    if len(raw) < 1024:
        raise ValueError(f"{source} holds only {len(raw)} bytes of text; need at least 1024")
    return Corpus(torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone(), source, len(files))
