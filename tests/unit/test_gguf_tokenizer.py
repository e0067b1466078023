"""The SentencePiece vocabulary of a GGUF file on a vocabulary small enough to follow by hand: llama.cpp's merge
order, byte fallback, the space before the text, special ids and their defaults, and every broken vocabulary a
`CheckpointError` that names the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import TokenType
from gguf_vocab import write_vocabulary

from attn.artifacts.pretrained.gguf_file import Metadata, open_gguf
from attn.artifacts.pretrained.gguf_tokenizer import tokenizer_of
from attn.core.errors import CheckpointError
from attn.data.tokenizers import Tokenizer

BYTES = [f"<0x{b:02X}>" for b in range(256)]
# Scores make "bc" the best join, then "ab", then "▁a": llama.cpp joins "b"+"c" first in "▁abc", after which
# "ab" can no longer form, and ends with "▁a" "bc"; the longest match ("▁ab" "c") or a unigram split would differ.
WORDS = {"▁": -10.0, "a": -11.0, "b": -12.0, "c": -13.0, "bc": -1.0, "ab": -2.0, "▁a": -3.0, "▁ab": -4.0,
         "abc": -5.0, "<start>": 0.0}
TOKENS = ["<unk>", "<s>", "</s>", *BYTES, *WORDS]
SCORES = [0.0] * (3 + len(BYTES)) + list(WORDS.values())
TYPES = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, *[TokenType.BYTE] * len(BYTES),
         *[TokenType.NORMAL] * (len(WORDS) - 1), TokenType.USER_DEFINED]
VOCABULARY = {
    "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.merges": None,
    "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.scores": SCORES, "tokenizer.ggml.token_type": TYPES,
    "tokenizer.ggml.bos_token_id": None, "tokenizer.ggml.eos_token_id": None, "tokenizer.ggml.unknown_token_id": None,
    "tokenizer.ggml.padding_token_id": None, "tokenizer.ggml.add_bos_token": None,
}


def read(path: Path, **changes: object):
    write_vocabulary(path, "llama", {**VOCABULARY, **{f"tokenizer.ggml.{k}": v for k, v in changes.items()}})
    return tokenizer_of(Metadata(open_gguf(path), path))


def pieces(tokenizer, text: str) -> list[str]:
    return [tokenizer.id_to_token(i) for i in tokenizer.encode(text)]


def test_pairs_join_best_score_first_and_unknown_characters_fall_back_to_bytes(tmp_path: Path) -> None:
    tokenizer, ids, add_bos = read(tmp_path / "v.gguf")
    assert pieces(tokenizer, "abc") == ["▁a", "bc"]
    assert pieces(tokenizer, "ab c") == ["▁ab", "▁", "c"]
    assert pieces(tokenizer, " abc") == ["▁", "▁a", "bc"]  # the space of the text, then the one put before it
    assert pieces(tokenizer, "é!") == ["▁", "<0xC3>", "<0xA9>", "<0x21>"]
    assert pieces(tokenizer, "<s>abc</s>abc") == ["<s>", "▁a", "bc", "</s>", "▁a", "bc"]  # "▁" after each special
    assert pieces(tokenizer, "c<start>c") == ["▁", "c", "<start>", "▁", "c"]  # a user-defined token too
    assert tokenizer.encode("") == []
    # llama.cpp's defaults where the file names no special ids: bos 1, eos 2, unk 0, and bos before a prompt
    assert (ids, add_bos) == ({"bos": 1, "eos": 2, "pad": None, "unk": 0, "eot": None}, True)
    assert tokenizer.encode("abc", add_special=True) == [1, TOKENS.index("▁a"), TOKENS.index("bc")]
    assert tokenizer.encode("", add_special=True) == [1]


def test_decoding_gives_the_text_back(tmp_path: Path) -> None:
    tokenizer, _, _ = read(tmp_path / "v.gguf")
    for text in ("abc", " ab  c ", "é!\n"):
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode(tokenizer.encode("c<start>c")) == "c<start> c"  # as llama.cpp: the "▁" after it stays
    assert tokenizer.decode(tokenizer.encode("<s>abc", add_special=True)) == "abc"
    assert tokenizer.decode(tokenizer.encode("abc</s>"), skip_special=False) == "abc</s>"
    tokenizer.save(tmp_path / "saved")
    loaded = Tokenizer.load(tmp_path / "saved")
    assert loaded.encode(" ab<s>c é", add_special=True) == tokenizer.encode(" ab<s>c é", add_special=True)


def test_no_space_before_the_text_where_the_file_says_so(tmp_path: Path) -> None:
    tokenizer, _, _ = read(tmp_path / "v.gguf", add_space_prefix=False)
    assert pieces(tokenizer, "abc") == ["abc"]  # "b"+"c", then "a"+"bc", where no "▁a" comes first
    assert pieces(tokenizer, "<s> abc") == ["<s>", "▁a", "bc"]
    assert tokenizer.decode(tokenizer.encode(" abc")) == " abc"


def test_special_ids_and_frame_from_the_file(tmp_path: Path) -> None:
    tokenizer, ids, add_bos = read(tmp_path / "v.gguf", bos_token_id=2, eos_token_id=1, unknown_token_id=0,
                                   add_bos_token=False, add_eos_token=True)
    assert (ids["bos"], ids["eos"], add_bos) == (2, 1, False)
    assert tokenizer.encode("abc", add_special=True)[-1] == 1


BROKEN = [  # how the vocabulary is broken, and what the error says (a regex)
    ({"scores": None}, "metadata key 'tokenizer.ggml.scores' is missing"),
    ({"token_type": None}, "metadata key 'tokenizer.ggml.token_type' is missing"),
    ({"scores": SCORES[:-1]}, rf"{len(TOKENS)} tokens \(tokenizer.ggml.tokens\) but {len(TOKENS) - 1} entries in tok"),
    ({"token_type": [*TYPES, TokenType.NORMAL]}, f"but {len(TOKENS) + 1} entries in tokenizer.ggml.token_type"),
    ({"scores": ["high"] * len(TOKENS)}, "'tokenizer.ggml.scores' holds ARRAY/STRING, expected float"),
    ({"tokens": ["<unk>", "<s>", "</s>", "<0x0a>", *TOKENS[4:]]},
     r"tokenizer.ggml.token_type makes '<0x0a>' a byte token, but byte tokens are spelt <0x00> to <0xFF>"),
    ({"tokens": ["<unk>", "<s>", "</s>", "<0x00>", "<0x00>", *TOKENS[5:]]},
     "token '<0x00>' is in tokenizer.ggml.tokens twice"),
    ({"bos_token_id": len(TOKENS)}, rf"'tokenizer.ggml.bos_token_id' is {len(TOKENS)}, expected from 0 to"),
    ({"unknown_token_id": 10**6}, "'tokenizer.ggml.unknown_token_id' is 1000000, expected from 0 to"),
    ({"model": "t5"}, r"tokenizer.ggml.model is 't5'; attn reads byte-level BPE \('gpt2'\) and SentencePiece"),
]


@pytest.mark.parametrize(("changes", "message"), BROKEN)
def test_a_broken_vocabulary_is_refused_naming_the_file_and_key(tmp_path: Path, changes: dict, message: str) -> None:
    path = tmp_path / "v.gguf"
    with pytest.raises(CheckpointError, match=message) as raised:
        read(path, **changes)
    assert str(raised.value).startswith(f"{path}: ")
