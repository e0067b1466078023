"""The error hierarchy of `attn`.

Every error a user can cause derives from `AttnError`. Messages say what was wrong, where (field, file and line,
tensor shape) and what to do about it; the CLI prints them on one line and exits non-zero without a traceback. An
error about one setting carries its name in `field`, so the CLI can name the flag and the server the request field
without reading the message.
"""

from __future__ import annotations


class AttnError(Exception):
    """Base class of every error `attn` raises for a user's mistake.

    Attributes:
        field: the setting at fault (a config field, a function's argument), or None; the message then reads
            "field: message".
        detail: the message without the field's name: what was wrong and what to do.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        self.detail = message
        super().__init__(f"{field}: {message}" if field else message)


class ConfigError(AttnError, ValueError):
    """An invalid setting: a model or run configuration's unknown preset, bad field value or bad
    combination, a command-line option or a request field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field)


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


class ChatTemplateError(AttnError, ValueError):
    """A chat template that cannot be compiled, or that fails on a conversation: the template refused it
    (`raise_exception`), broke a rule of the sandbox it runs in, or ran past its time limit."""


class TextError(AttnError, ValueError):
    """Text that is not valid Unicode: it holds a lone surrogate, from an unpaired JSON escape (`"\\ud800"`) or from
    bytes that are not UTF-8 (Python decodes command-line arguments and the terminal's input with `surrogateescape`,
    so byte 0xE9 arrives as U+DCE9). Names the field and the character."""
