"""The error hierarchy of `attn`.

Every error a user can cause derives from `AttnError`. Messages say what was wrong, where
(field, file and line, tensor shape) and what to do about it; the CLI prints them on one line
and exits non-zero without a traceback.
"""

from __future__ import annotations


class AttnError(Exception):
    """Base class of every error `attn` raises for a user's mistake."""


class ConfigError(AttnError, ValueError):
    """An invalid model or run configuration: unknown preset, bad field value, bad combination."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class DataFormatError(AttnError, ValueError):
    """A malformed data file. Names the file, the line (1-based, when known) and the fix."""

    def __init__(self, path: str, message: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class ShapeError(AttnError, ValueError):
    """A tensor given to a model or function has the wrong shape or dtype."""


class CheckpointError(AttnError, ValueError):
    """A checkpoint that cannot be loaded: missing file, unknown/missing/mis-shaped key, wrong model."""


class GenerationError(AttnError, ValueError):
    """Invalid decoding arguments (temperature, top-p, beam size, length beyond the model's positions)."""


class TrainingError(AttnError):
    """Training cannot go on: a non-finite loss or gradient, or an update without targets."""
