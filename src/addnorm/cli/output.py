"""The commands' terminal output: rich consoles that never turn a user's text into markup or emoji (a path with
``[bold]`` or ``:x:`` in it prints as written), the one-line error every command gives for a bad argument, and
where results go by default. rich is imported when a command prints, not when ``addnorm --help`` parses."""

from __future__ import annotations

# every command that writes results writes them under ./addnorm-results/COMMAND unless --out says otherwise:
# relative to the current directory, never to addnorm's own folders (a clone's committed results stay as they are)
RESULTS = "addnorm-results"


def results_dir(command: str) -> str:
    return f"{RESULTS}/{command}"


def out_help(what: str) -> str:
    """The help of a command's --out: what it holds, and the default's place (the current directory)."""
    return f"{what} (default: ./%(default)s, in the current directory)"


def add_out(p, command: str, what: str) -> None:
    p.add_argument("--out", default=results_dir(command), help=out_help(what))


def console(**kw):
    """A console whose own markup works (``[bold]``) but never invents emoji from ``:name:`` codes; text from a
    user still goes through ``rich.markup.escape``."""
    from rich.console import Console

    return Console(emoji=False, **kw)


def error(command: str, message: str) -> int:
    """Print ``addnorm COMMAND: error: MESSAGE`` to stderr, exactly as written, and return exit status 2."""
    from rich.console import Console

    Console(stderr=True, emoji=False, markup=False, highlight=False).print(f"addnorm {command}: error: {message}",
                                                                           soft_wrap=True)
    return 2
