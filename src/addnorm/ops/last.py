"""Which backend ran the most recent addnorm call (``addnorm.last_backend``). The functional layer writes the
backend it picks; an operator's kernel implementation that declines a call and runs the formulas instead (rows
longer than a Triton block, a dtype mix the kernels do not take) says so with ``declined``."""

LAST: dict = {"backend": None}


def declined() -> None:
    """The call ran on the torch formulas, whichever backend was picked."""
    LAST["backend"] = "torch"
