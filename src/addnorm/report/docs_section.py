"""A generated section of a markdown file: the text between a start and an end marker, replaced whole (or put
before a given line, or appended, where the file has no markers yet), written only when it changed."""

from __future__ import annotations

from pathlib import Path

from ..harness.store import atomic_write_text


def replace_section(path: Path, start: str, end: str, section: str, before: str | None = None) -> bool:
    """Put ``section`` (which begins with ``start`` and ends with ``end``) in place of the file's text from
    ``start`` to ``end``; where the markers are absent, before the line ``before`` (if the file has it), else at
    the end. True when the file changed."""
    if not (section.startswith(start) and section.rstrip("\n").endswith(end)):
        raise ValueError(f"section: must begin with {start!r} and end with {end!r}")
    text = Path(path).read_text(encoding="utf-8")
    section = section.rstrip("\n")
    if start in text and end in text:
        new = text[:text.index(start)] + section + text[text.index(end) + len(end):]
    elif before is not None and before in text:
        i = text.index(before)
        new = text[:i] + section + "\n\n" + text[i:]
    else:
        new = text.rstrip("\n") + "\n\n" + section + "\n"
    if new != text:
        atomic_write_text(Path(path), new)
    return new != text
