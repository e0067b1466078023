"""Training tokenizers from files (`attn.data.tokenizer_training`), and what `Tokenizer.load` reads besides
its own directories: a Hugging Face `tokenizer.json` and a SentencePiece model file."""

from __future__ import annotations

import gzip
import io
import json
import random
import tracemalloc
import unicodedata
from pathlib import Path

import pytest
import sentencepiece
import tokenizers as hf
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from attn.data.files import input_files
from attn.data.readers import load_parallel
from attn.data.tokenizer_kinds import TRAINED_KINDS
from attn.data.tokenizer_training import train_tokenizer_files
from attn.data.tokenizers import Tokenizer
from attn.core.errors import CheckpointError, ConfigError, DataFormatError
from attn.training.task_data import special_ids

DATA = Path(__file__).resolve().parents[2] / "data"
LINES = 300
VOCAB = {"bpe": 400, "byte-bpe": 400, "wordpiece": 300, "unigram": 300, "chars": 0}


@pytest.fixture(scope="module")
def bible_lines() -> list[str]:
    """300 English and 300 Spanish verses of the shipped validation file."""
    corpus = load_parallel(DATA / "bible-en-es" / "valid.tsv")
    return corpus.sources[:LINES] + corpus.targets[:LINES]


@pytest.fixture
def text_file(tmp_path: Path, bible_lines: list[str]) -> Path:
    path = tmp_path / "train.txt"
    path.write_text("".join(f"{line}\n" for line in bible_lines), encoding="utf-8")
    return path


def bert_normal_form(text: str) -> str:
    """Lower case, NFD without accents and control characters, no whitespace: uncased BERT's text."""
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in decomposed if unicodedata.category(c) not in ("Mn", "Cc", "Cf") and not c.isspace())


# -- every kind -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TRAINED_KINDS)
def test_each_kind_trains_from_a_file_saves_loads_and_round_trips(
    kind: str, text_file: Path, bible_lines: list[str], tmp_path: Path
) -> None:
    trained = train_tokenizer_files(kind, [str(text_file)], VOCAB[kind], tmp_path / "tok")
    assert (trained.files, trained.lines, trained.output) == ((text_file,), 2 * LINES, tmp_path / "tok")
    loaded = Tokenizer.load(tmp_path / "tok")
    assert (loaded.kind, loaded.vocab_size) == (kind, trained.tokenizer.vocab_size)
    assert kind == "chars" or loaded.vocab_size == VOCAB[kind]
    ids = loaded.encode_batch(bible_lines)
    assert ids == trained.tokenizer.encode_batch(bible_lines)
    assert loaded.unk_id not in {i for seq in ids for i in seq}
    decoded = loaded.decode_batch(ids)
    if kind == "wordpiece":
        assert [bert_normal_form(t) for t in decoded] == [bert_normal_form(t) for t in bible_lines]
    else:  # the verses are NFC and start with no space: every other kind gives them back exactly
        assert decoded == bible_lines
    specials = ["<pad>", "<unk>", "<s>", "</s>", "<cls>", "<sep>", "<mask>"]
    if kind == "wordpiece":
        specials = ["[PAD]", "[UNK]", "<s>", "</s>", "[CLS]", "[SEP]", "[MASK]"]
    assert [loaded.id_to_token(i) for i in loaded.roles.values()] == specials
    assert list(loaded.roles.values()) == list(range(7))


def test_unigram_is_the_unigram_model_of_tokenizers_and_keeps_to_the_vocabulary_size(
    text_file: Path, tmp_path: Path
) -> None:
    for size in (120, 250, 500):
        trained = train_tokenizer_files("unigram", [str(text_file)], size, tmp_path / str(size))
        assert trained.tokenizer.vocab_size == size
        model = json.loads((tmp_path / str(size) / "tokenizer.json").read_text(encoding="utf-8"))["model"]
        assert model["type"] == "Unigram" and len(model["vocab"]) == size
        # A unigram model scores each piece with a log probability; the special tokens score 0.
        assert all(score < 0 for _, score in model["vocab"][7:]) and {s for _, s in model["vocab"][:7]} == {0.0}


def test_unigram_needs_room_for_every_character(tmp_path: Path) -> None:
    # Characters: a b c d e, the word marker that replaces the space, and the line end: 7.
    path = tmp_path / "abc.txt"
    path.write_text("abc cab bad\nace dab\nbed cede\n" * 20, encoding="utf-8")
    with pytest.raises(ConfigError, match="the 7 distinct characters .* needs at least 15; raise it"):
        train_tokenizer_files("unigram", [str(path)], 14, tmp_path / "small")
    assert not (tmp_path / "small").exists()
    tokenizer = train_tokenizer_files("unigram", [str(path)], 15, tmp_path / "fits").tokenizer
    assert tokenizer.vocab_size <= 15
    assert tokenizer.decode(tokenizer.encode("bad cab\n")) == "bad cab\n"


# -- inputs -----------------------------------------------------------------------------------


def test_inputs_are_files_directories_globs_and_gzip(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "more").mkdir(parents=True)
    (corpus / "a.txt").write_text("alpha\n", encoding="utf-8")
    (corpus / "more" / "b.txt.gz").write_bytes(gzip.compress("beta\r\ngamma\n".encode()))
    (corpus / ".hidden.txt").write_text("hidden\n", encoding="utf-8")
    (tmp_path / "c.text").write_text("delta", encoding="utf-8")
    files = input_files([str(corpus), str(tmp_path / "*.text"), str(corpus / "a.txt")])
    assert files == [corpus / "a.txt", corpus / "more" / "b.txt.gz", tmp_path / "c.text"]
    assert input_files([str(tmp_path / "**" / "*.gz")]) == [corpus / "more" / "b.txt.gz"]
    trained = train_tokenizer_files("chars", [str(corpus), str(tmp_path / "*.text")], 0, tmp_path / "tok")
    assert trained.lines == 4
    alphabet = {trained.tokenizer.id_to_token(i) for i in range(7, trained.tokenizer.vocab_size)}
    assert alphabet == set("alphabetgammadelta\n")  # the \r of a Windows line end is dropped


def test_fields_of_tables_are_the_texts(tmp_path: Path) -> None:
    """--field reads named fields of CSV and JSON Lines files: the alphabet is that of those fields only."""
    (tmp_path / "a.csv").write_text('de,en,note\n"Haus, groß",house,xq\nBaum,tree,xq\n', encoding="utf-8")
    rows = [{"de": "Zug", "en": "train", "note": "zz"}]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    inputs = [str(tmp_path / "a.csv"), str(tmp_path / "b.jsonl")]
    trained = train_tokenizer_files("chars", inputs, 0, tmp_path / "tok", fields=["de", "en"])
    assert trained.lines == 6
    alphabet = {trained.tokenizer.id_to_token(i) for i in range(7, trained.tokenizer.vocab_size)}
    assert alphabet == set("Haus, großhouseBaumtreeZugtrain")
    with pytest.raises(DataFormatError, match="no field 'fr' \\(--field fr\\); the fields here are: de, en, note"):
        train_tokenizer_files("chars", inputs, 0, tmp_path / "tok2", fields=["fr"])
    (tmp_path / "c.txt").write_text("plain\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="is not a table"):
        train_tokenizer_files("chars", [str(tmp_path / "c.txt")], 0, tmp_path / "tok3", fields=["de"])


def test_inputs_are_streamed_line_by_line(tmp_path: Path) -> None:
    """A 4 MB file trains a tokenizer with well under 1 MB of Python memory: it is never read whole."""
    verses = load_parallel(DATA / "bible-en-es" / "valid.tsv").sources[:200]
    path = tmp_path / "big.txt"
    path.write_text("".join(f"{verse}\n" for verse in verses) * 200, encoding="utf-8")
    assert path.stat().st_size > 4_000_000
    tracemalloc.start()
    try:
        trained = train_tokenizer_files("byte-bpe", [str(path)], 300, tmp_path / "tok")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert trained.lines == 40_000 and peak < 1_000_000


@pytest.mark.parametrize("patterns, message", [
    ([], "inputs: no input files given"),
    (["{tmp}/nothing-*.txt"], "the pattern '{tmp}/nothing-*.txt' matches no file"),
    (["{tmp}/missing.txt"], "inputs: {tmp}/missing.txt: no such file or directory"),
    (["{tmp}/empty"], "the directory '{tmp}/empty' holds no file"),
])
def test_inputs_that_name_nothing_are_refused(tmp_path: Path, patterns: list[str], message: str) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as caught:
        train_tokenizer_files("bpe", [p.format(tmp=tmp_path) for p in patterns], 100, tmp_path / "tok")
    assert message.format(tmp=tmp_path) in str(caught.value)


def test_input_errors_name_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes(b"fine\ncaf\xe9\n")
    with pytest.raises(DataFormatError, match=r"latin1.txt:2: invalid UTF-8 \(byte 0xe9\)"):
        train_tokenizer_files("bpe", [str(tmp_path / "latin1.txt")], 100, tmp_path / "tok")
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"some text\n" * 1000)[:40])
    with pytest.raises(DataFormatError, match="cut.txt.gz: is not a valid gzip file"):
        train_tokenizer_files("bpe", [str(tmp_path / "cut.txt.gz")], 100, tmp_path / "tok")
    (tmp_path / "blank.txt").write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="the training texts are empty"):
        train_tokenizer_files("bpe", [str(tmp_path / "blank.txt")], 100, tmp_path / "tok")
    assert not (tmp_path / "tok").exists()


def test_unknown_kind_and_small_vocabulary_name_the_choices(text_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown kind 'spm'; choose one of bpe, byte-bpe, wordpiece, unigram, chars"):
        train_tokenizer_files("spm", [str(text_file)], 100, tmp_path / "tok")
    with pytest.raises(ConfigError, match="vocab_size: is 200, must be at least 264"):
        train_tokenizer_files("byte-bpe", [str(text_file)], 200, tmp_path / "tok")


# -- the output directory ---------------------------------------------------------------------


def test_output_in_the_way_is_refused_unless_forced(text_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "tok"
    first = train_tokenizer_files("chars", [str(text_file)], 0, out).tokenizer
    with pytest.raises(ConfigError, match="already holds a tokenizer; give a new directory, or replace it with --force"):
        train_tokenizer_files("bpe", [str(text_file)], 100, out)
    assert Tokenizer.load(out).kind == "chars"
    train_tokenizer_files("bpe", [str(text_file)], 100, out, force=True)
    assert Tokenizer.load(out).kind == "bpe" and first.kind == "chars"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok", "train.txt"]  # nothing left beside it
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(ConfigError, match="holds files that are not a tokenizer"):
        train_tokenizer_files("bpe", [str(text_file)], 100, tmp_path / "notes", force=True)
    with pytest.raises(ConfigError, match="is a file; give a directory path"):
        train_tokenizer_files("bpe", [str(text_file)], 100, text_file)
    (tmp_path / "empty").mkdir()
    train_tokenizer_files("chars", [str(text_file)], 0, tmp_path / "empty")
    assert Tokenizer.load(tmp_path / "empty").kind == "chars"


def test_a_failed_write_leaves_the_previous_directory(
    text_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "tok"
    train_tokenizer_files("chars", [str(text_file)], 0, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def save_then_fail(self: Tokenizer, folder: Path) -> None:
        (Path(folder) / "tokenizer.json").write_text("{half", encoding="utf-8")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Tokenizer, "save", save_then_fail)
    for target, force in ((out, True), (tmp_path / "new", False)):
        with pytest.raises(OSError, match="No space left"):
            train_tokenizer_files("bpe", [str(text_file)], 100, target, force=force)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok", "train.txt"]


# -- loading a Hugging Face tokenizer.json ----------------------------------------------------


def hf_tokenizer(bible_lines: list[str], specials: list[str]) -> hf.Tokenizer:
    """A byte-level BPE trained by `tokenizers` itself, with `specials` as its special tokens."""
    tokenizer = hf.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(bible_lines, trainer)
    return tokenizer


@pytest.mark.parametrize("where", ["file", "directory"])
def test_a_hugging_face_tokenizer_json_loads_with_its_roles(
    bible_lines: list[str], tmp_path: Path, where: str
) -> None:
    reference = hf_tokenizer(bible_lines, ["[UNK]", "<|endoftext|>", "[PAD]", "[MASK]"])
    reference.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A <|endoftext|>", special_tokens=[("<|endoftext|>", 1)])
    reference.save(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer.load(tmp_path / "tokenizer.json" if where == "file" else tmp_path)
    assert ours.kind == "file" and ours.vocab_size == reference.get_vocab_size()
    assert ours.roles == {"pad": 2, "unk": 0, "bos": 1, "eos": 1, "cls": None, "sep": None, "mask": 3}
    for add_special in (False, True):
        expected = [e.ids for e in reference.encode_batch(bible_lines[:50], add_special_tokens=add_special)]
        assert ours.encode_batch(bible_lines[:50], add_special=add_special) == expected
    assert ours.decode_batch(expected) == reference.decode_batch(expected)


def test_a_task_names_every_role_the_tokenizer_lacks(bible_lines: list[str], tmp_path: Path) -> None:
    hf_tokenizer(bible_lines, ["[PAD]", "[UNK]"]).save(str(tmp_path / "tokenizer.json"))
    tokenizer = Tokenizer.load(tmp_path / "tokenizer.json")
    assert special_ids(tokenizer, "pad") == (0,)
    with pytest.raises(ConfigError) as caught:
        special_ids(tokenizer, "pad", "bos", "eos", source=str(tmp_path / "tokenizer.json"))
    message = str(caught.value)
    assert message.startswith(f"tokenizer.path: {tmp_path / 'tokenizer.json'} has no bos, eos token, which this "
                              "task needs (it needs pad, bos, eos)")
    assert "bos: <s> or <|endoftext|>; eos: </s> or <|endoftext|>" in message


def test_load_says_what_it_reads_when_nothing_is_there(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no tokenizer there; give a directory written by `attn tokenizer train`"):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match="tokenizer.json: cannot be read as a tokenizer file"):
        Tokenizer.load(tmp_path)
    (tmp_path / "broken.model").write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="broken.model: not a SentencePiece model"):
        Tokenizer.load(tmp_path / "broken.model")


# -- loading a SentencePiece model ------------------------------------------------------------


@pytest.fixture(scope="module")
def spm_model(bible_lines: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SentencePiece unigram model trained by `sentencepiece` itself on the verses, with a pad piece
    and the control symbols of the other roles."""
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(bible_lines), model_writer=proto, vocab_size=500, pad_id=3,
        control_symbols=["<cls>", "<sep>", "<mask>"], minloglevel=2)
    path = tmp_path_factory.mktemp("spm") / "bible.model"
    path.write_bytes(proto.getvalue())
    return path


def test_a_sentencepiece_model_encodes_and_decodes_as_sentencepiece(
    spm_model: Path, bible_lines: list[str]
) -> None:
    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    ours = Tokenizer.load(spm_model)
    texts = [*bible_lines, "Héllo  wörld 😀 ½", "", "  leading and trailing  "]
    assert ours.kind == "sentencepiece" and ours.vocab_size == processor.get_piece_size() == 500
    assert ours.encode_batch(texts) == processor.encode(texts, out_type=int)
    assert ours.encode_batch(texts, add_special=True) == processor.encode(texts, out_type=int, add_bos=True,
                                                                           add_eos=True)
    assert [ours.id_to_token(i) for i in range(500)] == [processor.id_to_piece(i) for i in range(500)]
    assert ours.token_to_id("▁the") == processor.piece_to_id("▁the") and ours.token_to_id("no such") is None
    unk = processor.unk_id()
    draw = random.Random(0)
    sequences = processor.encode(texts, out_type=int)
    sequences += [[draw.randrange(500) for _ in range(draw.randrange(20))] for _ in range(200)]
    for ids in sequences:
        known = [i for i in ids if i != unk]  # SentencePiece writes ⁇ for unk, which decoding skips
        assert ours.decode(ids) == processor.decode(known), ids
    assert ours.decode_batch(sequences[:5]) == [processor.decode(ids) for ids in sequences[:5]]
    verse = processor.encode(bible_lines[0], out_type=int)
    framed = [processor.bos_id(), *verse, processor.eos_id(), unk]
    assert ours.decode(framed, skip_special=False) == f"<s> {processor.decode(verse)}</s><unk>"


def test_a_sentencepiece_model_has_its_roles_and_saves_byte_for_byte(spm_model: Path, tmp_path: Path) -> None:
    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    ours = Tokenizer.load(spm_model)
    assert ours.roles == {"pad": processor.pad_id(), "unk": processor.unk_id(), "bos": processor.bos_id(),
                          "eos": processor.eos_id(), "cls": processor.piece_to_id("<cls>"),
                          "sep": processor.piece_to_id("<sep>"), "mask": processor.piece_to_id("<mask>")}
    assert ours.roles == {"pad": 3, "unk": 0, "bos": 1, "eos": 2, "cls": 4, "sep": 5, "mask": 6}
    ours.save(tmp_path / "saved")
    assert (tmp_path / "saved" / "sentencepiece.model").read_bytes() == spm_model.read_bytes()
    again = Tokenizer.load(tmp_path / "saved")
    assert again.kind == "sentencepiece" and again.encode("In the beginning") == ours.encode("In the beginning")
    renamed = tmp_path / "source.spm"
    renamed.write_bytes(spm_model.read_bytes())
    assert Tokenizer.load(renamed).encode("In the beginning") == ours.encode("In the beginning")
