"""Training a tokenizer on text files into a directory that `tokenizer.path` loads (`attn tokenizer train`).

The inputs are text files, one text per line (gzipped when the name ends in `.gz`), directories (every file below
them) and glob patterns (`attn.data.files.input_files`). They are read line by line as the trainer asks for them,
never whole. With `fields`, every input is a table instead (TSV, CSV or JSON Lines, `attn.data.readers`) and the
texts are the values of those fields, one table in memory at a time (a joint source-target vocabulary: the source
and the target field). A line keeps its line end, so a tokenizer trained on a text file also has a token for its
line breaks (what a language model trained on the same file needs). The directory is written atomically: an
interrupted run leaves no directory, or the one that was there before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from attn.core.errors import ConfigError
from attn.data.file_formats import resolve_format
from attn.data.files import input_files, write_directory
from attn.data.readers import read_table
from attn.data.text import iter_lines
from attn.data.tokenizer_files import META_FILE
from attn.data.tokenizers import Tokenizer

FAULT_POINT = "tokenizer-write"


@dataclass(frozen=True)
class TrainedTokenizer:
    """What `train_tokenizer_files` made.

    Attributes:
        output: the directory it was written to.
        files: the files it was trained on.
        lines: how many lines (or table values) they had.
    """

    tokenizer: Tokenizer
    output: Path
    files: tuple[Path, ...]
    lines: int


class _Lines:
    """The lines of some files, one at a time, counted as they are read."""

    def __init__(self, files: Sequence[Path], fields: Sequence[str] = ()) -> None:
        self.files = tuple(files)
        self.fields = tuple(fields)
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        for path in self.files:
            for line in self._texts(path):
                self.count += 1
                yield line

    def _texts(self, path: Path) -> Iterator[str]:
        if not self.fields:
            yield from iter_lines(path)
            return
        if resolve_format(path) == "text":
            raise ConfigError("field", f"{path} is not a table (.tsv, .csv, .jsonl, optionally .gz); --field "
                                       "reads the named fields of tables: leave it out for text files")
        table = read_table(path, {f"--field {name}": name for name in self.fields})
        for values in table.values.values():
            yield from values


def train_tokenizer_files(
    kind: str, inputs: Sequence[str], vocab_size: int, output: str | Path, force: bool = False, lowercase: bool = True,
    fields: Sequence[str] = (),
) -> TrainedTokenizer:
    """Trains a tokenizer of `kind` on the lines of `inputs` and writes it to `output` (`Tokenizer.save`).

    Args:
        kind: one of `attn.data.tokenizer_kinds.TRAINED_KINDS`.
        inputs: text files, directories and glob patterns.
        vocab_size: the vocabulary size, special tokens included (`chars` has its own).
        output: the directory to write; `Tokenizer.load` and a run config's `tokenizer.path` read it.
        force: replace `output` when it is a tokenizer directory already.
        lowercase: `wordpiece` only: lower-case and strip accents.
        fields: read these fields of table inputs (TSV, CSV, JSON Lines) instead of lines of text files.

    Raises:
        ConfigError: an unknown kind, a vocabulary below the kind's minimum, no input file, no text, or an output
            directory that is in the way.
        DataFormatError: an input file that is not UTF-8 text (names the file and line).
    """
    folder = Path(output)
    _check_output(folder, force)  # before anything is read
    lines = _Lines(input_files(inputs), fields)
    tokenizer = Tokenizer.train(kind, lines, vocab_size, lowercase)
    write_directory(folder, tokenizer.save, FAULT_POINT)
    return TrainedTokenizer(tokenizer, folder, lines.files, lines.count)


def _check_output(folder: Path, force: bool) -> None:
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ConfigError("output", f"{folder} is a file; give a directory path for the tokenizer")
    if not any(folder.iterdir()):
        return
    if not (folder / META_FILE).is_file():
        raise ConfigError("output", f"{folder} exists and holds files that are not a tokenizer; give a new or "
                                    "empty directory (--force replaces only a tokenizer directory)")
    if not force:
        raise ConfigError("output", f"{folder} already holds a tokenizer; give a new directory, or replace it "
                                    "with --force")
