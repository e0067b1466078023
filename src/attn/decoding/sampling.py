"""Choosing the next token: the logit adjustments (logit bias, repetition, frequency and presence penalties,
n-gram ban, suppressed tokens, forced EOS) and greedy or sampled choice (temperature, top-k, top-p, min-p)."""

from __future__ import annotations

import torch
from torch import Tensor

from attn.decoding.generation_config import GenerationConfig


def adjust_logits(
    logits: Tensor, history: Tensor, config: GenerationConfig, eos_id: int | None, at_limit: Tensor, offset: int
) -> Tensor:
    """Applies the logit bias, the repetition, frequency and presence penalties, the n-gram ban, the suppressed
    tokens and the forced final EOS, in that order.

    Args:
        logits: (R, V) scores of the next token (log-probabilities in beam search).
        history: (R, T) the tokens so far, prompt or start token included; -1 marks left padding.
        at_limit: (R,) bool, the rows whose next token is their last.
        offset: the history column of the first new token: frequency and presence count the columns from it.

    Returns:
        (R, V) adjusted scores; banned tokens get -inf.
    """
    if config.logit_bias:
        logits = add_logit_bias(logits, config.logit_bias)
    if config.repetition_penalty != 1.0:
        logits = penalize_repeats(logits, history, config.repetition_penalty)
    if config.frequency_penalty or config.presence_penalty:
        logits = penalize_counts(logits, history[:, offset:], config.frequency_penalty, config.presence_penalty)
    if config.no_repeat_ngram:
        logits = ban_repeated_ngrams(logits, history, config.no_repeat_ngram)
    if config.suppress:
        logits = logits.index_fill(1, torch.tensor(config.suppress, device=logits.device), float("-inf"))
    if config.force_eos and eos_id is not None:
        only_eos = torch.full_like(logits, float("-inf"))
        only_eos[:, eos_id] = 0.0
        logits = torch.where(at_limit[:, None], only_eos, logits)
    return logits


def add_logit_bias(logits: Tensor, bias: tuple[tuple[int, float], ...]) -> Tensor:
    """(R, V) scores with each (token id, bias) pair's bias added to that token's score in every row."""
    tokens = torch.tensor([token for token, _ in bias], device=logits.device)
    values = torch.tensor([value for _, value in bias], dtype=logits.dtype, device=logits.device)
    return logits.index_add(1, tokens, values[None].expand(logits.size(0), -1))


def penalize_counts(logits: Tensor, generated: Tensor, frequency: float, presence: float) -> Tensor:
    """OpenAI's frequency and presence penalties: each token's score less count x frequency + (count > 0) x presence,
    where count is how often the token occurs in its row of `generated` (R, T) (-1 entries are not tokens)."""
    counts = torch.zeros_like(logits).scatter_add_(1, generated.clamp(min=0), (generated >= 0).to(logits.dtype))
    return logits - counts * frequency - (counts > 0).to(logits.dtype) * presence


def penalize_repeats(logits: Tensor, history: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019) on every token in history (R, T).

    A seen token's positive score is divided by `penalty`, a negative one multiplied by it, so
    penalty > 1 makes repeats less likely whatever the sign; a finite score stays within its dtype's range.
    """
    # Padding (-1) points at the row's last token, which is real, so the scatter writes only True.
    index = torch.where(history >= 0, history, history[:, -1:])
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, index, True)  # (R, V)
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    finite = torch.finfo(logits.dtype)  # a penalty near 0 or huge overflows no finite score (infinities give NaN)
    penalized = torch.where(torch.isfinite(logits), penalized.clamp(finite.min, finite.max), logits)
    return torch.where(seen, penalized, logits)


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
    """(R, V) scores -> (R,) next tokens: argmax, or a sample of the `warped` scores."""
    if not config.sample:
        return logits.argmax(-1)
    return torch.multinomial(warped(logits, config).softmax(-1), 1, generator=generator).squeeze(1)


def warped(logits: Tensor, config: GenerationConfig) -> Tensor:
    """(R, V) scores -> (R, V) the scores a token is sampled from: after temperature, top-k, top-p and min-p, in
    transformers' order; the tokens filtered out are at -inf."""
    logits = tempered(logits, config.temperature)
    if config.top_k:
        logits = keep_top_k(logits, config.top_k)
    if config.top_p < 1.0:
        logits = keep_top_p(logits, config.top_p)
    if config.min_p:
        logits = keep_min_p(logits, config.min_p)
    return logits


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


def keep_min_p(logits: Tensor, p: float) -> Tensor:
    """Min-p filtering (Nguyen et al. 2024): (R, V) -> (R, V) with every token less likely than p times the row's
    most likely token set to -inf; the most likely token is always kept."""
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < p * probs.amax(-1, keepdim=True), float("-inf"))


def seeded_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)
