"""The child process of `addnorm check`: imports the user's file, runs the checks, writes JSON.

    python -m addnorm.cli.check_worker TARGET FEATURES RESULT_JSON

Runs apart from the command so that a file that never returns, calls ``sys.exit`` or crashes the
interpreter cannot take the command with it. The user's own prints go to the terminal as they would;
the result goes to RESULT_JSON only.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path


def _where(e: BaseException, path: Path) -> str:
    """file:line of the deepest frame in the user's file (or of a SyntaxError), else of the deepest frame."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if Path(f.filename).resolve() == path]
    f = (mine or frames or [None])[-1]
    return f"{f.filename}:{f.lineno}" if f else str(path)


def _cause(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _extra_adapters(target):
    from ..check.adapters import is_max_module

    if not is_max_module(target):
        return ()
    from ..max.check_adapter import adapt_max  # the command layer may import both check/ and max/

    return ((is_max_module, adapt_max),)


def work(target_spec: str, features: int) -> dict:
    from ..check import check_target, load_target

    path = Path(target_spec.rsplit(":", 1)[0]).resolve()
    stage = "load"
    try:
        target = load_target(target_spec)
        stage = "run"
        adapted, results = check_target(target, features, _extra_adapters(target))
    except SystemExit as e:
        return {"status": "error", "stage": stage, "cause": f"the code called sys.exit({e.code!r})",
                "where": _where(e, path)}
    except BaseException as e:  # noqa: BLE001  (anything the user's code raises is reported, not re-raised)
        return {"status": "error", "stage": stage, "cause": _cause(e), "where": _where(e, path)}
    return {"status": "ok", "description": adapted.description,
            "results": [{"name": r.name, "ok": None if r.ok is None else bool(r.ok), "detail": r.detail, "hint": r.hint} for r in results]}


def main(argv: list[str]) -> int:
    target, features, out = argv
    result = work(target, int(features))
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
