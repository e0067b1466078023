"""Properties that must hold for every input, checked with hypothesis: tokenizer round trips and masks.

Round trips, kind by kind (tokenizers trained once on the shipped Bible and Shakespeare files):
- `byte-bpe` loses nothing: `decode(encode(t), skip_special=False) == t` for every string; the
  default decode drops exactly the texts of its special tokens (`<s>`, `</s>`, `<pad>`, ...) that
  `t` holds, as they encode to the special ids.
- `chars` keeps every character it was trained on and drops every other one (each encodes to
  `<unk>`, which decoding skips), in order.
- `bpe` and `unigram` give back the NFC form of a text over their training alphabet, less one leading
  space (the word marker `▁` of the first word is dropped).
- `wordpiece` gives back BERT's normal form of the text (lower case, accents and control
  characters removed) up to whitespace, whenever no `[UNK]` is produced.
The last three hold for texts without special-token texts and without the marker `▁` itself.

Masks follow `attn.core.masks`: True = may attend.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from attn.core.attention import (
    attention_weights,
    fast_attention,
    scaled_dot_product_attention,
)
from attn.core.blocks import self_attention_inputs
from attn.data.readers import load_labelled, load_parallel
from attn.data.text import read_text
from attn.data.tokenizer_pipelines import SEQ_SPECIALS, WORDPIECE_SPECIALS
from attn.data.tokenizers import Tokenizer
from attn.core.masks import (
    CAUSAL,
    causal_mask,
    key_mask,
    materialize,
    padding_mask,
    positions_from_mask,
    with_bias,
)
from attn.core.positional import NoPositions

DATA = Path(__file__).resolve().parents[2] / "data"
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _any_of(texts: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(map(re.escape, sorted(texts, key=len, reverse=True))))


SPECIALS = _any_of(SEQ_SPECIALS)  # the special tokens of bpe, byte-bpe and chars
WORDPIECE = _any_of(WORDPIECE_SPECIALS)


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Tokenizer]:
    """One tokenizer per trained kind, on a slice of the shipped corpora (well under a second)."""
    bible = load_parallel(DATA / "bible-en-es" / "valid.tsv")
    texts = bible.sources + bible.targets + read_text(DATA / "shakespeare" / "valid.txt")[:100_000].splitlines(True)
    return {
        "bpe": Tokenizer.train_bpe(texts, 1000),
        "unigram": Tokenizer.train_unigram(texts, 1000),
        "byte-bpe": Tokenizer.train_bpe(texts, 600, byte_level=True),
        "chars": Tokenizer.train_chars(texts),
        "wordpiece": Tokenizer.train_wordpiece(load_labelled(DATA / "fortunes-topics" / "valid.tsv").texts, 800),
    }


def alphabet(tokenizer: Tokenizer) -> str:
    """The single characters the tokenizer has a token of, less the word marker."""
    return "".join(sorted({t for t in map(tokenizer.id_to_token, range(tokenizer.vocab_size)) if t and len(t) == 1}
                          - {"▁"}))


def draw_known_text(
    data: st.DataObject, tokenizer: Tokenizer, specials: re.Pattern[str], extra: str = ""
) -> tuple[str, list[int]]:
    """A text over the tokenizer's alphabet (and `extra`) without special-token texts that encodes
    without unk, and its ids. Leading whitespace, where tokenizers differ, is drawn on purpose."""
    lead = data.draw(st.sampled_from(["", " ", "  ", "\n ", " \n"]))
    text = lead + data.draw(st.text(st.sampled_from(alphabet(tokenizer) + extra), max_size=60))
    ids = tokenizer.encode(text)
    assume(not specials.search(text) and tokenizer.unk_id not in ids)
    return text, ids


def with_specials() -> st.SearchStrategy[str]:
    """Any text, with special-token texts mixed in."""
    pieces = st.one_of(st.text(max_size=6), st.sampled_from(sorted({*SEQ_SPECIALS, *WORDPIECE_SPECIALS})))
    return st.lists(pieces, max_size=8).map("".join)


# -- tokenizers -------------------------------------------------------------------------------


@PROPERTY
@given(text=with_specials())
def test_byte_bpe_loses_nothing(tokenizers: dict[str, Tokenizer], text: str) -> None:
    tokenizer = tokenizers["byte-bpe"]
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids, skip_special=False) == text
    assert tokenizer.decode(ids) == SPECIALS.sub("", text)


@PROPERTY
@given(text=st.text(max_size=40), data=st.data())
def test_chars_keeps_seen_characters_and_drops_the_others(
    tokenizers: dict[str, Tokenizer], text: str, data: st.DataObject
) -> None:
    tokenizer = tokenizers["chars"]
    seen = alphabet(tokenizer)
    text += data.draw(st.text(st.sampled_from(seen), max_size=40))
    assume(not SPECIALS.search(text) and "▁" not in text)
    assert tokenizer.decode(tokenizer.encode(text)) == "".join(c for c in text if c in seen)


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
@PROPERTY
@given(data=st.data())
def test_metaspace_kinds_give_back_the_nfc_text_less_one_leading_space(
    tokenizers: dict[str, Tokenizer], data: st.DataObject, kind: str
) -> None:
    tokenizer = tokenizers[kind]
    text, ids = draw_known_text(data, tokenizer, SPECIALS)
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text).removeprefix(" ")


def bert_normal_form(text: str) -> str:
    """Lower case, then NFD without accents (Mn) and control characters (Cc, Cf), as uncased BERT."""
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in decomposed if unicodedata.category(c) not in ("Mn", "Cc", "Cf") or c.isspace())


@PROPERTY
@given(data=st.data())
def test_wordpiece_gives_back_bert_normal_form_up_to_whitespace(
    tokenizers: dict[str, Tokenizer], data: st.DataObject
) -> None:
    tokenizer = tokenizers["wordpiece"]
    text, ids = draw_known_text(data, tokenizer, WORDPIECE, extra=" \t\nÀÉçü")
    assert "".join(tokenizer.decode(ids).split()) == "".join(bert_normal_form(text).split())


# -- masks ------------------------------------------------------------------------------------

lengths_and_width = st.integers(1, 8).flatmap(lambda t: st.tuples(st.lists(st.integers(0, t), min_size=1, max_size=5),
                                                                   st.just(t)))


@PROPERTY
@given(lengths_and_width, st.booleans())
def test_padding_mask_agrees_with_the_lengths(lengths_width: tuple[list[int], int], left: bool) -> None:
    lengths, width = lengths_width
    pad = 0
    rows = [[pad] * (width - n) + list(range(1, n + 1)) if left else list(range(1, n + 1)) + [pad] * (width - n)
            for n in lengths]
    mask = padding_mask(torch.tensor(rows), pad)
    assert mask.sum(1).tolist() == lengths
    places = torch.arange(width)
    expected = places >= width - torch.tensor(lengths)[:, None] if left else places < torch.tensor(lengths)[:, None]
    assert torch.equal(mask, expected)
    assert key_mask(mask).shape == (len(lengths), 1, 1, width) and torch.equal(key_mask(mask)[:, 0, 0], mask)


@PROPERTY
@given(st.integers(1, 12), st.integers(0, 6))
def test_causal_mask_is_the_lower_triangle_offset_by_the_cached_keys(queries: int, cached: int) -> None:
    keys = queries + cached
    mask = causal_mask(queries, keys)
    assert mask.shape == (1, 1, queries, keys) and mask.dtype == torch.bool
    for i in range(queries):
        for j in range(keys):
            assert bool(mask[0, 0, i, j]) == (j <= i + cached)
    if cached:
        with pytest.raises(ValueError, match="keys >= queries"):
            causal_mask(keys, queries)


@PROPERTY
@given(st.integers(1, 12))
def test_materialized_causal_equals_the_explicit_triangle(size: int) -> None:
    explicit = torch.ones(size, size, dtype=torch.bool).tril()
    assert torch.equal(materialize(CAUSAL, size, size, torch.device("cpu"))[0, 0], explicit)
    mask = torch.rand(1, 1, size, size) > 0.5
    assert materialize(mask, size, size, torch.device("cpu")) is mask and materialize(None, size, size, None) is None


@PROPERTY
@given(lengths_and_width, st.integers(0, 3))
def test_self_attention_mask_is_padding_and_causality_combined(
    lengths_width: tuple[list[int], int], cached: int
) -> None:
    lengths, width = lengths_width
    keys = width + cached
    real = torch.arange(keys) >= keys - torch.tensor(lengths)[:, None] - cached  # left-padded keys (B, Tk)
    positions = torch.zeros(len(lengths), width, dtype=torch.long)
    mask, _, bias = self_attention_inputs(NoPositions(), positions, torch.zeros_like(real, dtype=torch.long), real,
                                          causal=True)
    expected = key_mask(real) & causal_mask(width, keys) if width > 1 else key_mask(real)
    allowed = materialize(mask, width, keys, None)  # None: every key allowed (no padding, one query)
    allowed = torch.ones_like(expected) if allowed is None else allowed.expand_as(expected)
    assert bias is None and torch.equal(allowed, expected)
    unpadded, _, _ = self_attention_inputs(NoPositions(), positions, positions, None, causal=True)
    assert unpadded is (CAUSAL if width > 1 else None)


@PROPERTY
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_with_bias_keeps_the_bias_where_allowed_and_minus_infinity_elsewhere(
    queries: int, keys: int, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(2, 1, queries, keys, generator=generator) > 0.4
    bias = torch.randn(2, 3, queries, keys, generator=generator)
    merged = with_bias(mask, bias)
    assert torch.equal(merged, torch.where(mask, bias, torch.tensor(float("-inf"))))
    assert with_bias(mask, None) is mask


@PROPERTY
@given(lengths_and_width)
def test_positions_count_the_real_tokens_before(lengths_width: tuple[list[int], int]) -> None:
    lengths, width = lengths_width
    generator = torch.Generator().manual_seed(sum(lengths) * 31 + width)
    mask = torch.rand(len(lengths), width, generator=generator) > 0.3  # real tokens anywhere, padding anywhere
    positions = positions_from_mask(mask)
    for b in range(mask.size(0)):
        for t in range(width):
            real_so_far = int(mask[b, : t + 1].sum())
            assert int(positions[b, t]) == max(real_so_far - 1, 0)


@PROPERTY
@given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**31 - 1), st.booleans())
def test_fully_masked_rows_give_zero_weights_and_zero_output(queries: int, keys: int, seed: int, biased: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, n, 4, generator=generator) for n in (queries, keys, keys))
    mask = torch.rand(2, 1, queries, keys, generator=generator) > 0.5
    mask[0, 0, 0] = False  # at least one row with every key masked
    bias = torch.randn(1, 2, queries, keys, generator=generator) if biased else None
    weights = attention_weights(q, k, mask, bias)
    empty = ~mask.any(-1)  # (B, 1, Tq)
    assert torch.isfinite(weights).all()
    assert torch.equal(weights.masked_select(~mask), torch.zeros(int((~mask).expand_as(weights).sum())))
    sums = weights.sum(-1)
    torch.testing.assert_close(sums, torch.where(empty, 0.0, 1.0).expand_as(sums))
    for attend in (scaled_dot_product_attention, fast_attention):
        out = attend(q, k, v, mask, bias)
        assert torch.isfinite(out).all(), attend.__name__
        assert torch.equal(out[0, :, 0], torch.zeros_like(out[0, :, 0])), attend.__name__
    torch.testing.assert_close(fast_attention(q, k, v, mask, bias), scaled_dot_product_attention(q, k, v, mask, bias))
