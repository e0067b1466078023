"""Streamed text (`attn.inference.continuation.generate_stream`): whole characters, stop strings never half shown."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from attn.artifacts import Bundle
from attn.core.presets import preset
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig, generate
from attn.decoding.text import CompletionText, StopStrings, text_pieces
from attn.inference.continuation import continue_texts, generate_stream
from attn.models import build_model

# Accents (2 bytes), CJK (3 bytes), emoji (4 bytes, and a ZWJ sequence), mixed with ASCII.
MULTI_BYTE = "Café naïve, ¿qué tal? 日本語のテキスト 👩‍🚀🎉 Ωμέγα — fin.\n"
CORPUS = [MULTI_BYTE * 3, "The quick brown fox jumps over the lazy dog.\n" * 5, "ÀÉÎÕÜ àéîõü 中文 한국어 😀😃\n"]


def byte_table() -> dict[int, str]:
    """GPT-2's byte -> printable character table, written out from its definition (the printable
    Latin-1 bytes map to themselves, the other 68 bytes to U+0100 onwards in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tokenizer]:
    """A byte-bpe tokenizer and a GPT-2 one (vocab.json + merges.txt), both trained on CORPUS."""
    from tokenizers import ByteLevelBPETokenizer

    folder = tmp_path_factory.mktemp("gpt2")
    reference = ByteLevelBPETokenizer()
    reference.train_from_iterator(CORPUS, vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False)
    reference.save_model(str(folder))
    return {
        "byte-bpe": Tokenizer.train_bpe(CORPUS, 400, byte_level=True),
        "gpt2": Tokenizer.from_gpt2_files(folder / "vocab.json", folder / "merges.txt"),
    }


def one_token_per_byte(tokenizer: Tokenizer, text: str) -> list[int]:
    """The ids of `text` with every UTF-8 byte a token of its own: a split at every byte boundary."""
    table = byte_table()
    return [tokenizer.token_to_id(table[b]) for b in text.encode("utf-8")]


def streamed(ids: list[int], tokenizer: Tokenizer, stop: tuple[str, ...] = ()) -> list[str]:
    return list(text_pieces(iter(ids), tokenizer.decode, stop))


@pytest.mark.parametrize("kind", ["byte-bpe", "gpt2"])
def test_text_split_at_every_byte_streams_whole_characters(byte_level: dict[str, Tokenizer], kind: str) -> None:
    tokenizer = byte_level[kind]
    ids = one_token_per_byte(tokenizer, MULTI_BYTE)
    assert tokenizer.decode(ids) == MULTI_BYTE
    pieces = streamed(ids, tokenizer)
    assert "".join(pieces) == MULTI_BYTE
    assert not any("\ufffd" in piece for piece in pieces)
    # Every character is shown as soon as its last byte has arrived: one piece per character.
    assert pieces == [c for c in MULTI_BYTE if c]


@pytest.mark.parametrize("kind", ["byte-bpe", "gpt2"])
def test_the_tokenizers_own_tokens_stream_to_the_text(byte_level: dict[str, Tokenizer], kind: str) -> None:
    tokenizer = byte_level[kind]
    for text in CORPUS:
        ids = tokenizer.encode(text)
        assert "".join(streamed(ids, tokenizer)) == text


@pytest.mark.parametrize("kind", ["byte-bpe", "gpt2"])
def test_any_token_sequence_streams_to_its_one_shot_decode(byte_level: dict[str, Tokenizer], kind: str) -> None:
    """Random ids make invalid UTF-8 too (stray continuation bytes, cut sequences): those stay U+FFFD
    exactly where the one-shot decode puts them."""
    tokenizer = byte_level[kind]
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 30))]
        assert "".join(streamed(ids, tokenizer)) == tokenizer.decode(ids), ids


def test_character_and_metaspace_tokenizers_stream_their_one_shot_decode() -> None:
    rng = random.Random(1)
    for tokenizer in (Tokenizer.train_chars(CORPUS), Tokenizer.train_bpe(CORPUS, 200)):
        for _ in range(100):
            ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 30))]
            assert "".join(streamed(ids, tokenizer)) == tokenizer.decode(ids)


def test_each_step_decodes_a_few_tokens_only(byte_level: dict[str, Tokenizer]) -> None:
    """Re-decoding the whole output at every token would make streaming quadratic in its length."""
    tokenizer = byte_level["byte-bpe"]
    ids = one_token_per_byte(tokenizer, MULTI_BYTE * 4)
    lengths: list[int] = []

    def decode(window: list[int]) -> str:
        lengths.append(len(window))
        return tokenizer.decode(window)

    assert "".join(text_pieces(iter(ids), decode)) == MULTI_BYTE * 4
    assert max(lengths) <= 5 and len(lengths) <= 2 * len(ids) + 1


@pytest.mark.parametrize(("text", "stop", "shown"), [
    ("ab\n\ncd", ("\n\n",), "ab"),
    ("a\nb\n\nc", ("\n\n",), "a\nb"),  # a single newline is only held back, then shown
    ("Café 日本語 fin", ("日本",), "Café "),  # a stop string of multi-byte characters, split at every byte
    ("x END y", ("END", "D y"), "x "),  # the stop string that starts first wins
    ("no stop here", ("STOP",), "no stop here"),
    ("ends with ST", ("STOP",), "ends with ST"),  # the held-back start of a stop string that never came
])
def test_stop_strings_split_over_tokens_are_never_partly_printed(
    byte_level: dict[str, Tokenizer], text: str, stop: tuple[str, ...], shown: str
) -> None:
    tokenizer = byte_level["gpt2"]
    ids = one_token_per_byte(tokenizer, text)
    pieces = streamed(ids, tokenizer, stop)
    # Pieces are never taken back, so a stream that adds up to the text before the stop string never
    # showed a part of it; the text not streamed is cut at the same place.
    assert "".join(pieces) == shown == StopStrings(stop, tokenizer.decode).cut(tokenizer.decode(ids))


def test_a_stop_string_ends_the_stream_without_reading_further_tokens(byte_level: dict[str, Tokenizer]) -> None:
    tokenizer = byte_level["gpt2"]
    ids = one_token_per_byte(tokenizer, "hello\n\n")
    read: list[int] = []

    def tokens():
        for token in ids + [tokenizer.token_to_id("x")] * 50:
            read.append(token)
            yield token

    assert "".join(text_pieces(tokens(), tokenizer.decode, ("\n\n",))) == "hello"
    assert len(read) == len(ids)


def test_generate_stream_shows_what_the_generated_tokens_decode_to(byte_level: dict[str, Tokenizer]) -> None:
    """A random byte-level LM writes split and broken characters; the stream still adds up to its tokens' text."""
    tokenizer = byte_level["byte-bpe"]
    torch.manual_seed(0)
    config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0)
    model = build_model(config).eval()
    loaded = Bundle(model=model, tokenizer=tokenizer, task="lm", model_config=config, path=Path("."), start_id=2,
                    eos_id=None, pad_id=0)
    decoding = GenerationConfig(sample=True, seed=3, max_new_tokens=40)
    ids = generate(model, [tokenizer.encode("Café")], decoding)[0]
    assert "".join(generate_stream(loaded, "Café", decoding)) == tokenizer.decode(ids)


def _stops_in(text: str) -> dict[str, str]:
    """Stop strings picked from a continuation's text, by what makes them hard to stream."""
    late = next(i for i in range(4, len(text) - 3) if text[i] in text[:i] and text.find(text[i : i + 3]) == i)
    return {
        "spans several tokens": text[10:14],
        "its first character comes earlier alone": text[late : late + 3],  # held back there, then shown
        "only its start comes, at the end": text[-2:] + "\u2603",  # held back to the end, then shown
    }


def test_stop_strings_end_streamed_and_whole_continuations_at_the_same_text() -> None:
    """`attn generate` streamed (`generate_stream`), the server's tokens (`CompletionText`) and whole
    continuations (`continue_texts`) show the same text: the free continuation's, cut at the stop string."""
    tokenizer = Tokenizer.train_chars(CORPUS)
    torch.manual_seed(0)
    config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0)
    loaded = Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task="lm", model_config=config,
                    path=Path("."), start_id=tokenizer.bos_id, eos_id=None, pad_id=0)
    prompt = tokenizer.encode("Café")
    text = tokenizer.decode(generate(loaded.model, [prompt], GenerationConfig(max_new_tokens=40))[0])
    assert len(text) == 40 and "\u2603" not in text  # one character per token
    for why, stop in _stops_in(text).items():
        decoding = GenerationConfig(max_new_tokens=40, stop=(stop,))
        expected = text[: text.find(stop)] if stop in text else text
        tokens = generate(loaded.model, [prompt], decoding, decode=tokenizer.decode)[0]
        completion = CompletionText(tokenizer.decode, decoding, loaded.eos_id)
        pushed = [completion.push(t, torch.zeros(tokenizer.vocab_size), None) for t in tokens[:-1]]
        pushed.append(completion.push(tokens[-1], torch.zeros(tokenizer.vocab_size), "stop"))
        assert "".join(generate_stream(loaded, "Café", decoding)) == expected, why
        assert continue_texts(loaded, ["Café"], decoding)[0][0].text == expected, why
        assert "".join(token.text for token in pushed) == expected, why


class ScriptLM:
    """A decoder-only stand-in that writes `script` whatever the prompt (one prompt token)."""

    def __init__(self, script: list[int], vocab: int) -> None:
        self.script, self.vocab, self.max_positions = script, vocab, 64

    def new_cache(self, batch: int, max_length: int):
        from attn.core.kv_cache import KVCache

        return KVCache(1, batch, 1, max_length, 1)

    def decode_step(self, tokens, cache, mask=None, last_only=False):
        from attn.core.masks import positions_from_mask

        mask = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask
        cache.extend(cache.next_positions() + positions_from_mask(mask), mask)
        logits = torch.zeros(tokens.size(0), tokens.size(1), self.vocab)
        logits[:, -1, self.script[min(cache.length - 1, len(self.script) - 1)]] = 1.0
        return logits


def test_a_long_stop_string_of_multi_byte_characters_split_at_every_byte_still_stops_generation(
    byte_level: dict[str, Tokenizer],
) -> None:
    """Six CJK characters are 18 one-byte tokens: the stop check must look back that far."""
    tokenizer = byte_level["gpt2"]
    text = "ok 日本語のテキスト and more after it"
    script = one_token_per_byte(tokenizer, text)
    stop = "日本語のテキ"
    end = len("ok 日本語のテキ".encode())  # the row ends with the token that completes the stop string
    model = ScriptLM(script, tokenizer.vocab_size)
    config = GenerationConfig(max_new_tokens=len(script), stop=(stop,))
    assert generate(model, [[0]], config, decode=tokenizer.decode)[0] == script[:end]
