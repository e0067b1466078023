"""Marian from text to text: attn against `MarianTokenizer` + `MarianMTModel.generate`.

The test trains its own SentencePiece models (English source, Spanish target, on the shipped
Bible corpus), builds `vocab.json` from their pieces as opus-mt models have it (`</s>` 0,
`<unk>` 1, `<pad>` last), and saves a tokenizer and a tiny random model as an opus-mt directory
(generation_config.json bans the pad id). The model's output bias favours the pad id, so
without the ban it would write nothing else, and a random model never ends on its own, so EOS
is forced at the length limit: every Marian rule decides the text.
"""

import csv
import dataclasses
import gzip
import io
import json
import random
from pathlib import Path

import pytest
import sentencepiece
import torch
from transformers import MarianConfig, MarianMTModel, MarianTokenizer

from attn.inference.attention_views import attention_layers
from attn.app.cli import main
from attn.inference.translation import translate, translate_hypotheses, translate_n_best
from attn.artifacts import load_model
from attn.artifacts.pretrained import load_pretrained
from attn.artifacts.pretrained.decoding import DecodingRules
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig
from attn.decoding.beam_search import huggingface_config
from attn.core.errors import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

ROOT = Path(__file__).resolve().parents[2]
LINES = 300
NEW_TOKENS = 20
PAD_BIAS = 6.0  # enough for the pad id to win every step when it is not banned
SOURCES = ["In the beginning was the Word.", "Jesus wept.", "Let there be light, said God; and there was light!",
           "Héllo wörld, 1234 ☃ 😀 ½ «x» — fin"]
# Accents, punctuation, digits, characters neither model has, emoji, full-width and compatibility
# forms (SentencePiece's NFKC), runs of spaces, tabs and newlines, the special tokens' text, and
# language codes (kept whole at the start of a chunk).
TEXTS = ["Héllo, wörld! 123 Ω ⅷ  😀 </s> x<unk>y", "  In the   beginning, God\tcreated\n", "", "ﬁ ＡＢＣ",
         ">>es<< Jesus wept.", ">>es<<", "a<pad>b</s></s>", "¿Qué? ¡Sí! «citas» — 3,14 … ½", "日本語 테스트 ☃",
         "Y dijo Dios: Sea la luz: y fué la luz."]


def bible(column: str) -> list[str]:
    with gzip.open(ROOT / "data/bible-en-es/train.tsv.gz", "rt", encoding="utf-8") as file:
        rows = csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row[column] for _, row in zip(range(LINES), rows)]


def train_spm(lines: list[str], vocab_size: int = 300):
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                             vocab_size=vocab_size, minloglevel=2)
    return model.getvalue()


def marian_vocab(*models: bytes) -> dict[str, int]:
    """Every piece of the models but their control and unknown pieces; `</s>` 0, `<unk>` 1, `<pad>` last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for proto in models:
        processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
        for i in range(processor.get_piece_size()):
            if not (processor.is_control(i) or processor.is_unknown(i)):
                vocab.setdefault(processor.id_to_piece(i), len(vocab))
    return {**vocab, "<pad>": len(vocab)}


@pytest.fixture(scope="module")
def opus_mt(tmp_path_factory) -> Path:
    """A Marian directory as opus-mt ships them: config, weights, generation settings, spm models, vocab."""
    folder = tmp_path_factory.mktemp("marian") / "opus-mt-en-es"
    spm = folder.parent / "spm"
    spm.mkdir()
    for name, column in (("source.spm", "en"), ("target.spm", "es")):
        (spm / name).write_bytes(train_spm(bible(column)))
    vocab = marian_vocab((spm / "source.spm").read_bytes(), (spm / "target.spm").read_bytes())
    (spm / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    MarianTokenizer(str(spm / "source.spm"), str(spm / "target.spm"), str(spm / "vocab.json")).save_pretrained(folder)
    pad = vocab["<pad>"]
    config = MarianConfig(vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_position_embeddings=128, activation_function="swish", scale_embedding=True,
                          pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0)
    model = MarianMTModel(config).eval()
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if tensor.is_floating_point() and "embed_positions" not in name:
                gain = name.endswith("weight") and tensor.dim() == 1
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2 + gain)
        model.final_logits_bias[0, pad] += PAD_BIAS
    model.save_pretrained(folder)
    settings = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    settings["bad_words_ids"] = [[pad]]  # as opus-mt's generation settings have it
    (folder / "generation_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def reference(opus_mt):
    """The tokenizer and model as `transformers` reads the directory."""
    return MarianTokenizer.from_pretrained(opus_mt), MarianMTModel.from_pretrained(opus_mt).eval()


def hf_translate(reference, texts, **settings) -> list[str]:
    tokenizer, model = reference
    with torch.no_grad():
        out = model.generate(**tokenizer(texts, return_tensors="pt", padding=True), max_new_tokens=NEW_TOKENS,
                             do_sample=False, **settings)
    return tokenizer.batch_decode(out, skip_special_tokens=True)


def assert_same_as_marian_tokenizer(folder: Path, texts: list[str]) -> tuple[MarianTokenizer, Tokenizer]:
    """Same ids for `texts` (with and without `</s>`), same text for their ids and 200 random id lists."""
    hf, ours = MarianTokenizer.from_pretrained(folder), Tokenizer.from_marian_files(folder)
    for text in texts:
        for frame in (True, False):
            assert ours.encode(text, add_special=frame) == hf(text, add_special_tokens=frame)["input_ids"], text
    draw = random.Random(0)
    sequences = [ours.encode(text) for text in texts]
    sequences += [[draw.randrange(ours.vocab_size) for _ in range(draw.randrange(12))] for _ in range(200)]
    for ids in sequences:
        for skip in (True, False):
            assert ours.decode(ids, skip_special=skip) == hf.decode(ids, skip_special_tokens=skip), ids
    assert ours.decode_batch(sequences) == hf.batch_decode(sequences, skip_special_tokens=True)
    return hf, ours


def test_ids_and_text_equal_marian_tokenizer(opus_mt):
    hf, ours = assert_same_as_marian_tokenizer(opus_mt, TEXTS)
    assert hf.unk_token_id in ours.encode(TEXTS[0])  # the texts have pieces that vocab.json lacks
    assert (ours.pad_id, ours.eos_id, ours.unk_id, ours.bos_id) == (hf.pad_token_id, 0, 1, None)
    # As tokenizer.path, the directory loads as the same tokenizer.
    assert Tokenizer.load(opus_mt).encode_batch(TEXTS, add_special=True) == hf(TEXTS)["input_ids"]


def test_extra_special_tokens_and_space_clean_up_as_marian_tokenizer(opus_mt, tmp_path):
    vocab = json.loads((opus_mt / "vocab.json").read_text(encoding="utf-8"))
    (tmp_path / "vocab.json").write_text(json.dumps({**vocab, "<eop>": len(vocab)}), encoding="utf-8")
    MarianTokenizer(str(opus_mt / "source.spm"), str(opus_mt / "target.spm"), str(tmp_path / "vocab.json"),
                    additional_special_tokens=["<eop>"], clean_up_tokenization_spaces=True).save_pretrained(tmp_path)
    _, ours = assert_same_as_marian_tokenizer(tmp_path, [*TEXTS, "a<eop>b . , don 't", "Jesus wept . <eop>"])
    assert len(vocab) in ours.encode("a<eop>b")


def test_loaded_directory_has_opus_mt_rules(opus_mt):
    _, tokenizer, info = load_pretrained(opus_mt)
    pad = tokenizer.pad_id
    assert info.decoding == DecodingRules(frame_sources=True, start_id=pad, suppress=(pad,), force_eos=True)


GREEDY = (GenerationConfig(max_new_tokens=NEW_TOKENS), dict(num_beams=1))
BEAM = (huggingface_config(num_beams=4, max_new_tokens=NEW_TOKENS), dict(num_beams=4))


@pytest.mark.parametrize("config, settings", [GREEDY, BEAM], ids=["greedy", "beam-4"])
def test_translate_equals_generate_from_text(opus_mt, reference, config, settings):
    expected = hf_translate(reference, SOURCES, **settings)
    loaded = load_model(opus_mt, "cpu")
    assert translate(loaded, SOURCES, config) == expected
    assert len(set(expected)) == len(SOURCES) and all(expected)  # distinct, non-empty: the texts matter
    # Each rule decides the text: without it attn would not give what transformers gives.
    for rule, off in (("frame_sources", False), ("suppress", ()), ("force_eos", False)):
        without = dataclasses.replace(loaded, rules=dataclasses.replace(loaded.rules, **{rule: off}))
        assert translate(without, SOURCES, config) != expected, rule


def test_n_best_equals_generate_with_return_sequences(opus_mt, reference):
    config = huggingface_config(num_beams=4, max_new_tokens=NEW_TOKENS, num_return_sequences=4)
    expected = hf_translate(reference, SOURCES[:1], num_beams=4, num_return_sequences=4)
    found = translate_n_best(load_model(opus_mt, "cpu"), SOURCES[0], config)
    assert [text for text, _ in found] == expected


def test_cli_translate_prints_generate_output(opus_mt, reference, capsys):
    expected = hf_translate(reference, SOURCES, num_beams=1)
    args = ["--beam-size", "1", "--max-new-tokens", str(NEW_TOKENS), "--device", "cpu", *SOURCES]
    assert main(["translate", "--model", str(opus_mt), *args]) == 0
    assert capsys.readouterr().out.splitlines() == expected


def test_converted_checkpoint_keeps_tokenizer_and_rules(opus_mt, reference, tmp_path, capsys):
    checkpoint = tmp_path / "ckpt"
    assert main(["convert", "--to", "attn", str(opus_mt), str(checkpoint)]) == 0
    assert {"source.spm", "target.spm", "vocab.json", "task.json"} <= {p.name for p in checkpoint.iterdir()}
    loaded = load_model(checkpoint, "cpu")
    config, settings = BEAM
    assert translate(loaded, SOURCES, config) == hf_translate(reference, SOURCES, **settings)
    assert [loaded.tokenizer.encode(t, add_special=True) for t in TEXTS] == reference[0](TEXTS)["input_ids"]
    # Exported again, the tokenizer files are what MarianTokenizer reads.
    exported = tmp_path / "exported"
    assert main(["convert", "--to", "marian", str(checkpoint), str(exported)]) == 0
    assert MarianTokenizer.from_pretrained(exported)(TEXTS)["input_ids"] == reference[0](TEXTS)["input_ids"]


def test_attention_is_drawn_over_the_source_and_translation_that_translate_gives(opus_mt, reference, capsys,
                                                                                  monkeypatch, tmp_path):
    """`attn attention --kind cross` reads the source as `translate` does (Marian's `</s>` at its end) and its
    queries are the decoder's inputs of the translation `attn translate` prints (pad ban, forced EOS); so
    does the server's `attention_layers`."""
    text = SOURCES[1]
    assert main(["translate", "--model", str(opus_mt), "--device", "cpu", text]) == 0
    printed = capsys.readouterr().out.splitlines()
    loaded = load_model(opus_mt, "cpu")
    (best, *_), = translate_hypotheses(loaded, [text], GenerationConfig.paper())
    assert printed == [loaded.tokenizer.decode(best.tokens)] and printed[0]
    drawn = []
    monkeypatch.setattr("attn.app.commands.inference.plot_attention", lambda *view: drawn.append(view) or Path(view[-1]))
    assert main(["attention", "--model", str(opus_mt), "--device", "cpu", "--kind", "cross", "-o",
                 str(tmp_path / "map.png"), text]) == 0
    (weights, queries, keys, _, _), = drawn
    pieces = [loaded.tokenizer.id_to_token(i) for i in reference[0](text)["input_ids"]]
    assert pieces[-1] == "</s>" and keys == pieces
    assert queries == [loaded.tokenizer.id_to_token(i) for i in [loaded.start_id, *best.tokens]]
    assert tuple(weights.shape) == (len(best.tokens) + 1, len(pieces))
    layers = attention_layers(loaded, text, "cross")
    assert (layers.keys, layers.queries, layers.target) == (keys, queries, printed[0])


# Where the rules come from: generation_config.json when there is one (opus-mt's), else config.json.
LAYOUTS = {
    "generation-settings": lambda config, settings: {"generation_config.json": settings},
    "config-json-only": lambda config, settings: {
        "config.json": {**config, "bad_words_ids": [[3], [5]], "forced_eos_token_id": 0}},
    "no-settings": lambda config, settings: {
        "config.json": {k: v for k, v in config.items() if k != "forced_eos_token_id"}},
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rules_are_read_where_generate_reads_them(opus_mt, tmp_path, layout):
    folder = copied(opus_mt, tmp_path / layout)
    (folder / "generation_config.json").unlink()
    config, settings = (json.loads((opus_mt / name).read_text(encoding="utf-8"))
                        for name in ("config.json", "generation_config.json"))
    for name, data in LAYOUTS[layout](config, settings).items():
        (folder / name).write_text(json.dumps(data), encoding="utf-8")
    hf = MarianMTModel.from_pretrained(folder).generation_config
    rules = load_pretrained(folder)[2].decoding
    bans = tuple(sorted(words[0] for words in hf.bad_words_ids or []))
    assert (rules.suppress, rules.force_eos, rules.start_id) == (bans, hf.forced_eos_token_id is not None,
                                                                 hf.decoder_start_token_id)
    assert rules.frame_sources  # MarianTokenizer ends every source with </s>, whatever the settings


def copied(folder: Path, into: Path) -> Path:
    into.mkdir()
    for path in folder.iterdir():
        (into / path.name).write_bytes(path.read_bytes())
    return into


def test_separate_vocabularies_and_missing_specials_are_refused(opus_mt, tmp_path):
    separate = copied(opus_mt, tmp_path / "separate")
    settings = json.loads((separate / "tokenizer_config.json").read_text(encoding="utf-8"))
    (separate / "tokenizer_config.json").write_text(json.dumps({**settings, "separate_vocabs": True}), "utf-8")
    with pytest.raises(CheckpointError, match="separate_vocabs=true .* is not supported"):
        Tokenizer.from_marian_files(separate)
    no_pad = copied(opus_mt, tmp_path / "no-pad")
    vocab = json.loads((no_pad / "vocab.json").read_text(encoding="utf-8"))
    (no_pad / "vocab.json").write_text(json.dumps({k: v for k, v in vocab.items() if k != "<pad>"}), "utf-8")
    with pytest.raises(CheckpointError, match="vocab.json: has no '<pad>', a special token of the tokenizer"):
        Tokenizer.from_marian_files(no_pad)
