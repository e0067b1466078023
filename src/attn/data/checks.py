"""The range check that the data layer's settings share, so that every such error reads alike."""

from __future__ import annotations

from attn.core.errors import ConfigError


def check_at_least(name: str, value: int, minimum: int) -> None:
    """Raise a `ConfigError` naming `name` when `value` is below `minimum`."""
    if value < minimum:
        raise ConfigError(name, f"is {value}, must be at least {minimum}; raise it")
