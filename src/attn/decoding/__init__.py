"""Decoding: turning a model's scores into tokens.

`config` holds the settings (`GenerationConfig`); `session` prefills a KV cache (`start_decoder`,
`start_seq2seq`); `sampling` adjusts the scores and chooses a token; `beam_search` searches on the
same sessions; `generation` runs greedy, sampled and streamed decodes (and beam search when
`beam_size > 1`); `continuous` runs a batch that requests join and leave between decode steps (the
server's continuous batching); `attention_maps` captures attention weights for plots and the server's viewer.
Each module imports only those listed before it.
"""

from attn.decoding.attention_maps import attention_maps, capture_attention
from attn.decoding.beam_search import (
    Hypothesis,
    beam_search,
    beam_search_seq2seq,
    huggingface_config,
    length_penalty,
)
from attn.decoding.generation_config import (
    PAPER_EXTRA_LENGTH,
    Decode,
    EarlyStopping,
    GenerationConfig,
    LengthNorm,
)
from attn.decoding.continuous import RowToken, RunningBatch
from attn.decoding.generation import decode_rows, generate, generate_seq2seq, stream
from attn.decoding.sampling import (
    ban_repeated_ngrams,
    choose_tokens,
    keep_top_k,
    keep_top_p,
    penalize_repeats,
)
from attn.decoding.session import Session, start_decoder, start_seq2seq

__all__ = [
    "PAPER_EXTRA_LENGTH", "Decode", "EarlyStopping", "GenerationConfig", "Hypothesis", "LengthNorm", "RowToken", "RunningBatch",
    "Session",
    "attention_maps", "ban_repeated_ngrams", "beam_search", "beam_search_seq2seq", "capture_attention",
    "choose_tokens", "decode_rows", "generate", "generate_seq2seq", "huggingface_config", "keep_top_k", "keep_top_p",
    "length_penalty", "penalize_repeats", "start_decoder", "start_seq2seq", "stream",
]
