"""An encoder classifier's inputs: single texts in the tokenizer's frame, sentence pairs framed as BERT reads them."""

from __future__ import annotations

from collections.abc import Sequence

from attn.data.checks import check_at_least
from attn.data.tokenizers import Tokenizer
from attn.core.errors import ConfigError


def frame_pairs(
    firsts: Sequence[Sequence[int]], seconds: Sequence[Sequence[int]], cls_id: int, sep_id: int, max_length: int
) -> tuple[list[list[int]], list[list[int]]]:
    """BERT's sentence-pair inputs: `[CLS] a [SEP] b [SEP]`, segment ids 0 up to the first `[SEP]` and 1 after it.

    As in Devlin et al., section 3, figure 2. A pair longer than `max_length` loses tokens from the end of its
    longer text first, as Hugging Face's "longest_first" truncation does, so that both texts keep their beginnings.

    Args:
        firsts: token ids of the first texts, without special tokens.
        seconds: token ids of the second texts, as many.
        max_length: most tokens of a framed pair (at least 5: three specials and a token of each text).

    Returns:
        (ids, segments): one list per pair, each of the same length.
    """
    check_at_least("max_length", max_length, 5)
    ids: list[list[int]] = []
    segments: list[list[int]] = []
    for first, second in zip(firsts, seconds, strict=True):
        keep_first, keep_second = _longest_first(len(first), len(second), max_length - 3)
        ids.append([cls_id, *first[:keep_first], sep_id, *second[:keep_second], sep_id])
        segments.append([0] * (keep_first + 2) + [1] * (keep_second + 1))
    return ids, segments


def classifier_inputs(
    tokenizer: Tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int
) -> tuple[list[list[int]], list[list[int]] | None]:
    """Token ids of an encoder classifier's inputs, for training and inference alike.

    Args:
        texts: the texts (the first of each pair).
        pairs: the second texts, or None for single texts.
        max_length: most tokens of an input (the model's max_positions, or less).

    Returns:
        (ids, segments): single texts in the tokenizer's frame (`[CLS] … [SEP]`) cut to `max_length`,
        and segments None; or `frame_pairs` of the pairs.

    Raises:
        ConfigError: pairs with a tokenizer that has no [CLS] or [SEP] token.
    """
    if pairs is None:
        return [seq[:max_length] for seq in tokenizer.encode_batch(texts, add_special=True)], None
    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        raise ConfigError("tokenizer", "has no [CLS] or [SEP] token, which sentence pairs need; train a tokenizer "
                                       "(every trained kind has both) or use a BERT-style one")
    firsts, seconds = tokenizer.encode_batch(texts), tokenizer.encode_batch(pairs)
    return frame_pairs(firsts, seconds, tokenizer.cls_id, tokenizer.sep_id, max_length)


def _longest_first(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many tokens of each text fit `budget`: the shorter text keeps up to half (rounded down), the longer one
    the rest; on a tie the second text counts as the longer."""
    if first + second <= budget:
        return first, second
    if first > second:
        kept = min(second, budget // 2)
        return budget - kept, kept
    kept = min(first, budget // 2)
    return kept, budget - kept
