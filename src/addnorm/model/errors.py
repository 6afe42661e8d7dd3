"""GPTConfig's error, and the wording its messages share (the config and each regime raise it)."""

from __future__ import annotations

from .placement import Placement


class ConfigError(ValueError):
    """A bad GPTConfig field; the message starts with the field's name."""


def spec_name(spec) -> str:
    """The placement as the user gave it, for messages: 'mix', 'hybrid_star', or each layer's name."""
    if isinstance(spec, str):
        return repr(spec)
    if isinstance(spec, Placement):
        return repr(spec.name)
    return repr([p if isinstance(p, str) else p.name for p in spec])


def refuse_unless_default(config, field: str, default, needs: str) -> None:
    """A field that this model would not read: refused at any value but its default (which nothing reads either)."""
    v = getattr(config, field)
    if v != default:
        raise ConfigError(f"{field}={v!r} needs {needs}; placement {spec_name(config.placement)} does not read it")
