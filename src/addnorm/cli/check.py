"""`addnorm check FILE.py:NAME`: ✅/❌ per check with a hint, ➖ where a check cannot judge.

Exit status: 0 every check passed, 1 a check failed or could not be judged, 2 the file could not be loaded or run
(a one-line cause with its file:line), including a time-out. The user's file is imported and run in a child process
(``check_worker``) under ``--timeout``: it is their code, run as ``python FILE`` would run it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.markup import escape

from .output import console as make_console

MARK = {True: "✅", False: "❌", None: "➖"}  # None: not judged (the check cannot tell what it is meant to be)


def _features(s: str) -> int:
    try:
        d = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--features must be an integer, got {s!r}") from None
    if not 2 <= d <= 65536:
        raise argparse.ArgumentTypeError(f"--features must be between 2 and 65536, got {d}")
    return d


def _timeout(s: str) -> float:
    try:
        t = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--timeout must be a number of seconds, got {s!r}") from None
    if not 0 < t <= 3600:
        raise argparse.ArgumentTypeError(f"--timeout must be > 0 and at most 3600 seconds, got {s}")
    return t


def add_arguments(p) -> None:
    p.add_argument("target", help="FILE.py:NAME -- an nn.Module class or instance, a NumPy/torch function, a MAX module")
    p.add_argument("--features", type=_features, default=768, help="feature size to test with (default %(default)s)")
    p.add_argument("--timeout", type=_timeout, default=60.0,
                   help="seconds the file and the checks may take before they are stopped (default %(default)s)")


def run(args) -> int:
    console = make_console(highlight=False)
    spec = args.target
    shown = escape(spec)  # the user's text, printed as written (rich markup and emoji codes are not applied)
    if ":" not in spec:
        console.print(f"❌ could not check {shown}: expected FILE.py:NAME (e.g. my_norm.py:LayerNorm)")
        return 2
    path = Path(spec.rsplit(":", 1)[0])
    if not path.is_file() or path.suffix != ".py":
        why = ("a directory, not a Python file" if path.is_dir() else "no such file" if not path.exists()
               else "not a .py file")
        console.print(f"❌ could not check {shown}: {escape(str(path))}: {why} (expected FILE.py:NAME)")
        return 2
    where = escape(str(path))
    console.print(f"[dim]addnorm check imports {where} and runs its code (as `python {where}` would), in a child "
                  f"process stopped after {args.timeout:g} s.[/dim]")
    with tempfile.TemporaryDirectory(prefix="addnorm-check-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "addnorm.cli.check_worker", spec, str(args.features), str(out)]
        # this interpreter's directory first on PATH: a library that re-executes "python3" (MAX does, once it
        # has set its environment up in the parent) must find this environment's, not another one
        env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        try:
            proc = subprocess.run(cmd, timeout=args.timeout, stdin=subprocess.DEVNULL, env=env)
        except subprocess.TimeoutExpired:
            console.print(f"❌ could not check {shown}: it did not finish within {args.timeout:g} s "
                          "(a forward or constructor that never returns?); raise --timeout if it is only slow")
            return 2
        if not out.is_file():
            how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
            console.print(f"❌ could not check {shown}: the child process running it ended without a result ({how})")
            return 2
        result = json.loads(out.read_text())
    if result["status"] != "ok":
        what = "load" if result["stage"] == "load" else "run"
        console.print(f"❌ could not {what} {shown}: {escape(result['cause'])}  ({escape(result['where'])})")
        return 2
    console.print(f"Checking {shown}: {escape(result['description'])}\n")
    for r in result["results"]:
        detail = f"  [dim]({escape(r['detail'])})[/dim]" if r["detail"] else ""
        console.print(MARK[r["ok"]] + " " + escape(r["name"]) + detail)
        if r["ok"] is False and r["hint"]:
            console.print(f"   Hint: {escape(r['hint'])}")
    failed = sum(r["ok"] is False for r in result["results"])
    unjudged = sum(r["ok"] is None for r in result["results"])
    if not failed and not unjudged:
        console.print("\n🎉 All checks passed!")
    else:
        said = [f"{failed} check(s) failed" if failed else "", f"{unjudged} not judged" if unjudged else ""]
        console.print("\n⚠️  " + ", ".join(w for w in said if w) + (". Review the hints above." if failed else "."))
    return 1 if failed or unjudged else 0
