"""GGUF vocabularies read by attn against `transformers`' GGUF loading and against the SentencePiece models they
came from, on the over a thousand texts of `gguf_vocab.texts` (corpus lines in English and Spanish, whitespace,
text outside the vocabulary, numbers, code, special tokens inside text).

The vocabularies are trained here on the shipped corpora (`gguf_vocab`): SentencePiece models set up as Llama 2's
and Gemma's, converted as llama.cpp's converter converts them, and a byte-level BPE whose merges cross words,
written with each pre-tokenizer attn reads. attn encodes as llama.cpp does; where a reference does otherwise, a
test says where and checks llama.cpp's rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sentencepiece as spm
from gguf_vocab import (
    GEMMA_ADDED,
    byte_level_metadata,
    sentencepiece_metadata,
    texts,
    train_sentencepiece,
    write_vocabulary,
)
from tiny_gguf import SPECIALS
from tokenizers import Tokenizer as Backend
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

from attn.artifacts.pretrained.gguf_file import Metadata, open_gguf
from attn.artifacts.pretrained.gguf_tokenizer import tokenizer_of
from attn.data.tokenizers import Tokenizer

LLAMA_SPECIALS = ["<unk>", "<s>", "</s>"]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]


def read(folder: Path, arch: str, vocabulary: dict):
    """(attn's tokenizer, transformers' tokenizer) of a GGUF file of `arch` that holds `vocabulary`."""
    path = folder / f"{arch}.gguf"
    write_vocabulary(path, arch, vocabulary)
    ours, _, _ = tokenizer_of(Metadata(open_gguf(path), path))
    return ours, AutoTokenizer.from_pretrained(folder, gguf_file=path.name)


def pieces(tokenizer: Tokenizer, text: str) -> list[str]:
    return [tokenizer.id_to_token(i) for i in tokenizer.encode(text)]


def assert_same_text(ours: Tokenizer, theirs, texts: list[str]) -> list[list[int]]:
    """The same ids and decoded text as transformers; a text comes back from its ids wherever it does there."""
    ids = ours.encode_batch(texts)
    assert ids == theirs(texts, add_special_tokens=False)["input_ids"]
    for skip in (True, False):
        assert ours.decode_batch(ids, skip_special=skip) == theirs.batch_decode(ids, skip_special_tokens=skip)
    decoded = theirs.batch_decode(ids, skip_special_tokens=True)
    returned = [text for text, back in zip(texts, decoded, strict=True) if back == text]
    assert len(returned) > len(texts) * 0.9
    assert ours.decode_batch(ours.encode_batch(returned)) == returned
    return ids


# -- SentencePiece: Llama 2 ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_model() -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=train_sentencepiece(gemma=False))


@pytest.fixture(scope="module")
def llama(tmp_path_factory, llama_model):
    """architecture -> (attn's tokenizer, transformers') of the Llama 2 vocabulary in a file of that architecture."""
    vocabulary = sentencepiece_metadata(llama_model.serialized_model_proto())
    return {arch: read(tmp_path_factory.mktemp(arch), arch, vocabulary) for arch in ("llama", "phi3")}


def test_sentencepiece_ids_are_those_transformers_gives_phi3(llama):
    """transformers builds a phi3 file's SentencePiece vocabulary as llama.cpp encodes any: a "▁" before the text
    and after every special token, a space at the start kept as a "▁" of its own."""
    ours, theirs = llama["phi3"]
    every = texts(LLAMA_SPECIALS)
    assert len(every) > 1000
    assert_same_text(ours, theirs, every)
    assert ours.encode_batch(every[:100], add_special=True) == theirs(every[:100])["input_ids"]  # bos first


def test_sentencepiece_ids_are_those_of_the_model_they_came_from(llama, llama_model):
    ours, _ = llama["llama"]
    plain = [text for text in texts(LLAMA_SPECIALS) if not any(s in text for s in LLAMA_SPECIALS)]
    assert ours.encode_batch(plain) == llama_model.encode(plain)
    spelt = ["▁", "<0xE6>", "<0xBC>", "<0xA2>"]  # not in the vocabulary: its bytes
    assert ours.encode("漢") == llama_model.encode("漢") == [llama_model.piece_to_id(p) for p in spelt]


def test_llama_files_differ_from_transformers_where_llama_cpp_puts_a_space(llama, llama_model):
    """transformers reads a llama file's SentencePiece vocabulary with `Metaspace(prepend_scheme="first")`, which
    puts no "▁" before a text that starts with a space (or a "▁"), nor after a special token; llama.cpp does, as
    SentencePiece does."""
    ours, theirs = llama["llama"]
    every = texts(LLAMA_SPECIALS)
    same = [text for text in every if not text.startswith((" ", "▁")) and not any(s in text for s in LLAMA_SPECIALS)]
    assert len(same) > 1000
    assert_same_text(ours, theirs, same)
    assert ours.encode(" Hello") == llama_model.encode(" Hello") != llama_model.encode("Hello")
    assert theirs.encode(" Hello", add_special_tokens=False) == llama_model.encode("Hello")  # the space taken for "▁"
    assert ours.encode("</s>Hello") == [2, *llama_model.encode("Hello")]
    assert theirs.encode("</s>Hello", add_special_tokens=False) != ours.encode("</s>Hello")


# -- SentencePiece: Gemma --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_model() -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=train_sentencepiece(gemma=True))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory, gemma_model):
    vocabulary = sentencepiece_metadata(gemma_model.serialized_model_proto(), GEMMA_ADDED)
    return read(tmp_path_factory.mktemp("gemma3"), "gemma3", {**vocabulary, "tokenizer.ggml.add_space_prefix": False})


def test_gemma_ids_are_those_of_transformers_and_of_the_model(gemma, gemma_model):
    """No "▁" goes before the text; "  " is a user-defined token, matched whole. A "▁" written in the text is
    where they disagree: llama.cpp matches "  " before spaces become "▁", so that "▁" never joins it, where
    transformers and SentencePiece look up "▁▁" after."""
    ours, theirs = gemma
    every = [text for text in texts(GEMMA_SPECIALS) if "▁" not in text]
    assert len(every) > 1000
    assert_same_text(ours, theirs, every)
    plain = [text for text in every if not any(s in text for s in GEMMA_SPECIALS)]
    assert ours.encode_batch(plain) == gemma_model.encode(plain)
    assert pieces(ours, "Hello") == gemma_model.encode("Hello", out_type=str) == ["He", "ll", "o"]
    assert pieces(ours, "a  b") == ["a", "  ", "b"]
    assert pieces(ours, "<start_of_turn>user") == ["<start_of_turn>", *gemma_model.encode("user", out_type=str)]
    assert pieces(ours, "▁ x") == ["▁", "▁", "x"]  # the vocabulary spells "▁▁" as "  "
    assert gemma_model.encode("▁ x", out_type=str) == ["▁▁", "x"]


# -- byte-level BPE --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    """pre-tokenizer name -> (attn's tokenizer, transformers') of one vocabulary written with that pre-tokenizer."""
    vocabulary = byte_level_metadata(SPECIALS)
    return {pre: read(tmp_path_factory.mktemp(pre), "llama", {**vocabulary, "tokenizer.ggml.pre": pre})
            for pre in ("gpt-2", "llama-bpe", "qwen2", "smollm")}


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2"])
def test_byte_level_ids_and_text_are_those_of_transformers(byte_level, pre):
    ours, theirs = byte_level[pre]
    every = texts(SPECIALS)
    assert len(every) > 1000
    ids = assert_same_text(ours, theirs, every)
    assert ours.decode_batch(ids, skip_special=False) == every
    if pre == "llama-bpe":  # Llama 3 puts bos first
        assert ours.encode_batch(every[:100], add_special=True) == theirs(every[:100])["input_ids"]


def test_pre_tokenizers_cut_the_texts_apart(byte_level):
    every = texts(SPECIALS)
    ids = {pre: tuple(map(tuple, ours.encode_batch(every))) for pre, (ours, _) in byte_level.items()}
    assert len(set(ids.values())) == len(ids)


def test_smollm_cuts_every_digit_alone(byte_level):
    """llama.cpp's `smollm` splits at every \\p{N} before GPT-2's regex, as SmolLM2's tokenizer.json does with
    `Digits(individual_digits=True)`; transformers' GGUF loading leaves that step out, so the reference here is
    transformers' tokenizer with it put back."""
    ours, theirs = byte_level["smollm"]
    every = texts(SPECIALS)
    reference = Backend.from_str(theirs.backend_tokenizer.to_str())
    reference.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                        reference.pre_tokenizer])
    ids = ours.encode_batch(every)
    assert ids == [e.ids for e in reference.encode_batch(every, add_special_tokens=False)]
    assert ids != theirs(every, add_special_tokens=False)["input_ids"]
    assert pieces(ours, "say    600")[-4:] == ["ĠĠĠĠ", "6", "0", "0"]
