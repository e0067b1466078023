"""Sessions: a prefilled KV cache and the first scores, from which every decode (greedy, sampled, beam) starts, and
the checks of prompts, sources and lengths that come before one."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from attn.decoding.generation_config import PAPER_EXTRA_LENGTH, Decode, GenerationConfig
from attn.core.errors import GenerationError
from attn.core.kv_cache import KVCache
from attn.models import Decoder, EncoderDecoder


class Steppable(Protocol):
    """What decoding needs of a model: `Decoder` and `EncoderDecoder` both provide it."""

    max_positions: int

    def decode_step(self, tokens: Tensor, cache: KVCache) -> Tensor: ...


@dataclasses.dataclass
class Session:
    """A prefilled cache and the scores of every row's first new token. Decoding consumes it.

    Attributes:
        model: the model whose `decode_step` extends `cache`.
        cache: the KV cache, holding the prompt (decoder-only) or the start token (seq2seq).
        logits: (B, V) float scores of each row's first new token.
        history: (B, offset + max(limits)) long: the prompt (left-padded with -1) or the start
            token in the first `offset` columns, then room for the new tokens (-1 until written).
        offset: the column of the first new token.
        limits: (B,) long, the most new tokens of each row.
    """

    model: Steppable
    cache: KVCache
    logits: Tensor
    history: Tensor
    offset: int
    limits: Tensor


def model_device(model: object) -> torch.device:
    """Where a model's weights are (the CPU for a stand-in without parameters, which tests script)."""
    parameters = model.parameters() if isinstance(model, torch.nn.Module) else iter(())
    return next(parameters, torch.empty(0)).device


def decode_one_token(model: Steppable, tokens: Tensor, cache: KVCache) -> Tensor:
    """Feeds one token per row (R,) to the cache; returns the next token's scores (R, V), float."""
    return model.decode_step(tokens[:, None], cache)[:, -1].float()


def start_decoder(model: Decoder, prompts: Sequence[Sequence[int]], config: GenerationConfig) -> Session:
    """Left-pads the prompts and prefills a fresh cache with all of them in one step.

    Raises:
        GenerationError: an empty prompt, a token id outside the vocabulary, or prompt + max_new_tokens
            beyond `model.max_positions`.
    """
    check_prompts(model, prompts)
    check_logit_bias(model, config)
    longest = max(map(len, prompts))
    limit = decoder_limit(config.max_new_tokens, longest, model.max_positions)
    cache = model.new_cache(len(prompts), longest + limit - 1)
    padded = [[-1] * (longest - len(p)) + list(p) + [-1] * limit for p in prompts]
    history = torch.tensor(padded, dtype=torch.long, device=cache.keys.device)
    prompt = history[:, :longest]
    logits = model.decode_step(prompt.clamp(min=0), cache, prompt >= 0, last_only=True)[:, -1].float()
    limits = torch.full((len(prompts),), limit, dtype=torch.long, device=history.device)
    return Session(model, cache, logits, history, longest, limits)


def check_call(config: GenerationConfig, eos_id: int | None, decode: Decode | None) -> None:
    """Raises a GenerationError when `config` needs what the call did not give (a decode function, an EOS id)."""
    if config.stop and decode is None:
        raise GenerationError("stop strings need the tokenizer's decode function: pass decode=tokenizer.decode")
    if config.force_eos and eos_id is None:
        raise GenerationError("force_eos needs eos_id: pass the tokenizer's end-of-sequence id")


def check_logit_bias(model: object, config: GenerationConfig) -> None:
    """Raises a GenerationError (field "logit_bias") naming the first biased id outside the model's vocabulary."""
    vocab_size = _embedding_rows(model, "embeddings")
    bad = next((token for token, _ in config.logit_bias if vocab_size is not None and token >= vocab_size), None)
    if bad is not None:
        raise GenerationError(f"token id {bad} is outside the model's vocabulary of {vocab_size} ids "
                              f"(0..{vocab_size - 1}); bias the model's own token ids", "logit_bias")


def check_prompts(model: Decoder, prompts: Sequence[Sequence[int]]) -> None:
    """Raises a GenerationError for no prompt, an empty prompt or a token id outside the vocabulary."""
    if not prompts or not all(prompts):
        raise GenerationError("every prompt needs at least one token; start empty prompts with a BOS token")
    check_token_ids(prompts, _embedding_rows(model, "embeddings"), "prompt")


def check_token_ids(rows: Sequence[Sequence[int]], vocab_size: int | None, what: str) -> None:
    """Raises a GenerationError naming the first id outside [0, vocab_size); `vocab_size=None` checks nothing."""
    if vocab_size is None:
        return
    for row in rows:
        bad = next((token for token in row if not 0 <= token < vocab_size), None)
        if bad is not None:
            raise GenerationError(
                f"{what} token id {bad} is outside the model's vocabulary of {vocab_size} ids (0..{vocab_size - 1}); "
                "encode the text with the model's own tokenizer"
            )


def _embedding_rows(model: object, *path: str) -> int | None:
    """Rows of the token embedding at `model.<path>.tokens`, or None for a model without one (a
    scripted stand-in in tests)."""
    module = model
    for name in (*path, "tokens"):
        module = getattr(module, name, None)
    return module.num_embeddings if isinstance(module, torch.nn.Embedding) else None


def decoder_limit(max_new_tokens: int | None, longest: int, max_positions: int) -> int:
    """The most new tokens a prompt of `longest` tokens may get: `max_new_tokens`, or all the room left.

    Raises:
        GenerationError: the prompt, or the prompt and `max_new_tokens`, exceed `max_positions`.
    """
    room = max_positions - longest + 1  # the last new token is never fed back
    if room < 1:
        raise GenerationError(f"the longest prompt has {longest} tokens, more than the model's "
                              f"max_positions={max_positions}; shorten the prompt")
    if max_new_tokens is None:
        return room
    if max_new_tokens > room:
        raise GenerationError(
            f"a prompt of {longest} tokens leaves room for {room} new tokens within the model's "
            f"max_positions={max_positions}, but max_new_tokens={max_new_tokens}; set max_new_tokens <= {room} "
            "or shorten the prompt"
        )
    return max_new_tokens


def start_seq2seq(
    model: EncoderDecoder, sources: Sequence[Sequence[int]], start_id: int, pad_id: int, config: GenerationConfig
) -> Session:
    """Encodes the right-padded sources once, builds the cache and feeds the start token.

    Raises:
        GenerationError: an empty or too long source, a token id outside the vocabulary, or
            max_new_tokens beyond `model.max_positions`.
    """
    limits = _seq2seq_limits(config.max_new_tokens, [len(s) for s in sources], model.max_positions)
    check_token_ids(sources, _embedding_rows(model, "encoder", "embeddings"), "source")
    check_token_ids([[start_id]], _embedding_rows(model, "embeddings"), "start_id")
    check_logit_bias(model, config)
    device = model.lm_head.weight.device
    longest = max(map(len, sources))
    src = torch.tensor([list(s) + [pad_id] * (longest - len(s)) for s in sources], dtype=torch.long, device=device)
    lengths = torch.tensor([len(s) for s in sources], device=device)
    src_mask = torch.arange(longest, device=device) < lengths[:, None]  # (B, S)
    cache = model.new_cache(model.encode(src, src_mask), src_mask, max(limits))  # start + all but the last
    history = torch.full((len(sources), 1 + max(limits)), -1, dtype=torch.long, device=device)
    history[:, 0] = start_id
    logits = decode_one_token(model, history[:, 0], cache)
    return Session(model, cache, logits, history, 1, torch.tensor(limits, device=device))


def _seq2seq_limits(max_new_tokens: int | None, lengths: list[int], max_positions: int) -> list[int]:
    if not lengths or min(lengths) == 0:
        raise GenerationError("every source needs at least one token (tokenizers append </s>); drop empty lines")
    if max(lengths) > max_positions:
        raise GenerationError(f"a source of {max(lengths)} tokens exceeds the model's max_positions="
                              f"{max_positions}; split or truncate long sentences")
    if max_new_tokens is None:  # the paper's limit, within what the decoder's positions allow
        return [min(n + PAPER_EXTRA_LENGTH, max_positions) for n in lengths]
    if max_new_tokens > max_positions:
        raise GenerationError(f"max_new_tokens={max_new_tokens} exceeds the model's max_positions="
                              f"{max_positions}; set max_new_tokens <= {max_positions}")
    return [max_new_tokens] * len(lengths)
