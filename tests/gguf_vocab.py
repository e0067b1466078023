"""GGUF vocabularies written here from tokenizers trained on the shipped corpora, and texts to encode with them.

`sentencepiece_metadata` trains a real SentencePiece model (the `sentencepiece` package) set up as Llama 2's or
Gemma's, and turns it into `tokenizer.ggml.*` metadata as llama.cpp's converter does (convert_hf_to_gguf.py,
`_create_vocab_sentencepiece`); `byte_level_metadata` does the same for a byte-level BPE trained with
`tokenizers`. `write_vocabulary` writes a GGUF file that holds such a vocabulary and no tensors. `texts()` is a
fixed list of over a thousand texts that tell tokenizers apart.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sentencepiece as spm
import tokenizers
from gguf import TokenType
from tiny_gguf import write_gguf
from tokenizers import models, pre_tokenizers, trainers

from attn.data.readers import Fields, load_labelled, load_parallel

DATA = Path(__file__).resolve().parents[1] / "data"
# tokenizer_config.json's added tokens of Gemma (id -> text, special): its turn markers, and a run of two spaces,
# which llama.cpp's converter stores with real spaces
GEMMA_ADDED = {5: ("<start_of_turn>", True), 6: ("<end_of_turn>", True), 7: ("▁▁", False)}


def corpus_lines(split: str) -> dict[str, list[str]]:
    """The shipped corpora's lines of one split ("valid" or "test"): English and Spanish verses, Shakespeare's
    lines (not blank), fortunes."""
    bible = load_parallel(DATA / "bible-en-es" / f"{split}.tsv")
    plays = (DATA / "shakespeare" / f"{split}.txt").read_text(encoding="utf-8").splitlines()
    return {
        "en": bible.sources,
        "es": bible.targets,
        "shakespeare": [line for line in plays if line.strip()],
        "fortunes": load_labelled(DATA / "fortunes-topics" / f"{split}.tsv", Fields(text_field="text")).texts,
    }


def _training_lines() -> list[str]:
    return [line for lines in corpus_lines("valid").values() for line in lines]


def train_sentencepiece(gemma: bool) -> bytes:
    """A SentencePiece BPE model (its serialized proto) set up as Llama 2's, or as Gemma's.

    Both: byte fallback, digits apart, no normalization, whitespace kept as it is. Llama 2: unk, bos, eos are ids
    0, 1, 2 and a space goes before the text. Gemma: <pad>, <eos>, <bos>, <unk>, <mask> are ids 0 to 4, its turn
    markers and a run of two spaces are pieces of their own, and no space goes before the text.
    """
    ids = {"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1}
    if gemma:
        ids = {"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3, "bos_piece": "<bos>", "eos_piece": "<eos>",
               "control_symbols": ["<mask>"], "user_defined_symbols": [text for text, _ in GEMMA_ADDED.values()]}
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_training_lines()), model_writer=model, model_type="bpe", vocab_size=3000,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, character_coverage=0.9995, add_dummy_prefix=not gemma, minloglevel=2,
        **ids)
    return model.getvalue()


def sentencepiece_metadata(model: bytes, added: Mapping[int, tuple[str, bool]] | None = None) -> dict[str, Any]:
    """The `tokenizer.ggml.*` metadata that llama.cpp's converter writes for a SentencePiece model.

    Args:
        model: the serialized model.
        added: tokenizer_config.json's added tokens (id -> text, special): special ones become control tokens,
            the others user-defined tokens with "▁" written as a space.
    """
    processor = spm.SentencePieceProcessor(model_proto=model)
    tokens, scores, types = [], [], []
    for i in range(processor.vocab_size()):
        tokens.append(processor.id_to_piece(i))
        scores.append(processor.get_score(i))
        kinds = {TokenType.UNKNOWN: processor.is_unknown(i), TokenType.CONTROL: processor.is_control(i),
                 TokenType.UNUSED: processor.is_unused(i), TokenType.BYTE: processor.is_byte(i)}
        types.append(next((kind for kind, is_kind in kinds.items() if is_kind), TokenType.NORMAL))
    for i, (text, special) in (added or {}).items():
        tokens[i], scores[i] = text if special else text.replace("▁", " "), -1000.0
        types[i] = TokenType.CONTROL if special else TokenType.USER_DEFINED
    ids = {"bos": processor.bos_id(), "eos": processor.eos_id(), "unknown": processor.unk_id(),
           "padding": processor.pad_id()}
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": None,
        **{f"tokenizer.ggml.{key}_token_id": i if i >= 0 else None for key, i in ids.items()},
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    }


def byte_level_metadata(specials: list[str]) -> dict[str, Any]:
    """A byte-level BPE trained on whole lines, so that its merges cross the words of every pre-tokenizer."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(_training_lines(), trainer)
    model = json.loads(backend.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    return {
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [TokenType.CONTROL if t in specials else TokenType.NORMAL for t in tokens],
        "tokenizer.ggml.merges": [" ".join(merge) for merge in model["merges"]],
    }


def write_vocabulary(path: Path, arch: str, vocabulary: Mapping[str, Any]) -> None:
    """A GGUF file of `arch`'s tiny hyper-parameters and the vocabulary's metadata, without tensors."""
    write_gguf(path, arch, weights={}, changes={f"{arch}.vocab_size": len(vocabulary["tokenizer.ggml.tokens"]),
                                                "tokenizer.chat_template": None, **vocabulary})


def texts(specials: list[str]) -> list[str]:
    """Over a thousand texts: the test split's lines in English and Spanish, Shakespeare, fortunes, the same with
    runs of spaces, tabs, newlines and spaces at either end, text outside a small vocabulary (emoji, CJK, other
    scripts), numbers, code, and `specials` (the vocabulary's special tokens) inside text."""
    lines = corpus_lines("test")
    plain = lines["en"][:200] + lines["es"][:200] + lines["shakespeare"][:150] + lines["fortunes"][:100]
    spaced = [
        variant
        for i, line in enumerate(plain[::3])
        for variant in (" " + line, line + "  ", line.replace(" ", " " * (2 + i % 4)), "\t".join(line.split()),
                        line.replace(", ", ",\n").replace(". ", ".\n\n"), f"  {line}\r\n")
    ]
    unicode = ["😀", "👍🏽 ok", "👩‍👩‍👧 family", "漢字とひらがな", "中文：你好，世界。", "한국어 텍스트", "Привет, мир!",
               "مرحبا بالعالم", "שלום עולם", "Ελληνικά γράμματα", "ñandú, pingüino, façade, naïve",
               "e\u0301 (combining)", "\u00a0non-breaking\u00a0spaces\u2003em", "ﬁ ligature, Ⅻ numeral, ① circled",
               "zero\u200bwidth", "∑∫√∞≠≤", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙", "Ǆ ǅ ǆ", "▁ starts with the space symbol",
               "<0x41> spelt as a byte token"]
    numbers = ["0", "7", "42", "1234567890", "3.14159", "-273.15", "1,000,000", "1e-9", "0x1F", "2024-01-31",
               "12:30:45", "+1 (555) 010-9999", "１２３ full-width", "v1.2.3-rc4", "99.9%", "$100,000.00", "10^6"]
    code = ["def f(x):\n    return x**2  # square\n", "for (int i = 0; i < n; ++i) { a[i] += 1; }",
            '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}', "<div class=\"x\">&amp; &lt;tag&gt;</div>",
            "SELECT * FROM t WHERE id = 3;", "x = lambda *args, **kw: (args, kw)", "if a != b && c >= d || !e:",
            "print(f'{name!r:>10}')", "#include <stdio.h>\nint main(void) { return 0; }", "a\\b\\\\c 'q' \"qq\" `bt`"]
    edges = ["", " ", "  ", "   x", "\n", "\t", "\r\n", "x", "a b", "a  b", "trailing ", "\n\nparagraphs\n\n"]
    marked = [template.format(special=special) for special in specials for template in (
        "{special}", "{special}Hello", "Hello{special}", " {special} spaced {special} ", "a{special}{special}b",
        "{special}\nline\n{special}")]
    mixed = [f"{a} {b} {c}" for a, b, c in zip(unicode, numbers, code)]
    return list(dict.fromkeys(plain + spaced + unicode + numbers + code + edges + marked + mixed))
