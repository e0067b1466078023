"""Decoding: turning a model's scores into tokens.

`generation_config` holds the settings (`GenerationConfig`, and `requested`, which makes one from what a user
asks, temperature 0 being greedy); `text` finds stop strings and streams a decode's text, token by token; `session` prefills a
KV cache (`start_decoder`, `start_seq2seq`); `sampling` adjusts the scores and chooses a token; `beam_search`
searches on the same sessions; `continuous` is the decoding loop of decoder-only models, a batch that rows join
and leave between decode steps; `generation` holds the library's calls (`generate`, `stream`,
`generate_seq2seq`, and beam search when `beam_size > 1`); `prefix_cache` keeps the keys and values of sequences
decoded before for the prompts that start with them (`PrefixCache`); `attention_maps` captures attention weights for plots
and the server's viewer. Each module imports only those listed before it.
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
    DEFAULT_NEW_TOKENS,
    PAPER_EXTRA_LENGTH,
    Decode,
    EarlyStopping,
    GenerationConfig,
    LengthNorm,
    check_samples,
    requested,
)
from attn.decoding.prefix_cache import DEFAULT_PREFIX_CACHE_BYTES, PrefixCache
from attn.decoding.continuous import RowToken, RunningBatch
from attn.decoding.generation import decode_rows, generate, generate_seq2seq, stream
from attn.decoding.sampling import (
    add_logit_bias,
    ban_repeated_ngrams,
    choose_tokens,
    keep_min_p,
    keep_top_k,
    keep_top_p,
    penalize_counts,
    penalize_repeats,
    warped,
)
from attn.decoding.session import Session, start_decoder, start_seq2seq
from attn.decoding.text import CompletionText, GeneratedToken, StopStrings, TextStream, text_pieces

__all__ = [
    "CompletionText", "DEFAULT_NEW_TOKENS", "DEFAULT_PREFIX_CACHE_BYTES", "PAPER_EXTRA_LENGTH", "Decode", "EarlyStopping", "GeneratedToken", "GenerationConfig", "Hypothesis", "LengthNorm", "PrefixCache", "RowToken", "RunningBatch",
    "Session", "StopStrings", "TextStream",
    "add_logit_bias", "attention_maps", "ban_repeated_ngrams", "beam_search", "beam_search_seq2seq", "capture_attention", "check_samples",
    "choose_tokens", "decode_rows", "generate", "generate_seq2seq", "huggingface_config", "keep_min_p", "keep_top_k",
    "keep_top_p", "length_penalty", "penalize_counts", "penalize_repeats", "requested", "start_decoder",
    "start_seq2seq", "stream", "text_pieces", "warped",
]
