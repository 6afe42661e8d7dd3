"""Result files that survive interruption: atomic writes, content hashes, corrupt files named and redone."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` a temporary file beside ``path``, fsync it, rename it over ``path``, fsync the directory:
    after a crash at any moment, or beside another process writing the same file (shards that share a
    directory), ``path`` holds one whole version, never part of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # a directory that cannot be opened (some filesystems): the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def read_json(path: Path) -> tuple[dict | None, str | None]:
    """(content, None), or (None, why) for a file that is missing, truncated or not a JSON object."""
    path = Path(path)
    if not path.exists():
        return None, None
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{path}: unreadable or truncated ({type(e).__name__}: {e}); redoing it"
    if not isinstance(d, dict):
        return None, f"{path}: not a JSON object; redoing it"
    return d, None


def read_journal(path: Path | None, parse) -> list:
    """``parse(record)`` of each line of a JSON-lines journal (an interrupted run's finished work), in order; a
    line that is not JSON or that ``parse`` refuses (ValueError, TypeError, KeyError) is skipped: the line an
    interruption cut short. A missing journal (or None) reads as empty."""
    out = []
    if path is None or not Path(path).exists():
        return out
    for line in Path(path).read_text().splitlines():
        try:
            out.append(parse(json.loads(line)))
        except (TypeError, ValueError, KeyError):
            continue  # a line cut short by the interruption
    return out


def digest(data: bytes) -> str:
    """A short content hash: what cache keys use instead of a path."""
    return hashlib.sha256(data).hexdigest()[:16]


def check_writable_dir(path: Path) -> None:
    """Create ``path`` if needed and prove a file can be written there; OSError with the path otherwise."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise OSError(f"{path} is not a writable directory ({e.strerror or e})") from None
