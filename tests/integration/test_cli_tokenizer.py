"""`attn tokenizer train` and `attn tokenizer encode` end to end, and runs whose `tokenizer.path` names a
trained directory, a Hugging Face tokenizer.json or a SentencePiece model."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import sentencepiece
import tokenizers as hf
from cli_helpers import ROOT, run_cli
from tokenizers import decoders, models, pre_tokenizers, trainers

from attn.app.cli import main
from attn.artifacts import load_model
from attn.data.readers import load_parallel
from attn.data.tokenizers import Tokenizer
from attn.core.faults import FAULT_ENV

VALID = ROOT / "data" / "bible-en-es" / "valid.tsv"
RUN = """task = "translation"
[data]
train = "{train}"
[tokenizer]
path = "{tokenizer}"
[model]
preset = "paper-base-tiny"
[batch]
max_tokens = 512
[train]
max_steps = 2
eval_interval = 0
checkpoint_interval = 0
quiet = true
device = "cpu"
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 verse pairs as a translation TSV, and their 120 texts, one per line, in `texts/` (half gzipped)."""
    folder = tmp_path_factory.mktemp("corpus")
    lines = VALID.read_text(encoding="utf-8").splitlines(keepends=True)[:61]
    (folder / "pairs.tsv").write_text("".join(lines), encoding="utf-8")
    pairs = load_parallel(folder / "pairs.tsv")
    (folder / "texts").mkdir()
    (folder / "texts" / "en.txt").write_text("".join(f"{t}\n" for t in pairs.sources), encoding="utf-8")
    (folder / "texts" / "es.txt").write_text("".join(f"{t}\n" for t in pairs.targets), encoding="utf-8")
    return folder


def test_train_then_encode(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "tok"
    result = run_cli("tokenizer", "train", "--kind", "unigram", "--vocab-size", "200", "--output", str(out),
                     str(corpus / "texts" / "*.txt"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "trained a unigram tokenizer on 120 texts of 2 file(s)",
        "vocabulary size: 200",
        "special tokens: pad=<pad> (0), unk=<unk> (1), bos=<s> (2), eos=</s> (3), cls=<cls> (4), sep=<sep> (5), "
        "mask=<mask> (6)",
        f'wrote {out}; load it with tokenizer.path = "{out}"',
    ]
    text = "In the beginning was the Word."
    result = run_cli("tokenizer", "encode", "--tokenizer", str(out), "--add-special", text)
    assert result.returncode == 0, result.stderr
    tokens_line, ids_line = result.stdout.splitlines()
    tokens, ids = json.loads(tokens_line.removeprefix("tokens: ")), json.loads(ids_line.removeprefix("ids: "))
    assert tokens[0] == "<s>" and tokens[-1] == "</s>"
    assert "".join(tokens[1:-1]).replace("▁", " ").strip() == text  # the pieces spell the text
    tokenizer = Tokenizer.load(out)
    assert ids == [tokenizer.token_to_id(t) for t in tokens]


def test_an_interrupted_train_leaves_the_previous_tokenizer(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed (SIGKILL) with every file written but before the rename: no half-written directory."""
    args = ("tokenizer", "train", "--kind", "bpe", "--vocab-size", "150", str(corpus / "texts"), "--output")
    monkeypatch.setenv(FAULT_ENV, "tokenizer-write:1")
    assert run_cli(*args, str(tmp_path / "new")).returncode == -9
    assert not (tmp_path / "new").exists()
    monkeypatch.delenv(FAULT_ENV)
    assert main(["tokenizer", "train", "--kind", "chars", str(corpus / "texts"), "--output", str(tmp_path / "old")]) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()}
    monkeypatch.setenv(FAULT_ENV, "tokenizer-write:1")
    assert run_cli(*args, str(tmp_path / "old"), "--force").returncode == -9
    assert {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()} == before


# -- tokenizer.path in a run config -----------------------------------------------------------


def trained_directory(corpus: Path, folder: Path) -> Path:
    assert main(["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", str(corpus / "texts"),
                 "--output", str(folder / "trained")]) == 0
    return folder / "trained"


def hugging_face_json(corpus: Path, folder: Path) -> Path:
    """A byte-level BPE trained by `tokenizers` itself, with GPT-2's single `<|endoftext|>` and a pad."""
    tokenizer = hf.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<pad>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((corpus / "texts" / "en.txt").read_text(encoding="utf-8").splitlines(), trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def sentencepiece_model(corpus: Path, folder: Path) -> Path:
    proto = io.BytesIO()
    texts = [line for path in sorted((corpus / "texts").iterdir()) for line in path.read_text("utf-8").splitlines()]
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=proto, vocab_size=300,
                                             pad_id=3, minloglevel=2)
    (folder / "bible.model").write_bytes(proto.getvalue())
    return folder / "bible.model"


@pytest.mark.parametrize("make, kind", [(trained_directory, "bpe"), (hugging_face_json, "file"),
                                        (sentencepiece_model, "sentencepiece")],
                         ids=["trained-directory", "huggingface-json", "sentencepiece-model"])
def test_a_run_trains_with_the_tokenizer_at_tokenizer_path(corpus: Path, tmp_path: Path, make, kind: str) -> None:
    source = make(corpus, tmp_path)
    config = tmp_path / "run.toml"
    config.write_text(RUN.format(train=corpus / "pairs.tsv", tokenizer=source), encoding="utf-8")
    assert main(["train", "--config", str(config), f"run_dir={tmp_path / 'run'}"]) == 0
    original, bundle = Tokenizer.load(source), load_model(tmp_path / "run", "cpu")
    texts = load_parallel(corpus / "pairs.tsv").targets[:20]
    assert bundle.tokenizer.kind == kind
    assert bundle.tokenizer.encode_batch(texts) == original.encode_batch(texts)
    assert bundle.model_config.vocab_size == original.vocab_size
    assert (bundle.pad_id, bundle.eos_id) == (original.pad_id, original.eos_id)
