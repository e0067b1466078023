"""The encoder stack and the encoder-only model (BERT-style).

`EncoderStack` is the paper's encoder (section 3.1): embeddings, N self-attention blocks, an optional final
norm. `Encoder` adds the heads of an encoder-only model: masked-LM logits, classification from the first token or
the mean of the tokens, and mean-pooled sentence embeddings.

Departures from the paper: BERT's segment embeddings and LayerNorm after the embeddings are config options, off
for the paper's presets.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.core.blocks import Block, check_tokens, self_attention_inputs, token_positions
from attn.core.errors import AttnError
from attn.core.layers import Embeddings
from attn.core.linear import Linear


class EncoderStack(nn.Module):
    """Embeddings -> N x Block -> final norm (or identity)."""

    def __init__(self, embeddings: Embeddings, blocks: list[Block], final_norm: nn.Module, max_positions: int):
        super().__init__()
        self.embeddings = embeddings
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm
        self.max_positions = max_positions

    def forward(self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) long, mask (B, T) bool (True = real token) -> (B, T, d_model)."""
        check_tokens(tokens, mask, self.max_positions)
        positions = token_positions(tokens, mask)
        x = self.embeddings(tokens, positions, segments)
        attn_mask, rotate, bias = self_attention_inputs(
            self.embeddings.positions, positions, positions, mask, causal=False
        )
        for block in self.blocks:
            x = block(x, attn_mask, rotate, bias)
        return self.final_norm(x)


class MaskedLMTransform(nn.Module):
    """BERT's MLM head before the vocabulary projection: dense -> activation -> LayerNorm."""

    def __init__(self, transform: nn.Linear, act: Callable[[Tensor], Tensor], norm: nn.LayerNorm) -> None:
        super().__init__()
        self.transform = transform
        self.act = act
        self.norm = norm

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return self.norm(self.act(self.transform(hidden)))


class Pooler(nn.Module):
    """tanh(W h_0 + b): BERT's summary of the first ([CLS]) token."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = Linear(d_model, d_model)

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        """(B, T, d_model) -> (B, d_model)."""
        return torch.tanh(self.dense(hidden[:, 0]))


class FirstToken(nn.Module):
    """The first token's vector, unchanged: the pooler of a model built without one."""

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        return hidden[:, 0]


def mean_pool(hidden: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of the real (mask True) tokens' vectors: (B, T, d_model) -> (B, d_model)."""
    weights = hidden.new_ones(hidden.shape[:2]) if mask is None else mask.to(hidden.dtype)
    summed = (hidden * weights[..., None]).sum(1)
    return summed / weights.sum(1, keepdim=True).clamp(min=1e-9)


class MeanPool(nn.Module):
    """The mean of the real tokens' vectors: the pooler of pooling='mean'."""

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        return mean_pool(hidden, mask)


class Encoder(nn.Module):
    """Encoder-only model: hidden states plus MLM, classification and sentence-embedding heads."""

    def __init__(
        self,
        stack: EncoderStack,
        mlm: MaskedLMTransform | None,
        lm_head: nn.Linear | None,
        pooler: nn.Module,
        classifier: nn.Module | None,
        dropout: float,
    ) -> None:
        """`mlm` and `lm_head` (the vocabulary projection) make the masked-LM head; both or neither."""
        super().__init__()
        self.stack = stack
        self.mlm = mlm
        self.lm_head = lm_head
        self.pooler = pooler
        self.classifier = classifier
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> hidden states (B, T, d_model)."""
        return self.stack(tokens, mask, segments)

    def mlm_logits(self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> masked-LM logits (B, T, vocab)."""
        if self.mlm is None or self.lm_head is None:
            raise AttnError("this encoder was built without a masked-LM head (mlm_head=false)")
        return self.lm_head(self.mlm(self.stack(tokens, mask, segments)))

    def pooled(self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> the pooled vector (B, d_model): the first token's or the mean (config.pooling)."""
        return self.pooler(self.stack(tokens, mask, segments), mask)

    def classify(self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> class logits (B, num_labels), from the pooled vector."""
        if self.classifier is None:
            raise AttnError("this encoder has no classification head: build it with num_labels > 0")
        return self.classifier(self.dropout(self.pooled(tokens, mask, segments)))

    def sentence_embedding(self, tokens: Tensor, mask: Tensor | None = None, normalize: bool = True) -> Tensor:
        """Mean of the real tokens' hidden states (B, d_model), L2-normalised by default."""
        mean = mean_pool(self.stack(tokens, mask), mask)
        return F.normalize(mean, dim=-1) if normalize else mean
