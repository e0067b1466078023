"""Choosing the next token: the logit adjustments (repetition penalty, n-gram ban, suppressed tokens, forced
EOS) and greedy or sampled choice (temperature, top-k, top-p)."""

from __future__ import annotations

import torch
from torch import Tensor

from attn.decoding.generation_config import GenerationConfig


def adjust_logits(
    logits: Tensor, history: Tensor, config: GenerationConfig, eos_id: int | None, at_limit: Tensor
) -> Tensor:
    """Applies the repetition penalty, the n-gram ban, the suppressed tokens and the forced final EOS.

    Args:
        logits: (R, V) scores of the next token (log-probabilities in beam search).
        history: (R, T) the tokens so far, prompt or start token included; -1 marks left padding.
        at_limit: (R,) bool, the rows whose next token is their last.

    Returns:
        (R, V) adjusted scores; banned tokens get -inf.
    """
    if config.repetition_penalty != 1.0:
        logits = penalize_repeats(logits, history, config.repetition_penalty)
    if config.no_repeat_ngram:
        logits = ban_repeated_ngrams(logits, history, config.no_repeat_ngram)
    if config.suppress:
        logits = logits.index_fill(1, torch.tensor(config.suppress, device=logits.device), float("-inf"))
    if config.force_eos and eos_id is not None:
        only_eos = torch.full_like(logits, float("-inf"))
        only_eos[:, eos_id] = 0.0
        logits = torch.where(at_limit[:, None], only_eos, logits)
    return logits


def penalize_repeats(logits: Tensor, history: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019) on every token in history (R, T).

    A seen token's positive score is divided by `penalty`, a negative one multiplied by it, so
    penalty > 1 makes repeats less likely whatever the sign.
    """
    # Padding (-1) points at the row's last token, which is real, so the scatter writes only True.
    index = torch.where(history >= 0, history, history[:, -1:])
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, index, True)  # (R, V)
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def ban_repeated_ngrams(logits: Tensor, history: Tensor, n: int) -> Tensor:
    """Sets to -inf every token that would repeat an n-gram of history (R, T)."""
    if history.size(1) < n:
        return logits
    grams = history.unfold(1, n, 1)  # (R, W, n): every n-gram so far
    suffix = history[:, history.size(1) - n + 1 :]  # (R, n - 1): what the next token would extend
    repeats = (grams[:, :, :-1] == suffix[:, None]).all(-1) & (grams[:, :, -1] >= 0)  # (R, W)
    rows, starts = repeats.nonzero(as_tuple=True)
    return logits.index_put((rows, grams[rows, starts, -1]), torch.tensor(float("-inf"), device=logits.device))


def choose_tokens(logits: Tensor, config: GenerationConfig, generator: torch.Generator | None = None) -> Tensor:
    """(R, V) scores -> (R,) next tokens: argmax, or a sample after temperature, top-k and top-p."""
    if not config.sample:
        return logits.argmax(-1)
    logits = tempered(logits, config.temperature)
    if config.top_k:
        logits = keep_top_k(logits, config.top_k)
    if config.top_p < 1.0:
        logits = keep_top_p(logits, config.top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)


def tempered(logits: Tensor, temperature: float) -> Tensor:
    """(R, V) scores / temperature. Where a tiny temperature overflows a finite score (or is 0 in the scores'
    dtype), the scores less each row's largest instead: the same softmax, with the most likely token at 0 and
    the others at -inf, so sampling becomes the argmax it tends to instead of a softmax of infinities (NaN)."""
    scaled = logits / temperature
    if not (torch.isfinite(logits) & ~torch.isfinite(scaled)).any():
        return scaled
    return (logits - logits.amax(-1, keepdim=True)) / max(temperature, torch.finfo(logits.dtype).tiny)


def keep_top_k(logits: Tensor, k: int) -> Tensor:
    """(R, V) -> (R, V) with every score below the row's k-th largest set to -inf."""
    kth = logits.topk(min(k, logits.size(-1)), dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def keep_top_p(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keeps the most likely tokens whose mass first reaches p.

    A token is dropped when the tokens more likely than it already hold at least p of the
    probability; the most likely token is always kept.
    """
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(-1)
    drop_sorted = probs.cumsum(-1) - probs >= p  # mass strictly before each token
    drop_sorted[:, 0] = False  # a p below float32's smallest number compares as 0, which would drop every token
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def seeded_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)
