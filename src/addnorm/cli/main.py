"""`addnorm` -- the command-line entry point."""

from __future__ import annotations

import argparse
import sys

from . import bench as bench_cmd
from . import check as check_cmd
from . import gradflow as gradflow_cmd
from . import study as study_cmd
from . import tour as tour_cmd
from . import trace as trace_cmd

COMMANDS = {"tour": tour_cmd, "trace": trace_cmd, "check": check_cmd, "gradflow": gradflow_cmd, "bench": bench_cmd,
            "study": study_cmd}


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower():
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="addnorm", description="Residual connections and normalization layers, measured.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, mod in COMMANDS.items():
        mod.add_parser(sub)
    for sp in sub.choices.values():
        sp.formatter_class = _DefaultsFormatter
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(COMMANDS[args.command].run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback; what finished is journalled or checkpointed
        print(f"\naddnorm {args.command}: interrupted; run the same command again to resume where it stopped"
              if args.command in ("study", "gradflow", "bench") else f"\naddnorm {args.command}: interrupted",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
