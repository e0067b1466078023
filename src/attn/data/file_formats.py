"""The data-file formats `attn.data.readers` reads, one parser each: a file's rows, before any field is picked.

Formats (chosen from the file name, `.gz` stripped, unless `attn.data.readers.Fields.format` names one):

| format | file name | fields |
| --- | --- | --- |
| `tsv` | `*.tsv` | a header line names the fields; rows split on tabs only, never quoted (texts may hold `"`) |
| `csv` | `*.csv` | a header row names the fields; the `csv` module's dialect: `,` and `"`-quoted fields |
| `jsonl` | `*.jsonl`, `*.json` | one JSON object per line; the fields read must be strings |
| `text` | anything else | a path prefix: field `de` of `corpus/train` is the file `corpus/train.de` (as in fairseq) |
| `chat` | named only | JSON Lines of conversations, read by `attn.data.chat_data` for the language model |

Every file may be gzipped (`x.tsv.gz`, `train.de.gz`) and is read whole through `attn.data.text.read_text`; a
`\\r` before a line end is dropped, and a line over `max_line_chars` is an error. Blank lines (blank in every
file, for `text`) are skipped and counted.

A defect of the file's structure is a `DataFormatError` naming the file, the 1-based line and the fix: a header
naming a field twice, a ragged row, a line that is not a JSON object, line-aligned files of different lengths, a
missing file. The fields' values are checked by `attn.data.readers`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attn.core.errors import DataFormatError
from attn.data.text import read_text
from attn.shipped import locate

FORMATS = ("auto", "tsv", "csv", "jsonl", "text", "chat")  # chat: conversations (attn.data.chat_data)
_SUFFIXES = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


def resolve_format(path: str | Path, chosen: str = "auto") -> str:
    """The format of `path`: `chosen` unless it is "auto", else the one its name ends in."""
    if chosen != "auto":
        return chosen
    return _SUFFIXES.get(Path(Path(path).name.removesuffix(".gz")).suffix.lower(), "text")


@dataclass
class Records:
    """A whole file's rows, before the wanted fields are picked.

    Attributes:
        path: the file read (the prefix, for `text`).
        header: the field names of a TSV or CSV file; None for JSON Lines and text files.
        rows: (1-based line, field name -> value) of every row that is not blank.
        skipped_blank: blank lines skipped.
        files: field -> the file that holds it, for `text`; empty for a table.
    """

    path: str
    header: tuple[str, ...] | None
    rows: list[tuple[int, dict[str, Any]]]
    skipped_blank: int
    files: dict[str, str] = dataclasses.field(default_factory=dict)


def read_records(path: str, fmt: str, max_line_chars: int) -> Records:
    """The rows of a table: a `tsv`, `csv` or `jsonl` file."""
    lines = _lines(path, max_line_chars)
    if fmt == "jsonl":
        return _read_jsonl(path, lines)
    if not lines:
        raise DataFormatError(path, "the file is empty; it must start with the header line naming its fields", 1)
    return _read_tsv(path, lines) if fmt == "tsv" else _read_csv(path, lines)


def _lines(path: str, max_line_chars: int) -> list[str]:
    """The lines of a text file without their ends (`\\n` or `\\r\\n`), each within `max_line_chars`."""
    lines = [line.removesuffix("\r") for line in read_text(path).split("\n")]
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    for number, line in enumerate(lines, start=1):
        if len(line) > max_line_chars:
            raise DataFormatError(
                path,
                f"line has {len(line)} characters, more than max_line_chars={max_line_chars}; "
                "shorten or split it, or raise max_line_chars",
                number,
            )
    return lines


def _header(path: str, names: Sequence[str]) -> tuple[str, ...]:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DataFormatError(path, f"the header names the field {name!r} twice; rename one of them", 1)
        seen.add(name)
    return tuple(names)


def _check_width(
    path: str, number: int, fields: Sequence[str], header: Sequence[str], kind: str, fix: str
) -> None:
    if len(fields) != len(header):
        raise DataFormatError(
            path, f"expected {len(header)} {kind}-separated fields ({', '.join(header)}), got {len(fields)}; {fix}",
            number,
        )


def _read_tsv(path: str, lines: list[str]) -> Records:
    header = _header(path, lines[0].split("\t"))
    rows: list[tuple[int, dict[str, Any]]] = []
    blank = 0
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            blank += 1
            continue
        fields = line.split("\t")
        fix = "a text must not contain a tab: replace stray tabs by spaces and fill in missing fields"
        _check_width(path, number, fields, header, "tab", fix)
        rows.append((number, dict(zip(header, fields, strict=True))))
    return Records(path, header, rows, blank)


def _read_csv(path: str, lines: list[str]) -> Records:
    reader = csv.reader(io.StringIO("\n".join(lines), newline=""), strict=True)
    rows: list[tuple[int, dict[str, Any]]] = []
    blank = 0
    header: tuple[str, ...] = ()
    start = 1
    try:
        for fields in reader:
            if not header:
                header = _header(path, fields)
            elif not any(field.strip() for field in fields):
                blank += 1
            else:
                fix = "quote a field that holds a comma, and fill in missing fields"
                _check_width(path, start, fields, header, "comma", fix)
                rows.append((start, dict(zip(header, fields, strict=True))))
            start = reader.line_num + 1
    except csv.Error as err:
        message = f"not valid CSV ({err}); quote fields that hold commas, quotes or line breaks, doubling inner quotes"
        raise DataFormatError(path, message, start) from err
    return Records(path, header, rows, blank)


def _read_jsonl(path: str, lines: list[str]) -> Records:
    rows: list[tuple[int, dict[str, Any]]] = []
    blank = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            blank += 1
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as err:
            message = f"not valid JSON ({err}); a JSON Lines file holds one JSON object per line"
            raise DataFormatError(path, message, number) from None
        if not isinstance(row, dict):
            message = (f"the line is a JSON {type(row).__name__}, not an object; a JSON Lines file holds one "
                       'object per line: {"field": "value", ...}')
            raise DataFormatError(path, message, number)
        rows.append((number, row))
    return Records(path, None, rows, blank)


# -- line-aligned text files ------------------------------------------------------------------


def read_text_files(prefix: str, names: Sequence[str], max_line_chars: int) -> Records:
    """The rows of line-aligned text files: field `name` of row n is line n of the file `prefix.name`."""
    files = {name: _text_file(prefix, name) for name in names}
    columns = {name: _lines(path, max_line_chars) for name, path in files.items()}
    first = names[0]
    for name in names[1:]:
        if len(columns[name]) != len(columns[first]):
            raise DataFormatError(
                files[name], f"has {len(columns[name])} lines but {files[first]} has {len(columns[first])}; "
                "line-aligned files need one line per example in each: remove or add lines so the counts match",
            )
    rows: list[tuple[int, dict[str, Any]]] = []
    blank = 0
    for number, values in enumerate(zip(*columns.values(), strict=True), start=1):
        if not any(value.strip() for value in values):
            blank += 1
            continue
        rows.append((number, dict(zip(names, values, strict=True))))
    return Records(prefix, None, rows, blank, files)


def _text_file(prefix: str, name: str) -> str:
    """`prefix.name`, or `prefix.name.gz` when only that exists."""
    if locate(prefix).is_dir():
        raise DataFormatError(prefix, "is a directory, not a data file or the path prefix of line-aligned files "
                                      "(corpus/train for corpus/train.de and corpus/train.en); check the path")
    plain = f"{prefix}.{name}"
    for candidate in (plain, plain + ".gz"):
        if locate(candidate).is_file():
            return candidate
    folder, stem = Path(prefix).parent, Path(prefix).name
    present = sorted(p.name.removesuffix(".gz")[len(stem) + 1:] for p in locate(folder).glob(f"{stem}.*"))
    have = f"the fields (file suffixes) there are: {', '.join(present)}" if present else "no file starts so"
    raise DataFormatError(plain, f"no such file (nor {plain}.gz) for field {name!r}; {have}; give the path prefix "
                                 "and a field that exist, or the file's format if it is a table")
