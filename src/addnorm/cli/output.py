"""The commands' terminal output: rich consoles that never turn a user's text into markup or emoji (a path with
``[bold]`` or ``:x:`` in it prints as written), and the one-line error every command gives for a bad argument."""

from __future__ import annotations

from rich.console import Console


def console(**kw) -> Console:
    """A console whose own markup works (``[bold]``) but never invents emoji from ``:name:`` codes; text from a
    user still goes through ``rich.markup.escape``."""
    return Console(emoji=False, **kw)


def error(command: str, message: str) -> int:
    """Print ``addnorm COMMAND: error: MESSAGE`` to stderr, exactly as written, and return exit status 2."""
    Console(stderr=True, emoji=False, markup=False, highlight=False).print(f"addnorm {command}: error: {message}",
                                                                           soft_wrap=True)
    return 2
