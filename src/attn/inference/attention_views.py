"""Attention weights of a model on a text, ready to draw or to send (`attn attention`, `/v1/attention`).

Maps come with their head layout (`Heads`), so a viewer can group query heads by the key/value head they share.
An encoder-decoder's maps read the source as `translate` does, and its decoder side is the translation
`translate` gives by default, so a map is drawn for the text and the translation a user sees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from attn.inference.inputs import expect_model
from attn.inference.translation import source_ids, translation_ids
from attn.artifacts import Bundle
from attn.core.attention import Heads
from attn.data.framing import classifier_inputs
from attn.decoding.attention_maps import (
    AttentionTrail,
    attention_maps,
    attention_module,
    layer_count,
)
from attn.core.errors import AttnError
from attn.models import Encoder, EncoderDecoder

# Which heads a map shows: one head, every head (None), or the mean over heads.
HeadChoice = int | Literal["mean"] | None


@dataclasses.dataclass(frozen=True)
class AttentionView:
    """One layer's attention on a text, ready to draw or to send.

    Attributes:
        weights: (queries, keys) float, one head's weights or the mean over heads.
        queries: the attending tokens (rows), as text pieces; `keys`: the attended ones (columns).
        title: what is shown, e.g. "cross attention, layer -1, mean over heads".
    """

    weights: Tensor
    queries: list[str]
    keys: list[str]
    title: str


def attention_of(bundle: Bundle, text: str, kind: str, layer: int, head: int | None) -> AttentionView:
    """Runs the model on `text` and returns one layer's attention (one head, or the mean over heads).

    Raises:
        AttnError: no such layer, head or kind of attention in this model.
    """
    tokens = _attention_tokens(bundle, text, kind)
    weights = attention_maps(bundle.model, tokens.source, layer, kind, tokens.target)  # (h, Tq, Tk)
    chosen = _one_head(weights, head)
    which = "mean over heads" if head is None else f"head {head}"
    return AttentionView(chosen, tokens.queries, tokens.keys, f"{kind} attention, layer {layer}, {which}")


@dataclasses.dataclass(frozen=True)
class AttentionLayers:
    """Several layers' and heads' attention on a text.

    Attributes:
        weights: (layers, heads, rows, cols) float: the chosen layers; every head, one head, or the mean over
            heads (one map); rows x cols is queries x keys, or less when the maps were pooled.
        target: an encoder-decoder's translation of the text, whose tokens (after the start token) are the
            queries of "decoder" and "cross" attention; None otherwise.
        layers: the layers of this kind the model has (all of them, whichever were chosen).
        layout: the heads per layer the model has, and the key/value head each query head shares.
    """

    weights: Tensor
    queries: list[str]
    keys: list[str]
    target: str | None
    layers: int
    layout: Heads

    @property
    def heads(self) -> int:
        return self.layout.heads


def attention_layers(bundle: Bundle, text: str, kind: str, layer: int | None = None, head: HeadChoice = None,
                     pool: int | None = None, max_weights: int | None = None) -> AttentionLayers:
    """Attention of every layer (or one) and every head (or one, or their mean) of `kind` on `text`.

    "self" is the only self-attention of an encoder-only or decoder-only model.

    Args:
        pool: at most this many rows and columns per map: cell (i, j) holds the largest weight of query block i
            and key block j (adaptive max pooling). None: every query and key.
        max_weights: the most weights the maps may hold, checked before any is computed.

    Raises:
        AttnError: no such layer, head or kind of attention in this model; more weights than `max_weights`.
    """
    tokens = _attention_tokens(bundle, text, kind)
    count = layer_count(bundle.model, kind)
    chosen = range(count) if layer is None else [layer]
    layout = attention_module(bundle.model, kind, chosen[0]).layout
    if isinstance(head, int):
        _checked_head(head, layout.heads)
    rows, cols = (len(tokens.queries), len(tokens.keys)) if pool is None else (
        min(pool, len(tokens.queries)), min(pool, len(tokens.keys)))
    _check_size((len(chosen), layout.heads if head is None else 1, rows, cols), max_weights)
    weights = torch.stack([_heads(attention_maps(bundle.model, tokens.source, i, kind, tokens.target), head)
                           for i in chosen])  # (layers, heads, Tq, Tk)
    if pool is not None:
        weights = F.adaptive_max_pool2d(weights, (rows, cols))
    target = None if tokens.output is None else bundle.tokenizer.decode(tokens.output)
    return AttentionLayers(weights, tokens.queries, tokens.keys, target, count, layout)


def _heads(weights: Tensor, head: HeadChoice) -> Tensor:
    """(h, Tq, Tk) -> every head, one head or the mean over heads, (h or 1, Tq, Tk)."""
    if head is None:
        return weights
    return weights.mean(0, keepdim=True) if head == "mean" else weights[head : head + 1]


def _check_size(shape: tuple[int, int, int, int], max_weights: int | None) -> None:
    layers, heads, rows, cols = shape
    weights = layers * heads * rows * cols
    if max_weights is not None and weights > max_weights:
        raise AttnError(f"{layers} layers x {heads} heads x {rows} queries x {cols} keys are {weights:,} weights, "
                        f"more than the {max_weights:,} one request may ask for; choose one layer, one head or the "
                        "mean over heads (head \"mean\"), or pool the maps (pool)")


def alignment(bundle: Bundle, source: Sequence[int], output: Sequence[int]) -> Tensor:
    """(len(output), len(source)) cross-attention of the last decoder layer, mean over heads.

    Row i is how the decoder attended over the source ids when it chose output token i (its query
    is at decoder position i, whose input is the start token, then the output before token i).
    """
    expect_model(bundle, EncoderDecoder, "alignment")
    weights = attention_maps(bundle.model, source, -1, "cross", [bundle.start_id, *output[:-1]])  # (h, T, S)
    return weights.mean(0)[: len(output)]  # no rows for an empty output


class AttentionFollower:
    """The attention with which a decoder-only model chose each token of a continuation, one token at a time,
    in one layer (one head, or None for the mean over heads); one cached `AttentionTrail` step per token.

    Args:
        layer: 0-based (negative counts from the last).
        room: the most tokens the continuation may have.
    """

    def __init__(self, bundle: Bundle, prompt: Sequence[int], layer: int, head: int | None, room: int) -> None:
        self.bundle = bundle
        self.head = head
        self.keys = token_pieces(bundle, prompt)
        self.trail = AttentionTrail(bundle.model, prompt, layer, max(room - 1, 0))  # the last token is never fed
        self.previous: int | None = None  # the token chosen last, fed to the trail when the next one comes

    def next(self, token: int) -> tuple[list[str], Tensor]:
        """The keys and the (T,) weights with which the model chose `token`, the continuation's next token."""
        if self.previous is not None:
            self.trail.push(self.previous)
        self.previous = token
        keys = list(self.keys)
        self.keys.append(token_pieces(self.bundle, [token])[0])
        return keys, _one_head(self.trail.weights[:, None], self.head)[0]


def attention_source(bundle: Bundle, text: str) -> list[int]:
    """The ids of `text` as the model's own calls read them: `translate`'s source, `classify`'s framed input
    (`[CLS] … [SEP]`), or a decoder-only model's unframed prompt."""
    if isinstance(bundle.model, EncoderDecoder):
        return source_ids(bundle, [text])[0]
    if isinstance(bundle.model, Encoder):
        return classifier_inputs(bundle.tokenizer, [text], None, bundle.model.stack.max_positions)[0][0]
    return bundle.tokenizer.encode(text)


@dataclasses.dataclass(frozen=True)
class _AttentionTokens:
    source: list[int]
    target: list[int] | None  # the decoder's inputs: the start token, then the output
    output: list[int] | None
    queries: list[str]
    keys: list[str]


def _attention_tokens(bundle: Bundle, text: str, kind: str) -> _AttentionTokens:
    """The ids a map of `kind` is computed on and the pieces of its queries and keys."""
    source = attention_source(bundle, text)
    target = output = None
    if isinstance(bundle.model, EncoderDecoder) and kind != "encoder":
        (output,) = translation_ids(bundle, [source])
        # An output that ran to the decoder's last position leaves no position for its last token as an input.
        target = [bundle.start_id, *output][: bundle.model.max_positions]
    pieces = token_pieces(bundle, source)
    target_pieces = token_pieces(bundle, target) if target else pieces
    queries, keys = {"cross": (target_pieces, pieces), "decoder": (target_pieces, target_pieces)}.get(
        kind, (pieces, pieces))
    return _AttentionTokens(source, target, output, queries, keys)


def token_pieces(bundle: Bundle, ids: Sequence[int]) -> list[str]:
    """The vocabulary entry of each id (e.g. "Ġthe", "##ing"), or the id itself when it has none."""
    return [bundle.tokenizer.id_to_token(i) or str(i) for i in ids]


def _checked_head(head: int, heads: int) -> int:
    if not 0 <= head < heads:
        raise AttnError(f"head {head} does not exist: the model has heads 0..{heads - 1}")
    return head


def _one_head(weights: Tensor, head: int | None) -> Tensor:
    """(h, Tq, Tk) -> (Tq, Tk): one head, or the mean over heads."""
    return weights.mean(0) if head is None else weights[_checked_head(head, weights.size(0))]
