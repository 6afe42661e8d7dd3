"""One line of `addnorm check`'s report."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckResult:
    """``ok``: True passed, False failed (a mistake was found), None not judged (the check cannot tell)."""

    name: str
    ok: bool | None
    detail: str = ""
    hint: str = ""


def not_judged(name: str, why: str) -> CheckResult:
    return CheckResult(name, None, why)
