"""Tests of attn.data.readers and attn.data.file_formats: every format, gzipped or not, in both directions;
the shipped corpora read through the generic reader against the raw files split by hand; and every kind of
bad input."""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from attn.core.errors import ConfigError, DataFormatError
from attn.data.file_formats import resolve_format
from attn.data.readers import Fields, load_labelled, load_parallel, read_table
from attn.training.runconfig import RunConfig

DATA = Path(__file__).resolve().parents[2] / "data"

# German -> English pairs with what breaks naive readers: quotes, commas, non-ASCII, a lone tab-free apostrophe.
PAIRS = [
    ("Guten Morgen, Welt.", "Good morning, world."),
    ('Er sagte: "Hallo".', 'He said: "Hello".'),
    ("Straße über Brücke", "street over bridge"),
    ("Das ist's.", "That's it."),
]


def _tsv(rows: list[dict[str, str]]) -> str:
    names = list(rows[0])
    return "\n".join(["\t".join(names), *("\t".join(row[n] for n in names) for row in rows)]) + "\n"


def _csv(rows: list[dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _jsonl(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


WRITERS: dict[str, Callable[[list[dict[str, str]]], str]] = {"tsv": _tsv, "csv": _csv, "jsonl": _jsonl}


def _write(path: Path, text: str | bytes, compress: bool = False) -> Path:
    data = text.encode("utf-8") if isinstance(text, str) else text
    path = path.with_name(path.name + ".gz") if compress else path
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def _pair_files(folder: Path, fmt: str, compress: bool) -> Path:
    """The PAIRS in `fmt` (fields `id`, `de`, `en`); returns the path to give the reader."""
    if fmt == "text":
        for index, language in ((0, "de"), (1, "en")):
            _write(folder / f"train.{language}", "".join(pair[index] + "\n" for pair in PAIRS), compress)
        return folder / "train"
    rows = [{"id": str(i), "de": de, "en": en} for i, (de, en) in enumerate(PAIRS)]
    return _write(folder / f"train.{fmt}", WRITERS[fmt](rows), compress)


# -- every format, gzipped or not, both directions ---------------------------------------------


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl", "text"])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("direction", [("de", "en"), ("en", "de")], ids=["de-en", "en-de"])
def test_pairs_read_in_every_format_and_direction(
    tmp_path: Path, fmt: str, compress: bool, direction: tuple[str, str]
) -> None:
    path = _pair_files(tmp_path, fmt, compress)
    source, target = direction
    corpus = load_parallel(path, Fields(source_field=source, target_field=target))
    expected = PAIRS if direction == ("de", "en") else [(en, de) for de, en in PAIRS]
    assert list(zip(corpus.sources, corpus.targets, strict=True)) == expected
    assert corpus.lines == ([1, 2, 3, 4] if fmt in ("text", "jsonl") else [2, 3, 4, 5])
    assert corpus.skipped_blank == 0


def test_format_follows_the_name_unless_set(tmp_path: Path) -> None:
    names = {"a.tsv": "tsv", "a.TSV.gz": "tsv", "a.csv": "csv", "a.jsonl.gz": "jsonl", "a.json": "jsonl",
             "corpus/train": "text", "train.de-en": "text"}
    assert {name: resolve_format(name) for name in names} == names
    assert resolve_format("a.csv", "tsv") == "tsv"
    path = _write(tmp_path / "pairs.txt", _tsv([{"de": "a", "en": "b"}]))  # a TSV under another name
    corpus = load_parallel(path, Fields(format="tsv", source_field="de", target_field="en"))
    assert (corpus.sources, corpus.targets) == (["a"], ["b"])


def test_csv_keeps_quoted_commas_quotes_and_line_breaks(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.csv", 'de,en\n"a, b","say ""hi"""\n"two\nlines",x\nc,d\n')
    corpus = load_parallel(path, Fields(source_field="de", target_field="en"))
    assert corpus.sources == ["a, b", "two\nlines", "c"]
    assert corpus.targets == ['say "hi"', "x", "d"]
    assert corpus.lines == [2, 3, 5]  # a record's first line


def test_blank_lines_are_skipped_in_every_format(tmp_path: Path) -> None:
    _write(tmp_path / "t.de", "a\n\nb\n")
    _write(tmp_path / "t.en", "x\n  \ny\n")
    files = {
        "t.csv": "de,en\na,x\n\nb,y\n",
        "t.jsonl": '{"de": "a", "en": "x"}\n\n{"de": "b", "en": "y"}\n',
        "t.tsv": "de\ten\na\tx\n\nb\ty\n",
    }
    for name, text in files.items():
        _write(tmp_path / name, text)
    for path in (tmp_path / "t", *(tmp_path / name for name in files)):
        corpus = load_parallel(path, Fields(source_field="de", target_field="en"))
        assert (corpus.sources, corpus.targets, corpus.skipped_blank) == (["a", "b"], ["x", "y"], 1), path


def test_json_lines_ignores_fields_it_does_not_read(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.jsonl", '{"de": "a", "en": "b", "score": 0.5, "tags": [1]}\n')
    assert load_parallel(path, Fields(source_field="de", target_field="en")).sources == ["a"]


# -- the shipped corpora through the generic reader ---------------------------------------------


def _raw_rows(path: Path) -> list[list[str]]:
    """The rows of a shipped TSV split by hand (header dropped), as data/README.md describes them."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [line.split("\t") for line in data.decode("utf-8").split("\n")[1:] if line]


@pytest.mark.parametrize("name", ["train.tsv.gz", "valid.tsv", "test.tsv"])
def test_shipped_bible_reads_as_split_by_hand_in_both_directions(name: str) -> None:
    rows = _raw_rows(DATA / "bible-en-es" / name)
    english_spanish = load_parallel(DATA / "bible-en-es" / name)
    assert english_spanish.sources == [en for _, en, _ in rows]
    assert english_spanish.targets == [es for _, _, es in rows]
    spanish_english = load_parallel(DATA / "bible-en-es" / name, Fields(source_field="es", target_field="en"))
    assert (spanish_english.sources, spanish_english.targets) == (english_spanish.targets, english_spanish.sources)


def test_king_james_is_a_field_of_a_join() -> None:
    king_james = dict(_raw_rows(DATA / "bible-en-es" / "kjv.tsv.gz"))
    rows = _raw_rows(DATA / "bible-en-es" / "test.tsv")
    fields = Fields(source_field="en_kjv", target_field="es", join="data/bible-en-es/kjv.tsv.gz", join_key="ref")
    corpus = load_parallel(DATA / "bible-en-es" / "test.tsv", fields)
    assert corpus.sources == [king_james[ref] for ref, _, _ in rows]
    assert corpus.targets == [es for _, _, es in rows]
    # The file's own fields are still there, and win over the join table's.
    both = read_table(DATA / "bible-en-es" / "test.tsv", {"a": "en", "b": "en_kjv", "c": "ref"}, fields)
    assert both.values["a"] == [en for _, en, _ in rows] and both.values["c"] == [ref for ref, _, _ in rows]


def test_shipped_fortunes_read_as_split_by_hand() -> None:
    rows = _raw_rows(DATA / "fortunes-topics" / "valid.tsv")
    corpus = load_labelled(DATA / "fortunes-topics" / "valid.tsv")
    assert corpus.texts == [text for _, text in rows]
    assert [corpus.label_names[i] for i in corpus.labels] == [label for label, _ in rows]
    assert corpus.label_names == sorted({label for label, _ in rows}) and corpus.pairs is None


# -- classification ------------------------------------------------------------------------------

LABELLED = [
    {"premise": "A man plays, loudly.", "hypothesis": 'He says "hi".', "gold": "yes"},
    {"premise": "Nobody is here.", "hypothesis": "A crowd gathers.", "gold": "no"},
    {"premise": "It rains.", "hypothesis": "The street is wet.", "gold": "maybe"},
]


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_labelled_pairs_read_in_every_format(tmp_path: Path, fmt: str, compress: bool) -> None:
    path = _write(tmp_path / f"train.{fmt}", WRITERS[fmt](LABELLED), compress)
    fields = Fields(text_field="premise", text_pair_field="hypothesis", label_field="gold")
    corpus = load_labelled(path, fields)
    assert corpus.label_names == ["maybe", "no", "yes"]
    assert corpus.labels == [2, 1, 0]
    assert corpus.texts == [row["premise"] for row in LABELLED]
    assert corpus.pairs == [row["hypothesis"] for row in LABELLED]
    single = load_labelled(path, Fields(text_field="hypothesis", label_field="gold"))
    assert (single.texts, single.pairs) == (corpus.pairs, None)


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_unknown_label_names_the_label_file_and_line(tmp_path: Path, fmt: str) -> None:
    rows = [{"text": "a", "label": "art"}, {"text": "b", "label": "music"}]
    path = _write(tmp_path / f"valid.{fmt}", WRITERS[fmt](rows))
    line = 2 if fmt == "jsonl" else 3
    with pytest.raises(DataFormatError, match=rf"valid.{fmt}:{line}: unknown label 'music'; known labels: art, law"):
        load_labelled(path, labels=["art", "law"])


# -- bad input -----------------------------------------------------------------------------------

BAD: dict[str, tuple[str, str | bytes, str]] = {
    # case: (file name, contents, expected message after the path)
    "tsv-missing-field": ("p.tsv", "id\tde\tfr\n1\ta\tb\n",
                          ":1: no field 'en' (target_field); the fields here are: id, de, fr; set target_field"),
    "csv-missing-field": ("p.csv", "id,de,fr\n1,a,b\n",
                          ":1: no field 'en' (target_field); the fields here are: id, de, fr"),
    "jsonl-missing-field": ("p.jsonl", '{"de": "a", "en": "b"}\n{"de": "c", "fr": "d"}\n',
                            ":2: no field 'en' (target_field); the fields here are: de, fr"),
    "csv-ragged-row": ("p.csv", "de,en\na,b\nc,d,e\n", ":3: expected 2 comma-separated fields (de, en), got 3; quote"),
    "csv-unclosed-quote": ("p.csv", 'de,en\na,b\n"c,d\n', ":3: not valid CSV"),
    "tsv-ragged-row": ("p.tsv", "de\ten\na\n", ":2: expected 2 tab-separated fields (de, en), got 1"),
    "jsonl-not-an-object": ("p.jsonl", '{"de": "a", "en": "b"}\n["c", "d"]\n',
                            ":2: the line is a JSON list, not an object"),
    "jsonl-number-field": ("p.jsonl", '{"de": "a", "en": "b"}\n{"de": 7, "en": "d"}\n',
                           ":2: field 'de' (source_field) is 7, a JSON int, not a string"),
    "jsonl-invalid-json": ("p.jsonl", '{"de": "a", "en": "b"}\n{"de": "c", \n', ":2: not valid JSON"),
    "tsv-empty-value": ("p.tsv", "de\ten\na\tb\nc\t \n", ":3: field 'en' (target_field) is empty; fill it in"),
    "csv-empty-value": ("p.csv", 'de,en\n"",b\n', ":2: field 'de' (source_field) is empty"),
    "jsonl-empty-value": ("p.jsonl", '{"de": "", "en": "b"}\n', ":1: field 'de' (source_field) is empty"),
    "tsv-no-rows": ("p.tsv", "de\ten\n\n", ": has no rows; add rows"),
    "csv-no-rows": ("p.csv", "de,en\n", ": has no rows"),
    "jsonl-no-rows": ("p.jsonl", "\n  \n", ": has no rows"),
    "csv-empty-file": ("p.csv", "", ":1: the file is empty; it must start with the header"),
    "csv-duplicate-field": ("p.csv", "de,en,de\na,b,c\n", ":1: the header names the field 'de' twice"),
    "csv-invalid-utf8": ("p.csv", b"de,en\na,caf\xe9\n", ":2: invalid UTF-8 (byte 0xe9)"),
    "jsonl-invalid-utf8": ("p.jsonl", b'{"de": "a", "en": "b"}\n{"de": "\xff"}\n', ":2: invalid UTF-8 (byte 0xff)"),
    "jsonl-long-line": ("p.jsonl", '{"de": "a", "en": "b"}\n{"de": "' + "x" * 200 + '", "en": "b"}\n',
                        ":2: line has 221 characters, more than max_line_chars=100"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_a_data_format_error_naming_file_and_line(tmp_path: Path, case: str) -> None:
    name, contents, expected = BAD[case]
    path = _write(tmp_path / name, contents)
    with pytest.raises(DataFormatError) as caught:
        load_parallel(path, Fields(source_field="de", target_field="en"), max_line_chars=100)
    assert f"{name}{expected}" in str(caught.value)


def test_json_nested_too_deep_for_the_parser_is_invalid_json(tmp_path: Path) -> None:
    path = _write(tmp_path / "deep.jsonl", "[" * 50_000 + "\n")  # RecursionError inside json, not JSONDecodeError
    with pytest.raises(DataFormatError, match=r"deep.jsonl:1: not valid JSON"):
        load_parallel(path)


def test_text_files_of_different_lengths_name_both_files_and_counts(tmp_path: Path) -> None:
    _write(tmp_path / "train.de", "a\nb\nc\n")
    _write(tmp_path / "train.en", "x\ny\n", compress=True)
    with pytest.raises(DataFormatError) as caught:
        load_parallel(tmp_path / "train", Fields(source_field="de", target_field="en"))
    assert str(caught.value).startswith(f"{tmp_path}/train.en.gz: has 2 lines but {tmp_path}/train.de has 3; ")


def test_text_file_of_a_missing_field_lists_the_suffixes_there(tmp_path: Path) -> None:
    for language in ("de", "en", "fr"):
        _write(tmp_path / f"train.{language}", "a\n", compress=language == "fr")
    with pytest.raises(DataFormatError, match=r"train.es: no such file \(nor .*train.es.gz\) for field 'es'; the "
                                              r"fields \(file suffixes\) there are: de, en, fr"):
        load_parallel(tmp_path / "train", Fields(source_field="de", target_field="es"))


def test_text_file_with_a_blank_line_in_one_file_only(tmp_path: Path) -> None:
    _write(tmp_path / "train.de", "a\nb\n")
    _write(tmp_path / "train.en", "x\n \n")
    with pytest.raises(DataFormatError, match=r"train.en:2: field 'en' \(target_field\) is empty"):
        load_parallel(tmp_path / "train", Fields(source_field="de", target_field="en"))


def test_join_errors_name_the_key(tmp_path: Path) -> None:
    _write(tmp_path / "p.tsv", "id\tde\n1\ta\n2\tb\n")
    _write(tmp_path / "more.csv", "id,en\n1,x\n")
    fields = Fields(source_field="de", target_field="en", join=str(tmp_path / "more.csv"), join_key="id")
    with pytest.raises(DataFormatError, match=r"p.tsv:3: id='2' has no row in the join table .*more.csv"):
        load_parallel(tmp_path / "p.tsv", fields)
    keyless = Fields(source_field="de", target_field="en", join=str(tmp_path / "more.csv"), join_key="ref")
    with pytest.raises(DataFormatError, match=r"p.tsv:1: no field 'ref' \(join_key\); the fields here are: id, de"):
        load_parallel(tmp_path / "p.tsv", keyless)


@pytest.mark.parametrize(
    ("settings", "field", "fix"),
    [
        ({"format": "xml"}, "format", "choose one of auto, tsv, csv, jsonl, text"),
        ({"join": "kjv.tsv"}, "join_key", "set both"),
        ({"join_key": "ref"}, "join", "set both"),
        ({"source_field": ""}, "source_field", "is empty; name the field"),
        ({"label_field": 3}, "label_field", "expected str, got int 3"),
    ],
)
def test_bad_settings_are_config_errors(settings: dict, field: str, fix: str) -> None:
    with pytest.raises(ConfigError, match=fix) as caught:
        Fields(**settings)
    assert caught.value.field == field
    with pytest.raises(ConfigError, match=f"data.{field}: .*{fix}"):
        RunConfig.from_dict({"data": settings})


def test_join_on_text_files_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="join: a join needs a key field"):
        load_parallel(tmp_path / "train", Fields(join="x.tsv", join_key="id"))


def test_run_config_data_section_gives_the_fields() -> None:
    config = RunConfig().override("data.source_field=es", "data.target_field=en", "data.format=jsonl")
    assert config.data.fields() == Fields(format="jsonl", source_field="es", target_field="en")
    assert Fields.from_mapping(config.to_dict()["data"]) == config.data.fields()
    assert Fields.from_mapping(None) == Fields() == RunConfig().data.fields()  # the same defaults in both
    with pytest.raises(ConfigError, match="data.source: unknown key"):
        RunConfig.from_dict({"data": {"source": "en_kjv"}})
