"""Fuzzing every file reader: random bytes and broken copies of real files.

A reader given any bytes either succeeds or raises its documented error: `DataFormatError` for the
data loaders of `attn.data.text` and `attn.data.readers`, `CheckpointError` for checkpoints,
tokenizers and Hugging Face `config.json`, `ConfigError` for TOML run configurations. Anything else (UnicodeDecodeError,
gzip.BadGzipFile, EOFError, RecursionError, IndexError, ...) would reach the user as a traceback.

Inputs are hypothesis' `binary()` and real files broken the ways files break: cut short, bytes
flipped, tabs, newlines or random bytes inserted, bytes deleted.
"""

from __future__ import annotations

import contextlib
import gzip
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from attn.app.runs import load_run_config
from attn.artifacts import load_model
from attn.artifacts.checkpoint import write_checkpoint
from attn.artifacts.pretrained.families import family_of, read_hf_config
from attn.data.readers import Fields, load_labelled, load_parallel
from attn.data.text import read_text
from attn.data.tokenizers import Tokenizer
from attn.core.errors import CheckpointError, ConfigError, DataFormatError
from attn.models import build_model
from attn.core.presets import preset
from attn.training.runconfig import RunConfig

ROOT = Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DEEP_JSON = b"[" * 100_000  # Python's JSON parser gives up with RecursionError, not JSONDecodeError


def _head(path: Path, lines: int) -> bytes:
    opened = gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")
    with opened as handle:
        return b"".join(handle.readline() for _ in range(lines))


PARALLEL = _head(ROOT / "data/bible-en-es/valid.tsv", 12)
KJV = _head(ROOT / "data/bible-en-es/kjv.tsv.gz", 12)
LABELLED = _head(ROOT / "data/fortunes-topics/valid.tsv", 12)
LABELLED_CSV = b'label,text\nart,"A ""quoted"", comma text"\nlaw,"two\nlines"\nfood,plain\n'
LABELLED_JSONL = b'{"label": "art", "text": "A \\"quoted\\" text"}\n{"label": "law", "text": "b", "n": 3}\n'
TEXT = _head(ROOT / "data/shakespeare/valid.txt", 40)
RUN_TOML = (ROOT / "configs/quickstart-lm.toml").read_bytes()

# -- breaking real files ------------------------------------------------------------------------

Edit = Callable[[bytes], bytes]  # positions wrap around the data's length, so edits compose


def _cut(at: int) -> Edit:
    return lambda data: data[: at % (len(data) + 1)]


def _flip(at: int, mask: int) -> Edit:
    def edit(data: bytes) -> bytes:
        if not data:
            return data
        i = at % len(data)
        return data[:i] + bytes([data[i] ^ mask]) + data[i + 1 :]

    return edit


def _insert(at: int, piece: bytes) -> Edit:
    return lambda data: data[: at % (len(data) + 1)] + piece + data[at % (len(data) + 1) :]


def _delete(at: int, count: int) -> Edit:
    return lambda data: data[: at % (len(data) + 1)] + data[at % (len(data) + 1) + count :]


PLACE = st.integers(0, 10**6)
EDITS = st.one_of(
    st.builds(_cut, PLACE),
    st.builds(_flip, PLACE, st.integers(1, 255)),
    st.builds(_insert, PLACE, st.sampled_from([b"\t", b"\n", b"\r", b"\x00", b"\xff", b"\xc3"])
              | st.binary(max_size=4)),
    st.builds(_delete, PLACE, st.integers(1, 16)),
)


def broken(original: bytes) -> st.SearchStrategy[bytes]:
    """`original` with one to four edits, or bytes with no structure at all."""

    def apply(edits: list[Edit]) -> bytes:
        data = original
        for edit in edits:
            data = edit(data)
        return data

    return st.one_of(st.binary(max_size=400), st.lists(EDITS, min_size=1, max_size=4).map(apply))


def raises_only(error: type[Exception], read: Callable[[], object]) -> None:
    """Runs `read`; an `error` is the documented failure, any other exception fails the test."""
    with contextlib.suppress(error):
        read()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _write(folder: Path, name: str, data: bytes, compress: bool) -> Path:
    path = folder / (f"{name}.gz" if compress else name)
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


# -- data loaders -----------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip-of-it"])
@FUZZ
@given(data=broken(PARALLEL))
@example(data=b"\xef\xbb\xbfref\ten\tes\nGen 1:1\ta\tb\n")
def test_load_parallel(folder: Path, compress: bool, data: bytes) -> None:
    path = _write(folder, "pairs.tsv", data, compress)
    raises_only(DataFormatError, lambda: load_parallel(path))


@FUZZ
@given(data=broken(KJV), pairs=broken(PARALLEL))
def test_load_parallel_with_king_james_source(folder: Path, data: bytes, pairs: bytes) -> None:
    kjv = _write(folder, "kjv.tsv", data, compress=True)
    path = _write(folder, "pairs-kjv.tsv", pairs, compress=False)
    king_james = Fields(source_field="en_kjv", join=str(kjv), join_key="ref")
    raises_only(DataFormatError, lambda: load_parallel(path, king_james))


@pytest.mark.parametrize("labels", [None, ["art", "computers"]], ids=["inferred", "given"])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip-of-it"])
@FUZZ
@given(data=broken(LABELLED))
def test_load_labelled(folder: Path, compress: bool, labels: list[str] | None, data: bytes) -> None:
    path = _write(folder, "labels.tsv", data, compress)
    raises_only(DataFormatError, lambda: load_labelled(path, labels=labels))


@pytest.mark.parametrize(("name", "original"), [("labels.csv", LABELLED_CSV), ("labels.jsonl", LABELLED_JSONL)])
@FUZZ
@given(data=st.data())
def test_load_labelled_csv_and_json_lines(folder: Path, name: str, original: bytes, data: st.DataObject) -> None:
    path = _write(folder, name, data.draw(broken(original)), compress=False)
    raises_only(DataFormatError, lambda: load_labelled(path))


@FUZZ
@given(source=broken(TEXT), target=broken(TEXT))
def test_load_parallel_text_files(folder: Path, source: bytes, target: bytes) -> None:
    _write(folder, "pairs.de", source, compress=False)
    _write(folder, "pairs.en", target, compress=True)
    raises_only(DataFormatError, lambda: load_parallel(folder / "pairs", Fields(source_field="de", target_field="en")))


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip-of-it"])
@FUZZ
@given(data=broken(TEXT))
def test_read_text(folder: Path, compress: bool, data: bytes) -> None:
    path = _write(folder, "text.txt", data, compress)
    raises_only(DataFormatError, lambda: read_text(path))


@FUZZ
@given(data=broken(gzip.compress(TEXT)))
def test_read_text_of_a_broken_gzip_file(folder: Path, data: bytes) -> None:
    path = folder / "broken.txt.gz"
    path.write_bytes(data)
    raises_only(DataFormatError, lambda: read_text(path))


# -- configurations ---------------------------------------------------------------------------


@FUZZ
@given(data=broken(RUN_TOML))
def test_load_run_config(folder: Path, data: bytes) -> None:
    path = folder / "run.toml"
    path.write_bytes(data)
    raises_only(ConfigError, lambda: load_run_config(path))


@FUZZ
@given(data=broken(b'{"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 97}'))
@example(data=DEEP_JSON)
def test_read_hf_config(folder: Path, data: bytes) -> None:
    hf = folder / "hf"
    hf.mkdir(exist_ok=True)
    (hf / "config.json").write_bytes(data)
    raises_only(CheckpointError, lambda: family_of(read_hf_config(hf), hf / "config.json"))


# -- checkpoints and tokenizers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(folder: Path) -> Path:
    """A tiny encoder-decoder checkpoint with a character tokenizer (untrained weights)."""
    tokenizer = Tokenizer.train_chars([PARALLEL.decode("utf-8")])
    config = preset("paper-base-tiny").replace(vocab_size=tokenizer.vocab_size)
    return write_checkpoint(folder / "checkpoint", build_model(config), config, RunConfig().to_dict(), tokenizer=tokenizer,
                            task_info={"task": "translation"})


CHECKPOINT_FILES = ["model_config.json", "run_config.json", "task.json", "attn_tokenizer.json", "tokenizer.json",
                    "model.safetensors"]


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
@settings(FUZZ, max_examples=25)
@given(edits=st.lists(EDITS, min_size=1, max_size=3), junk=st.booleans(), deep=st.booleans())
def test_load_for_inference_of_a_broken_checkpoint(
    checkpoint: Path, folder: Path, name: str, edits: list[Edit], junk: bool, deep: bool
) -> None:
    copy = folder / "broken-checkpoint"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(checkpoint, copy)
    data = (copy / name).read_bytes()
    for edit in edits:
        data = edit(data)
    (copy / name).write_bytes(DEEP_JSON if deep and name.endswith(".json") else b"\x00junk" if junk else data)
    raises_only(CheckpointError, lambda: load_model(copy))


@FUZZ
@given(data=broken(b"step-00000001\n"))
def test_load_for_inference_of_a_run_with_a_broken_latest_pointer(checkpoint: Path, folder: Path, data: bytes) -> None:
    run = folder / "run"
    if not run.exists():
        shutil.copytree(checkpoint, run / "checkpoints" / "step-00000001")
    (run / "checkpoints" / "latest").write_bytes(data)
    raises_only(CheckpointError, lambda: load_model(run))


def test_the_fuzzed_checkpoint_loads_when_intact(checkpoint: Path) -> None:
    loaded = load_model(checkpoint)
    assert loaded.task == "translation" and loaded.tokenizer.decode(loaded.tokenizer.encode("In the")) == "In the"


@pytest.mark.parametrize("name", ["tokenizer.json", "attn_tokenizer.json"])
@FUZZ
@given(data=st.binary(max_size=300))
@example(data=DEEP_JSON)
@example(data=b'["chars"]')
def test_tokenizer_load_of_random_bytes(checkpoint: Path, folder: Path, name: str, data: bytes) -> None:
    copy = folder / "tokenizer"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    for file in ("tokenizer.json", "attn_tokenizer.json"):
        shutil.copy(checkpoint / file, copy / file)
    (copy / name).write_bytes(data)
    raises_only(CheckpointError, lambda: Tokenizer.load(copy))
