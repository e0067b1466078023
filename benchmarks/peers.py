"""The peers' models, built to the same shapes as ours and, through our converters, with the same weights."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from torch import Tensor, nn

from attn.artifacts.pretrained import SpecialIds, export_pretrained
from attn.core.config import ModelConfig, NormPlacement
from attn.data.tokenizers import Tokenizer
from attn.core.layers import ACTIVATIONS
from attn.models import Model, build_model
from attn.core.positional import sinusoidal_table


def quiet_transformers() -> None:
    """Silences `transformers`' progress bars and advice, so the run's own log stays readable."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def twins(config: ModelConfig, family: str, hf_class: str, ids: SpecialIds) -> tuple[Model, nn.Module]:
    """Our model built from `config` and the `transformers` model holding identical weights.

    Ours is exported with `export_pretrained` and read back with `hf_class.from_pretrained`, so
    both start from the same numbers (nothing is downloaded).

    Args:
        config: our config; it must be expressible in `family`.
        family: "gpt2", "bert" or "marian".
        hf_class: the `transformers` class name, e.g. "GPT2LMHeadModel".
        ids: the special ids written to config.json.

    Returns:
        (ours, theirs), both in eval mode on the CPU.
    """
    ours = build_model(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        return ours, twin_of(ours, config, family, hf_class, ids, Path(folder))


def twin_of(
    ours: Model, config: ModelConfig, family: str, hf_class: str, ids: SpecialIds, folder: Path,
    tokenizer: Tokenizer | None = None,
) -> nn.Module:
    """The `transformers` model holding `ours`' weights: exported into `folder` (which stays, for other
    converters to read) and read back with `hf_class.from_pretrained`; in eval mode on the CPU.

    Args:
        ours: our model, built from `config`.
        config, family, hf_class, ids: as for `twins`.
        folder: where the Hugging Face directory is written.
        tokenizer: saved with it when given (a converter may read the vocabulary from it).
    """
    import transformers

    quiet_transformers()
    export_pretrained(ours, config, folder, family, tokenizer=tokenizer, ids=ids)
    return getattr(transformers, hf_class).from_pretrained(folder).eval()


class TorchTransformer(nn.Module):
    """`torch.nn.Transformer` with the paper's scaled embeddings, sinusoids and tied output projection.

    The same work as our encoder-decoder at the same config, post-norm or pre-norm as the config
    says: `nn.Transformer` adds a final LayerNorm to each stack, which is negligible. Its one `dropout` rate applies to the attention
    weights, the FFN activation and the residuals, so compare it with a config whose three
    dropout rates are equal.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        table = sinusoidal_table(c.max_positions, c.d_model, c.sinusoidal_layout)
        self.register_buffer("table", table, persistent=False)
        self.scale = math.sqrt(c.d_model)
        self.dropout = nn.Dropout(c.dropout)
        self.core = nn.Transformer(
            d_model=c.d_model, nhead=c.heads, num_encoder_layers=c.encoder_layers,
            num_decoder_layers=c.decoder_layers, dim_feedforward=c.d_ff, dropout=c.dropout,
            activation=ACTIVATIONS[c.activation], batch_first=True, norm_first=c.norm_placement == NormPlacement.PRE,
        )
        self.out = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.out.weight = self.embed.weight

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """(B, T) long -> (B, T, d_model)."""
        return self.dropout(self.embed(tokens) * self.scale + self.table[: tokens.size(1)])

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) -> logits (B, T, vocab), causal over tgt."""
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        hidden = self.core(self.embed_tokens(src), self.embed_tokens(tgt), tgt_mask=causal, tgt_is_causal=True)
        return self.out(hidden)
