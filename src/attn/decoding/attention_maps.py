"""Attention probabilities of one layer, captured on request by the module's `capture()` (`attn.core.attention`).

`attention_maps` captures them for one example and one layer; `AttentionTrail` for each new token of a decode, one
cached step at a time.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from attn.core.attention import AttentionCapture, CrossAttention, SelfAttention
from attn.core.errors import AttnError
from attn.models import Decoder, Encoder, EncoderDecoder, Model


class AttentionKind(str, enum.Enum):
    ENCODER = "encoder"  # self-attention of an encoder stack (Encoder, EncoderDecoder)
    DECODER = "decoder"  # causal self-attention of a decoder stack (Decoder, EncoderDecoder)
    CROSS = "cross"  # decoder queries over the encoder output (EncoderDecoder)
    SELF = "self"  # the only self-attention of an encoder-only or decoder-only model (Encoder, Decoder)


def capture_attention(module: SelfAttention | CrossAttention, run: Callable[[], object]) -> AttentionCapture:
    """Runs `run()`, a call of the model such as `lambda: model(tokens)`, once and returns the attention weights that
    `module` computed in it."""
    with module.capture() as captures:
        run()
    if len(captures) != 1:
        raise AttnError(f"the chosen attention module ran {len(captures)} times; capture one forward pass")
    return captures[0]


def _kind(kind: AttentionKind | str) -> AttentionKind:
    try:
        return AttentionKind(kind)
    except ValueError:
        valid = ", ".join(repr(k.value) for k in AttentionKind)
        raise AttnError(f"unknown attention kind {kind!r}; choose one of {valid}") from None


def attention_module(model: Model, kind: AttentionKind | str, layer: int) -> SelfAttention | CrossAttention:
    """The attention module of `kind` in layer `layer` (0-based; negative counts from the last) of `model`."""
    kind = _kind(kind)
    modules = _stack(model, kind)
    if not -len(modules) <= layer < len(modules):
        raise AttnError(f"layer {layer} does not exist: the {kind.value} stack has layers 0..{len(modules) - 1} "
                        "(negative indices count from the last)")
    return modules[layer]


def layer_count(model: Model, kind: AttentionKind | str) -> int:
    """How many layers of `model` have attention of `kind`."""
    return len(_stack(model, _kind(kind)))


def _stack(model: Model, kind: AttentionKind) -> list[Any]:
    stacks: dict[AttentionKind, list[Any]] = {}
    if isinstance(model, Decoder):
        stacks[AttentionKind.DECODER] = stacks[AttentionKind.SELF] = [block.attn for block in model.blocks]
    elif isinstance(model, Encoder):
        stacks[AttentionKind.ENCODER] = stacks[AttentionKind.SELF] = [block.attn for block in model.stack.blocks]
    else:
        stacks[AttentionKind.ENCODER] = [block.attn for block in model.encoder.blocks]
        stacks[AttentionKind.DECODER] = [block.attn for block in model.blocks]
        stacks[AttentionKind.CROSS] = [block.cross for block in model.blocks]
    if kind not in stacks:
        valid = ", ".join(k.value for k in stacks)
        raise AttnError(f"a {type(model).__name__} has no {kind.value!r} attention; choose one of {valid}")
    return stacks[kind]


@torch.no_grad()
def attention_maps(
    model: Model,
    tokens: Sequence[int],
    layer: int,
    kind: AttentionKind | str,
    target: Sequence[int] | None = None,
) -> Tensor:
    """Attention probabilities of one layer for one example, without changing what `forward` returns.

    Args:
        model: any of the three models, in eval mode.
        tokens: the input token ids (the source, for an encoder-decoder).
        kind: "encoder", "decoder", "cross" or "self" (see `AttentionKind`).
        target: the decoder input of an encoder-decoder; needed for "decoder" and "cross".

    Returns:
        (h, Tq, Tk) weights; every row sums to 1 over the keys it may attend.
    """
    module = attention_module(model, kind, layer)
    device = next(model.parameters()).device
    src = torch.tensor([list(tokens)], dtype=torch.long, device=device)
    if not isinstance(model, EncoderDecoder):
        return capture_attention(module, lambda: model(src)).weights[0]
    if _kind(kind) == AttentionKind.ENCODER:
        return capture_attention(module, lambda: model.encode(src)).weights[0]
    if not target:
        raise AttnError(f"{_kind(kind).value} attention of an encoder-decoder needs the decoder input: "
                        "pass target=[start_id, ...]")
    tgt = torch.tensor([list(target)], dtype=torch.long, device=device)
    return capture_attention(module, lambda: model(src, tgt)).weights[0]


class AttentionTrail:
    """How the newest token of a growing sequence attends over all of it, in one self-attention layer of a
    decoder-only model: the attention with which the model chooses the token that follows, token after token.

    The trail keeps a KV cache of its own, so a new token costs one cached decode step, not a forward pass over the
    whole sequence. Its weights equal the last row of `attention_maps` on the sequence so far (up to float rounding).

    Args:
        model: a decoder-only model, in eval mode.
        prompt: the sequence's first tokens.
        layer: the layer, 0-based (negative counts from the last).
        room: the most tokens that will be `push`ed.

    Attributes:
        weights: (h, T) the newest token's attention over the T tokens so far (itself included).

    Example:
        >>> import torch
        >>> from attn import build_model, preset
        >>> _ = torch.manual_seed(0)
        >>> model = build_model(preset("char-gpt-tiny")).eval()
        >>> trail = AttentionTrail(model, [2, 17, 5], layer=-1, room=1)
        >>> trail.push(9)
        >>> trail.weights.shape, torch.allclose(trail.weights, attention_maps(model, [2, 17, 5, 9], -1, "self")[:, -1])
        (torch.Size([4, 4]), True)
    """

    def __init__(self, model: Decoder, prompt: Sequence[int], layer: int, room: int) -> None:
        self.module = attention_module(model, AttentionKind.SELF, layer)
        self.model = model
        self.cache = model.new_cache(1, len(prompt) + room)
        self.weights = self._step(prompt)

    def push(self, token: int) -> None:
        """Appends `token`: `weights` becomes its attention over the sequence, itself included."""
        self.weights = self._step([token])

    @torch.no_grad()
    def _step(self, tokens: Sequence[int]) -> Tensor:
        """(h, T) the last of `tokens`' attention over every cached token, once the cache holds `tokens`."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.cache.keys.device)
        return capture_attention(self.module, lambda: self.model.decode_step(ids, self.cache)).weights[0, :, -1]
