"""Reading examples from the files people have: TSV, CSV, JSON Lines and line-aligned text files.

`load_parallel` reads translation pairs, `load_labelled` labelled texts (or text pairs), both through `read_table`,
which picks the wanted fields out of a file in any format of `attn.data.file_formats`. Any field can be the source
or the target: source `es` and target `en` read the other direction of the same file. `Fields.join` adds the
fields of a second table, matched on `Fields.join_key` (another translation of the same Bible verses).

Every defect is a `DataFormatError` naming the file, the 1-based line and the fix, raised before anything is
returned: a field the file lacks (listing those it has), an empty or non-string value, a file without rows.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attn.core.errors import ConfigError, DataFormatError, TextError
from attn.data.file_formats import (
    FORMATS,
    Records,
    read_records,
    read_text_files,
    resolve_format,
)
from attn.data.text import MAX_LINE_CHARS, check_unicode


@dataclass(frozen=True)
class Fields:
    """How to read a data file and which of its fields hold what.

    The names are those of a run config's `[data]` section. `source_field`/`target_field` are read
    for translation, `text_field`/`label_field` (and `text_pair_field`, when set, for sentence-pair
    tasks) for classification. With `format = "text"` a field names a file suffix instead of a column.
    """

    format: str = "auto"  # auto | tsv | csv | jsonl | text | chat (the lm task's conversations)
    source_field: str = "en"
    target_field: str = "es"
    text_field: str = "text"
    label_field: str = "label"
    text_pair_field: str = ""  # "" = single texts
    join: str = ""  # a table whose fields are added to every row, matched on join_key
    join_key: str = ""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, str):
                raise ConfigError(field.name, f"expected str, got {type(value).__name__} {value!r}")
            if not value and field.name not in ("text_pair_field", "join", "join_key"):
                raise ConfigError(field.name, "is empty; name the field of the data file that holds it")
        if self.format not in FORMATS:
            raise ConfigError("format", f"unknown format {self.format!r}; choose one of {', '.join(FORMATS)}")
        if bool(self.join) != bool(self.join_key):
            missing = "join_key" if self.join else "join"
            raise ConfigError(missing, "join and join_key go together: set both (the table and its key field) "
                                       "or neither")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> Fields:
        """The fields of a mapping with these keys among others (a run config's `data` table); keys
        it lacks keep their defaults."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in (data or {}).items() if key in names})

    def to_dict(self) -> dict[str, str]:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)


# -- corpora ----------------------------------------------------------------------------------


@dataclass
class ParallelCorpus:
    """Aligned sentence pairs of one split (`Fields.source_field`, `Fields.target_field`), in file order.

    Attributes:
        lines: the 1-based line of each pair in the file.
        skipped_blank: blank lines skipped in the file.
    """

    sources: list[str]
    targets: list[str]
    lines: list[int]
    skipped_blank: int
    path: str

    def __len__(self) -> int:
        return len(self.sources)


@dataclass
class LabelledCorpus:
    """Texts (or text pairs) with class labels of one split, in file order.

    Attributes:
        texts: the texts (`Fields.text_field`), the first of each pair for a sentence-pair task.
        labels: class index of each text, an index into `label_names`.
        label_names: the class names; sorted when inferred from the file.
        pairs: the second text of each pair (`Fields.text_pair_field`), or None for single texts.
    """

    texts: list[str]
    labels: list[int]
    label_names: list[str]
    pairs: list[str] | None
    skipped_blank: int
    path: str

    def __len__(self) -> int:
        return len(self.texts)


def load_parallel(
    path: str | Path, fields: Fields = Fields(), max_line_chars: int = MAX_LINE_CHARS
) -> ParallelCorpus:
    """Loads source-target pairs, such as English-Spanish from `data/bible-en-es/valid.tsv`.

    Args:
        path: the file (optionally `.gz`), or the prefix of two line-aligned text files.
        fields: the format, `source_field`, `target_field` and join; the default reads the shipped Bible's `en`
            and `es` columns.

    Raises:
        DataFormatError: a malformed file (see `read_table`).

    Example:
        >>> from attn.data.readers import Fields, load_parallel
        >>> spanish_english = Fields(source_field="es", target_field="en")
        >>> corpus = load_parallel("data/bible-en-es/valid.tsv", spanish_english)
        >>> corpus.sources[0][:19], corpus.targets[0][:17]
        ('En el principio era', 'In the beginning ')
    """
    wanted = {"source_field": fields.source_field, "target_field": fields.target_field}
    table = read_table(path, wanted, fields, max_line_chars)
    return ParallelCorpus(
        table.values["source_field"], table.values["target_field"], table.lines, table.skipped_blank, table.path
    )


def load_labelled(
    path: str | Path,
    fields: Fields = Fields(),
    labels: Sequence[str] | None = None,
    max_line_chars: int = MAX_LINE_CHARS,
) -> LabelledCorpus:
    """Loads labelled texts, such as `data/fortunes-topics/train.tsv`, or labelled text pairs.

    Args:
        labels: the class names a model was trained with (at evaluation time); None infers them from the file,
            sorted.

    Raises:
        DataFormatError: a malformed file (see `read_table`), or a label not in `labels`.
    """
    wanted = {"text_field": fields.text_field, "label_field": fields.label_field}
    if fields.text_pair_field:
        wanted["text_pair_field"] = fields.text_pair_field
    table = read_table(path, wanted, fields, max_line_chars)
    found = table.values["label_field"]
    names = list(labels) if labels is not None else sorted(set(found))
    index = {name: i for i, name in enumerate(names)}
    for number, label in zip(table.lines, found, strict=True):
        if label not in index:
            raise DataFormatError(
                table.files["label_field"],
                f"unknown label {label!r}; known labels: {', '.join(names)}; "
                "fix the label or use a model trained with it",
                number,
            )
    return LabelledCorpus(
        texts=table.values["text_field"],
        labels=[index[label] for label in found],
        label_names=names,
        pairs=table.values.get("text_pair_field"),
        skipped_blank=table.skipped_blank,
        path=table.path,
    )


# -- tables -----------------------------------------------------------------------------------


@dataclass
class Table:
    """The wanted fields of a data file, one value list per field.

    Attributes:
        path: the file read (the prefix, for `text`).
        lines: the 1-based line (first line, for a CSV record) of each row.
        values: setting name (e.g. "source_field") -> the field's value in every row.
        files: setting name -> the file its values came from.
    """

    path: str
    lines: list[int]
    values: dict[str, list[str]]
    files: dict[str, str]
    skipped_blank: int

    def __len__(self) -> int:
        return len(self.lines)


def read_table(
    path: str | Path, wanted: Mapping[str, str], fields: Fields = Fields(), max_line_chars: int = MAX_LINE_CHARS
) -> Table:
    """Reads the `wanted` fields of every row of a data file, in file order.

    Args:
        path: the file (optionally `.gz`), or for `text` the prefix of one file per field.
        wanted: setting name -> field name, e.g. {"source_field": "es", "target_field": "en"}; messages name the
            setting, so that they say what to change.
        fields: the format and the join (its `*_field` entries are not read here).

    Raises:
        DataFormatError: a malformed file, a missing field, an empty value, or a join key without a match.
        ConfigError: a join on a `text` file, which has no key field.
    """
    fmt = resolve_format(path, fields.format)
    if fmt == "chat":
        raise ConfigError("format", "chat files (conversations) train the lm task only; give this task a tsv, csv, "
                                    "jsonl or text file, or leave format at auto")
    names = list(dict.fromkeys(wanted.values()))
    if fmt == "text":
        if fields.join:
            raise ConfigError("join", "a join needs a key field; line-aligned text files have none: use a table "
                                      "(tsv, csv or jsonl) or leave join empty")
        records = read_text_files(str(path), names, max_line_chars)
    else:
        records = read_records(str(path), fmt, max_line_chars)
        if fields.join:
            joined = read_records(fields.join, resolve_format(fields.join), max_line_chars)
            records = _join(records, joined, fields.join_key)
    _check_header(records, wanted)
    if not records.rows:
        raise DataFormatError(records.path, "has no rows; add rows or use another file")
    values: dict[str, list[str]] = {setting: [] for setting in wanted}
    for number, row in records.rows:
        for setting, name in wanted.items():
            values[setting].append(_value(records, number, row, setting, name))
    files = {setting: records.files.get(name, records.path) for setting, name in wanted.items()}
    return Table(records.path, [number for number, _ in records.rows], values, files, records.skipped_blank)


def _check_header(records: Records, wanted: Mapping[str, str]) -> None:
    """A header names the fields, so a missing one is reported at line 1 before any row is read."""
    if records.header is None:
        return
    for setting, name in wanted.items():
        if name not in records.header:
            raise _missing(records.path, 1, records.header, setting, name)


def _missing(path: str, line: int, have: Sequence[str], setting: str, name: str) -> DataFormatError:
    listed = ", ".join(have) or "none"
    message = f"no field {name!r} ({setting}); the fields here are: {listed}; set {setting} to one of them"
    return DataFormatError(path, message, line)


def _value(records: Records, number: int, row: Mapping[str, Any], setting: str, name: str) -> str:
    """Field `name` of a row, checked: present, a string, not blank."""
    where = records.files.get(name, records.path)
    if name not in row:
        raise _missing(where, number, list(row), setting, name)
    value = row[name]
    if not isinstance(value, str):
        message = (f"field {name!r} ({setting}) is {json.dumps(value)}, a JSON {type(value).__name__}, "
                   f"not a string; write it in quotes")
        raise DataFormatError(where, message, number)
    if not value.strip():
        raise DataFormatError(where, f"field {name!r} ({setting}) is empty; fill it in or delete the line", number)
    try:
        return check_unicode(value)  # a JSON Lines file's unpaired surrogate escape
    except TextError as error:
        raise DataFormatError(where, f"field {name!r} ({setting}) {error.detail}", number) from None


# -- join -------------------------------------------------------------------------------------


def _join(records: Records, other: Records, key: str) -> Records:
    """`records` with the fields of `other`'s row of the same `key` added (records' own fields win)."""
    _check_header(records, {"join_key": key})
    _check_header(other, {"join_key": key})
    index: dict[str, dict[str, Any]] = {}
    for number, row in other.rows:
        value = _value(other, number, row, "join_key", key)
        if value in index:
            raise DataFormatError(other.path, f"key {key}={value!r} occurs twice; keep one of the lines", number)
        index[value] = row
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, row in records.rows:
        value = _value(records, number, row, "join_key", key)
        if value not in index:
            message = f"{key}={value!r} has no row in the join table {other.path}; add one there or drop this line"
            raise DataFormatError(records.path, message, number)
        rows.append((number, {**index[value], **row}))
    header = None if records.header is None else (*records.header, *(other.header or ()))
    return Records(records.path, tuple(dict.fromkeys(header)) if header else None, rows, records.skipped_blank)
