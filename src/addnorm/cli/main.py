"""`addnorm` -- the command-line entry point.

Parsing comes first and imports only the module of the command that runs: ``addnorm --help`` and
``addnorm --version`` load no torch, and each command loads what it needs when it runs."""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap

from .. import __version__
from .output import RESULTS
from .seeds import mentioned, seeds_text

# name -> the one line `addnorm --help` shows; each command's options and its run() are in addnorm/cli/<name>.py
COMMANDS = {
    "tour": "every Add & Norm demonstration, measured, as an HTML report",
    "trace": "seed 001's step-by-step LayerNorm calculation, in pure Python (the seeds: addnorm --help)",
    "check": "validate your own LayerNorm / RMSNorm / residual implementation",
    "gradflow": "measure gradient flow vs depth for several placements",
    "bench": "benchmark the fused Add & Norm kernels",
    "study": "train a grid of models: placements x norms x depth x lr x warmup x seed",
}

EPILOG = textwrap.fill(f"Commands that write results (tour, gradflow, bench, study) write them under "
                       f"./{RESULTS}/COMMAND in the current directory, or where --out says; none writes into "
                       "addnorm's own folders unless --out names them.", 79) + "\n\n" + seeds_text()


class _DefaultsFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already says it; the epilog as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower():
            return text
        return super()._get_help_string(action)

    def _split_lines(self, text, width):  # never inside a path or an option name (./addnorm-results, --seq-len)
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def command_module(name: str):
    return importlib.import_module(f"{__package__}.{name}")


def build_parser(commands=None) -> argparse.ArgumentParser:
    """Every command's options, or only those of the commands named in ``commands`` (the others listed by name and
    help line, their modules not imported)."""
    p = argparse.ArgumentParser(prog="addnorm", description="Residual connections and normalization layers, measured.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"addnorm {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, line in COMMANDS.items():
        seeds = mentioned(line)  # a seed named in the line is said in full on the command's own help
        sp = sub.add_parser(name, help=line, description=line, formatter_class=_DefaultsFormatter,
                            epilog=seeds_text(seeds) if seeds else None)
        if commands is None or name in commands:
            command_module(name).add_arguments(sp)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the command is the first word that is not an option (the top level's options take no value)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser({chosen}).parse_args(argv)
    try:
        return int(command_module(args.command).run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback; what finished is journalled or checkpointed
        print(f"\naddnorm {args.command}: interrupted; run the same command again to resume where it stopped"
              if args.command in ("study", "gradflow", "bench") else f"\naddnorm {args.command}: interrupted",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
