"""MAX's runtime leaves the process environment as it found it.

Importing MAX's Python API starts its Mojo runtime, which writes ``PYTHONEXECUTABLE`` and ``PYTHONPATH`` into
the C-level environment (not into ``os.environ``). Every child process inherits them: a child started as
``.venv/bin/python`` then believes it is the base interpreter the variable names, leaves the virtual
environment and no longer finds the packages installed there. ``restored`` puts both back as ``os.environ``
still holds them (or removes them where the user had not set them).
"""

from __future__ import annotations

import contextlib
import os

# the variables the runtime writes that change what a child Python process is
LEAKED = ("PYTHONEXECUTABLE", "PYTHONPATH")


@contextlib.contextmanager
def restored(names: tuple[str, ...] = LEAKED):
    """Run the body, then set each of ``names`` in the C-level environment back to its ``os.environ`` value."""
    try:
        yield
    finally:
        for name in names:
            if name in os.environ:
                os.putenv(name, os.environ[name])
            else:
                os.unsetenv(name)
