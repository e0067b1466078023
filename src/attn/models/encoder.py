"""The encoder stack and the encoder-only model (BERT-style).

`EncoderStack` is the paper's encoder (section 3.1): embeddings, N self-attention blocks,
an optional final LayerNorm. `Encoder` adds the heads of an encoder-only model: masked-LM
logits, classification from the first token or the mean of the tokens, and mean-pooled sentence
embeddings. The stack also takes precomputed input vectors instead of token ids (`features`),
e.g. image regions.

Departures from the paper: BERT's segment embeddings and LayerNorm after the embeddings are
config options, off for the paper's presets.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.blocks import Block, check_tokens, self_attention_inputs
from attn.dropout import Dropout
from attn.errors import AttnError, ShapeError
from attn.layers import Embeddings, OutputProjection


class EncoderStack(nn.Module):
    """Embeddings -> N x Block -> final norm (or identity)."""

    def __init__(self, embeddings: Embeddings, blocks: list[Block], final_norm: nn.Module, max_positions: int):
        super().__init__()
        self.embeddings = embeddings
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm
        self.max_positions = max_positions

    def forward(
        self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None, rows: int | None = None
    ) -> Tensor:
        """tokens (B, T) long, mask (B, T) bool (True = real token) -> (B, T, d_model).

        `rows`: the output of only the first that many positions, (B, rows, d_model); the last
        block then computes no more than their queries, residuals and FFN.
        """
        check_tokens(tokens, mask, self.max_positions)
        positions = positions_from_first_token(tokens, mask)
        return self._blocks(self.embeddings(tokens, positions, segments), positions, mask, rows)

    def features(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Input vectors x (B, N, d_model) instead of token ids -> (B, N, d_model)."""
        d_model = self.embeddings.tokens.embedding_dim
        if x.dim() != 3 or x.size(-1) != d_model:
            raise ShapeError(f"expected input vectors of shape (batch, length, {d_model}), got {tuple(x.shape)}")
        check_tokens(x[..., 0].long(), mask, self.max_positions)
        positions = positions_from_first_token(x[..., 0], mask)
        return self._blocks(self.embeddings.vectors(x, positions), positions, mask)

    def _blocks(self, x: Tensor, positions: Tensor, mask: Tensor | None, rows: int | None = None) -> Tensor:
        attn_mask, rotate, bias = self_attention_inputs(
            self.embeddings.positions, positions, positions, mask, causal=False
        )
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, rotate, bias, queries=rows if i == last else None)
        return self.final_norm(x)


def positions_from_first_token(tokens: Tensor, mask: Tensor | None) -> Tensor:
    """(B, T) tokens, (B, T) bool mask -> (B, T) long positions 0, 1, ... from each row's first real token.

    A right-padded row (or no mask) is numbered 0..T-1 as before; a left-padded row numbers its
    real tokens as it would alone, so the padding side does not change what they see. The left
    padding gets position 0. Computed on the device, without a host sync.
    """
    b, t = tokens.shape
    steps = torch.arange(t, device=tokens.device).expand(b, t)
    if mask is None:
        return steps
    first = mask.long().argmax(-1, keepdim=True)  # (B, 1): the first True (0 for a row of padding)
    return (steps - first).clamp(min=0)


class MaskedLMHead(nn.Module):
    """BERT's MLM head: dense -> activation -> LayerNorm -> vocabulary projection (+ bias)."""

    def __init__(self, transform: nn.Linear, act, norm: nn.LayerNorm, output: OutputProjection) -> None:
        super().__init__()
        self.transform = transform
        self.act = act
        self.norm = norm
        self.output = output

    def forward(self, hidden: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, vocab)."""
        return self.output(self.norm(self.act(self.transform(hidden))))


class Pooler(nn.Module):
    """tanh(W h_0 + b): BERT's summary of the first ([CLS]) token."""

    rows = 1  # the hidden states it reads: the first position's (None: all)

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        """(B, T, d_model) -> (B, d_model)."""
        return torch.tanh(self.dense(hidden[:, 0]))


class FirstToken(nn.Module):
    """The first token's vector, unchanged: the pooler of a model built without one."""

    rows = 1

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        return hidden[:, 0]


def mean_pool(hidden: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of the real (mask True) tokens' vectors: (B, T, d_model) -> (B, d_model)."""
    weights = hidden.new_ones(hidden.shape[:2]) if mask is None else mask.to(hidden.dtype)
    summed = (hidden * weights[..., None]).sum(1)
    return summed / weights.sum(1, keepdim=True).clamp(min=1e-9)


class MeanPool(nn.Module):
    """The mean of the real tokens' vectors: the pooler of pooling='mean'."""

    rows = None

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        return mean_pool(hidden, mask)


class Encoder(nn.Module):
    """Encoder-only model: hidden states plus MLM, classification and sentence-embedding heads."""

    def __init__(
        self,
        stack: EncoderStack,
        mlm: MaskedLMHead | None,
        pooler: nn.Module,
        classifier: nn.Module | None,
        dropout: float,
    ) -> None:
        super().__init__()
        self.stack = stack
        self.mlm = mlm
        self.pooler = pooler
        self.classifier = classifier
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> hidden states (B, T, d_model)."""
        return self.stack(tokens, mask, segments)

    def encode_features(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Input vectors (B, N, d_model) -> hidden states (B, N, d_model)."""
        return self.stack.features(x, mask)

    def mlm_logits(self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> masked-LM logits (B, T, vocab)."""
        if self.mlm is None:
            raise AttnError("this encoder was built without a masked-LM head (mlm_head=false)")
        return self.mlm(self.stack(tokens, mask, segments))

    def pooled(self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> the pooled vector (B, d_model): the first token's or the mean (config.pooling)."""
        return self.pooler(self.stack(tokens, mask, segments, rows=self.pooler.rows), mask)

    def classify(self, tokens: Tensor, mask: Tensor | None = None, segments: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> class logits (B, num_labels), from the pooled vector."""
        if self.classifier is None:
            raise AttnError("this encoder has no classification head: build it with num_labels > 0")
        return self.classifier(self.dropout(self.pooled(tokens, mask, segments)))

    def sentence_embedding(self, tokens: Tensor, mask: Tensor | None = None, normalize: bool = True) -> Tensor:
        """Mean of the real tokens' hidden states (B, d_model), L2-normalised by default."""
        mean = mean_pool(self.stack(tokens, mask), mask)
        return F.normalize(mean, dim=-1) if normalize else mean
