"""Corpora of many files read as a stream, and the token cache: the same ids as whole-text
tokenization, reuse and rebuild, crash safety, and the same training windows as before."""

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attn.app.runs import load_run_config
from attn.data.batches import WindowBatches
from attn.data.lm_stream import LMStream
from attn.data.text import read_text
from attn.data.text_files import corpus_files, safe_cut, text_chunks
from attn.data.token_cache import id_dtype, open_token_cache, token_ids
from attn.data.tokenizers import Tokenizer
from attn.core.errors import ConfigError, DataFormatError
from attn.core.faults import FAULT_ENV
from attn.core.presets import preset
from attn.training.runconfig import RunConfig
from attn.training.task_data import TaskContext, lm_task, translation_task

ROOT = Path(__file__).parents[2]
SHAKESPEARE = ROOT / "data" / "shakespeare"
TEXT = read_text(SHAKESPEARE / "valid.txt")[:60_000]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode("utf-8")) if path.suffix == ".gz" else text.encode("utf-8"))
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[list[Path], str]:
    """Three files (one gzipped, one without a final line end) and the text they make together."""
    lines = TEXT.splitlines(keepends=True)
    parts = ["".join(lines[:600]), "".join(lines[600:1200]).rstrip("\n"), "".join(lines[1200:])]
    files = [write(tmp_path / "c" / name, part) for name, part in zip(("a.txt", "b.txt.gz", "c.txt"), parts)]
    return files, parts[0] + parts[1] + "\n" + parts[2]


TOKENIZERS = {
    "chars": lambda texts: Tokenizer.train_chars(texts),
    "bpe": lambda texts: Tokenizer.train_bpe(texts, 400),
    "byte-bpe": lambda texts: Tokenizer.train_bpe(texts, 400, byte_level=True),
}


# -- naming the files -------------------------------------------------------------------------


def test_a_corpus_is_named_by_files_directories_globs_lists_and_commas(tmp_path: Path) -> None:
    first, second = write(tmp_path / "t" / "a.txt.gz", "a\n"), write(tmp_path / "t" / "b.txt", "b\n")
    deep = write(tmp_path / "t" / "sub" / "c.txt", "c\n")
    write(tmp_path / "t" / ".hidden", "h\n")
    folder = str(tmp_path / "t")
    assert corpus_files(folder, "data.train") == [first, second, deep]  # every file below, by path; no hidden one
    assert corpus_files(f"{folder}/**/*.txt", "data.train") == [second, deep]
    assert corpus_files([str(deep), folder], "data.train") == [deep, first, second]
    assert corpus_files(f"{deep}, {first}", "data.train") == [deep, first]
    assert corpus_files(f"{first},{first}", "data.train") == [first]  # a file named twice is read once


def test_naming_nothing_readable_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.train: the pattern '.*/\*.txt' matches no file"):
        corpus_files(str(tmp_path / "*.txt"), "data.train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"data.valid: the directory '.*empty' holds no file"):
        corpus_files(str(tmp_path / "empty"), "data.valid")
    with pytest.raises(ConfigError, match=r"data.train: .*nowhere.txt: no such file or directory"):
        corpus_files(str(tmp_path / "nowhere.txt"), "data.train")
    with pytest.raises(ConfigError, match="data.train: is not set"):
        corpus_files(["", " "], "data.train")
    empty = [write(tmp_path / "e.txt", ""), write(tmp_path / "f.txt.gz", "")]
    with pytest.raises(DataFormatError, match=r"e.txt: the corpus \(2 files: this one and 1 more\) holds no text"):
        list(text_chunks(empty))


def test_reading_errors_name_the_file_and_line_however_far_in(tmp_path: Path) -> None:
    lines = "".join(f"line {i} of the text\n" for i in range(1, 1500)).encode()
    bad = tmp_path / "bad.txt"
    bad.write_bytes(lines + b"caf\xe9\n")
    with pytest.raises(DataFormatError, match=r"bad.txt:1500: invalid UTF-8 \(byte 0xe9\)"):
        list(text_chunks([bad], chunk_chars=1000))
    binary = write(tmp_path / "binary.txt", "fine\n" * 3000 + "\x00\n")
    with pytest.raises(DataFormatError, match="binary.txt:3001: contains a NUL byte"):
        list(text_chunks([binary], chunk_chars=1000))
    broken = tmp_path / "broken.txt.gz"
    broken.write_bytes(gzip.compress(lines)[:200])
    with pytest.raises(DataFormatError, match="broken.txt.gz: is not a valid gzip file"):
        list(text_chunks([broken]))


def test_a_byte_order_mark_is_dropped_at_the_start_of_each_file_only(tmp_path: Path) -> None:
    first, second = write(tmp_path / "a.txt", "\ufeffone\n"), write(tmp_path / "b.txt.gz", "\ufefftwo \ufeff2")
    assert "".join(text_chunks([first, second])) == "one\ntwo \ufeff2"


def test_only_the_language_model_reads_a_list_of_files(tmp_path: Path) -> None:
    assert RunConfig().override("task=lm", 'data.train=["a.txt", "b"]').data.train == ("a.txt", "b")
    assert RunConfig().override("task=lm", "data.train=a.txt,b").data.train == "a.txt,b"
    config = RunConfig().override(f"run_dir={tmp_path}", 'data.train=["a.tsv", "b.tsv"]')
    with pytest.raises(ConfigError, match="data.train: a list of files is read by the lm task only"):
        translation_task(config, preset("paper-base-tiny"), TaskContext())
    with pytest.raises(ConfigError, match=r"data.train: expected a path or a list of paths, got \[1\]"):
        RunConfig().override("task=lm", "data.train=[1]")


# -- the same ids as the whole text -----------------------------------------------------------


def test_the_pieces_make_the_whole_text(corpus) -> None:
    files, whole = corpus
    pieces = list(text_chunks(files, chunk_chars=500))
    assert "".join(pieces) == whole and len(pieces) > 50 and all(pieces)
    assert all(piece[0] == " " and piece[1].isalnum() for piece in pieces[1:])
    assert "".join(text_chunks(files, cut_anywhere=True, chunk_chars=777)) == whole


def test_safe_cut_is_before_a_space_that_a_letter_or_digit_follows() -> None:
    assert safe_cut("to be or not") == 8
    assert safe_cut("end.\n 2 of them  ") == 10
    assert safe_cut("a  ,  \n") == 0
    assert safe_cut("nospace") == 0


@pytest.mark.parametrize("kind", list(TOKENIZERS))
def test_streamed_tokenizer_and_ids_equal_whole_text_ones(corpus, tmp_path: Path, kind: str) -> None:
    files, whole = corpus
    tokenizer = TOKENIZERS[kind]([whole])
    streamed = TOKENIZERS[kind](text_chunks(files, cut_anywhere=kind == "chars", chunk_chars=300))
    assert streamed.digest() == tokenizer.digest()
    ids = token_ids(files, tokenizer, tmp_path / "cache" / "train")
    assert ids.dtype == np.dtype("uint8" if kind == "chars" else "uint16")
    assert ids.tolist() == tokenizer.encode(whole)
    pieces = text_chunks(files, cut_anywhere=kind == "chars", chunk_chars=300)
    assert [i for piece in tokenizer.encode_batch(list(pieces)) for i in piece] == tokenizer.encode(whole)


@pytest.mark.parametrize(("vocab", "dtype"), [(2, "uint8"), (256, "uint8"), (257, "uint16"), (65_536, "uint16"),
                                              (65_537, "uint32"), (2**32, "uint32")])
def test_ids_take_the_smallest_unsigned_type_that_holds_the_vocabulary(vocab: int, dtype: str) -> None:
    assert id_dtype(vocab) == np.dtype(dtype)


# -- reuse, rebuild, rejection ----------------------------------------------------------------


def cache_identity(stem: Path) -> int:
    """Changes whenever the ids file is written again (a new file is renamed over it)."""
    return stem.with_name(stem.name + ".tokens").stat().st_ino


def test_the_cache_is_reused_until_the_corpus_or_tokenizer_changes(corpus, tmp_path: Path) -> None:
    files, whole = corpus
    stem = tmp_path / "cache" / "train"
    chars = Tokenizer.train_chars([whole])
    token_ids(files, chars, stem)
    built = cache_identity(stem)
    manifest = json.loads(stem.with_suffix(".json").read_text())
    assert manifest["tokens"] == len(whole) and manifest["dtype"] == "uint8"
    assert [f["path"] for f in manifest["files"]] == [str(f.resolve()) for f in files]
    assert token_ids(files, Tokenizer.train_chars([whole]), stem).tolist() == chars.encode(whole)
    assert cache_identity(stem) == built  # same files, an equal tokenizer: reused
    stat = files[2].stat()
    os.utime(files[2], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    token_ids(files, chars, stem)
    assert cache_identity(stem) != built  # a newer file: rebuilt
    rebuilt = cache_identity(stem)
    bpe = Tokenizer.train_bpe([whole], 400)
    assert token_ids(files, bpe, stem).tolist() == bpe.encode(whole)
    assert cache_identity(stem) != rebuilt  # another tokenizer: rebuilt
    two = files[0].read_text() + gzip.decompress(files[1].read_bytes()).decode()
    assert token_ids(files[:2], bpe, stem).tolist() == bpe.encode(two)  # other files


def test_a_cache_that_contradicts_its_tokenizer_is_rejected(corpus, tmp_path: Path) -> None:
    files, whole = corpus
    stem = tmp_path / "cache" / "train"
    chars = Tokenizer.train_chars([whole])
    token_ids(files, chars, stem)
    with pytest.raises(DataFormatError, match="train.json: the cache has tokenizer '[0-9a-f]{64}', but the "
                                              "tokenizer reading it needs"):
        open_token_cache(stem, Tokenizer.train_bpe([whole], 400))
    manifest = stem.with_suffix(".json")
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "dtype": "uint16"}))
    with pytest.raises(DataFormatError, match="the cache has dtype 'uint16', but the tokenizer reading it needs "
                                              "'uint8'; delete .*train.\\* to have it built again"):
        token_ids(files, chars, stem)
    manifest.write_text(json.dumps({**data, "tokens": data["tokens"] + 1}))
    with pytest.raises(DataFormatError, match=f"the manifest counts {data['tokens'] + 1} ids, but train.tokens holds "
                                              f"{data['tokens']} bytes of uint8"):
        token_ids(files, chars, stem)


BUILD = """
import sys
from pathlib import Path
from attn.data.text_files import corpus_files
from attn.data.token_cache import token_ids
from attn.data.tokenizers import Tokenizer
token_ids(corpus_files(sys.argv[1], "data.train"), Tokenizer.load(sys.argv[2]), Path(sys.argv[3]))
"""


@pytest.mark.parametrize("arrival", [1, 2])  # killed before renaming the ids file, or the manifest
def test_a_build_killed_midway_is_never_trusted(corpus, tmp_path: Path, arrival: int) -> None:
    files, whole = corpus
    stem = tmp_path / "cache" / "train"
    tokenizer = Tokenizer.train_chars([whole + "#"])
    tokenizer.save(tmp_path / "tokenizer")
    token_ids(files, tokenizer, stem)
    old = files[0].read_bytes(), files[0].stat()
    files[0].write_text("# a changed first file\n", encoding="utf-8")
    env = {**os.environ, FAULT_ENV: f"token-cache-write:{arrival}"}
    killed = subprocess.run([sys.executable, "-c", BUILD, str(files[0].parent), str(tmp_path / "tokenizer"), str(stem)],
                            env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not stem.with_suffix(".json").exists() and list(stem.parent.glob(".train.*.tmp"))
    # The first file back as it was, to the nanosecond: only a manifest left over from before could
    # claim the cache is current; there is none, so it is built again.
    files[0].write_bytes(old[0])
    os.utime(files[0], ns=(old[1].st_atime_ns, old[1].st_mtime_ns))
    assert token_ids(files, tokenizer, stem).tolist() == tokenizer.encode(whole)
    assert not list(stem.parent.glob(".train.*.tmp"))


# -- training windows -------------------------------------------------------------------------


def test_memory_mapped_windows_equal_in_memory_ones(corpus, tmp_path: Path) -> None:
    files, whole = corpus
    tokenizer = Tokenizer.train_bpe([whole], 400)
    mapped = LMStream(token_ids(files, tokenizer, tmp_path / "cache" / "train"), 32, seed=5)
    in_memory = LMStream(torch.tensor(tokenizer.encode(whole)), 32, seed=5)
    for _ in range(3):
        for a, b in zip(mapped.sample(6), in_memory.sample(6)):
            assert a.dtype == torch.long and torch.equal(a, b)
    for (x, y), (u, v) in zip(mapped.eval_blocks(7), in_memory.eval_blocks(7), strict=True):
        assert torch.equal(x, u) and torch.equal(y, v)


def test_the_quickstart_draws_the_batches_it_drew_before(tmp_path: Path) -> None:
    """The shipped LM's first batches, from the cache, equal windows of the whole text's ids drawn as
    LMStream drew them when it held the whole stream in memory."""
    config = load_run_config("configs/quickstart-lm.toml", [f"run_dir={tmp_path}", "data.valid=", "train.quiet=true"])
    task = lm_task(config, config.model_config(), TaskContext())
    text = read_text(SHAKESPEARE / "train.txt.gz")
    assert task.tokenizer.digest() == Tokenizer.train_chars([text]).digest()
    ids = torch.tensor(task.tokenizer.encode(text))
    generator = torch.Generator().manual_seed(config.train.seed)
    batch, block = config.batch.batch_size, config.batch.block_size
    for _ in range(3):
        starts = torch.randint(len(ids) - block, (batch,), generator=generator)
        offsets = starts[:, None] + torch.arange(block)
        drawn = task.train.next_batch()
        assert torch.equal(drawn.inputs[0], ids[offsets]) and torch.equal(drawn.targets, ids[offsets + 1])


def test_windows_of_a_cached_corpus_resume_exactly(corpus, tmp_path: Path) -> None:
    files, _ = corpus
    spec = [str(files[0]), f"{files[1].parent}/[bc].*"]
    config = RunConfig().override("task=lm", f"run_dir={tmp_path / 'run'}", f"data.train={json.dumps(spec)}",
                                  "tokenizer.kind=chars", "batch.block_size=16", "batch.batch_size=4", "train.seed=3")
    first = lm_task(config, preset("char-gpt-tiny"), TaskContext()).train
    for _ in range(5):
        first.next_batch()
    state = first.state_dict()
    expected = [first.next_batch().inputs[0] for _ in range(3)]
    second = lm_task(config, preset("char-gpt-tiny"), TaskContext()).train
    assert isinstance(second, WindowBatches) and isinstance(second.stream.ids, np.memmap)
    second.load_state_dict(state)
    assert all(torch.equal(second.next_batch().inputs[0], x) for x in expected)
