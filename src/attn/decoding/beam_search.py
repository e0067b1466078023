"""Beam search over the KV cache, for the encoder-decoder and the decoder-only model.

Every sentence keeps k = `beam_size` alive beams. A step scores all k * V one-token continuations by their summed
log-probability and takes the 2k best. A continuation that ends (EOS, or the sentence's length limit) becomes a
finished hypothesis only if it ranks among the k best of the step; the k best that do not end are the next alive
beams, and the cache follows them with `KVCache.follow`, so beam j's cache row is `placed[j]`, not j. Each sentence
keeps its k best finished hypotheses by score; when a sentence is done it leaves the batch. This is the candidate
rule of Hugging Face's beam search, so with the same settings (`huggingface_config`) both return the same hypotheses.

Length penalty. The paper (section 6.1) uses alpha = 0.6 with the formula of GNMT (Wu et al. 2016):
    lp(Y) = ((5 + |Y|) / 6) ** alpha,        score(Y) = log P(Y) / lp(Y)       (LengthNorm.GNMT)
Hugging Face's `length_penalty` divides by a plain power of the length:
    score(Y) = log P(Y) / |Y| ** length_penalty                                  (LengthNorm.HF)
Both count |Y| as transformers does: the generated tokens including the final EOS, excluding the decoder start
token (encoder-decoder) or the prompt (decoder-only); log P(Y) includes EOS's log-probability. At the same alpha
GNMT's penalty rewards length less than HF's (the ratio lp(Y') / lp(Y) of a longer to a shorter output is smaller),
so 0.6 under GNMT is not 0.6 under HF. alpha = 0 turns either off.

Stopping (`GenerationConfig.early_stopping`). A sentence always stops at its length limit; before that, once all k
finished slots are filled, it stops under
- BOUND (the default, exact): when no alive beam can beat the worst finished hypothesis. An alive beam of t tokens
  with log-probability l <= 0 can only finish with L in [t + 1, limit] tokens and a log-probability <= l, so its
  score is at most l / max(lp(t + 1), lp(limit)) (lp is monotone in L). Once the best alive beam's bound is <= the
  worst finished score, continuing cannot change the k best, so BOUND returns what NONE returns, sooner.
- HEURISTIC, Hugging Face's `early_stopping=False`: compares l / lp(t), the best alive beam's score were it to end
  now, with the worst finished score; with alpha > 0 it can stop before a longer hypothesis would have won.
- FIRST, Hugging Face's `early_stopping=True`: as soon as the k slots are filled.
- NONE: never; every sentence runs to its limit.
Hugging Face's `early_stopping="never"` is BOUND for alpha > 0 and HEURISTIC otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from attn.decoding.generation_config import EarlyStopping, GenerationConfig, LengthNorm
from attn.decoding.sampling import adjust_logits
from attn.decoding.session import (
    Session,
    decode_one_token,
    start_decoder,
    start_seq2seq,
)
from attn.core.errors import GenerationError
from attn.core.linear import in_inference
from attn.models import Decoder, EncoderDecoder

NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One finished beam.

    Attributes:
        tokens: the generated tokens (no prompt or start token, no EOS).
        score: logprob / lp(|Y|).
        logprob: the summed log-probability of the tokens, and of EOS when `finished`.
        finished: True if it ended with EOS, False if it reached the length limit.
    """

    tokens: list[int]
    score: float
    logprob: float
    finished: bool


def length_penalty(length: float | Tensor, alpha: float, norm: LengthNorm) -> float | Tensor:
    """lp(|Y|): ((5 + |Y|) / 6) ** alpha for GNMT, |Y| ** alpha for Hugging Face."""
    if norm == LengthNorm.GNMT:
        return ((5 + length) / 6) ** alpha
    return length**alpha


@dataclasses.dataclass
class BeamState:
    """The search state of the B sentences still decoding, k beams each (best first).

    Attributes:
        sentence: (B,) index of each sentence among the inputs.
        history: (B, k, T) each alive beam's tokens: the session's prompt or start token columns,
            then the generated ones; -1 where nothing is written.
        alive_logprob: (B, k) summed log-probabilities of the alive beams; -inf = no beam.
        finished_history: (B, k, T) the finished hypotheses' tokens, laid out as `history`.
        finished_score: (B, k) their scores, best first; -inf = empty slot.
        finished_logprob: (B, k) their summed log-probabilities.
        finished_length: (B, k) long, |Y| (EOS included).
        finished_eos: (B, k) bool, whether each ended with EOS (or one of `config.stop_ids`).
        limits: (B,) long, the most new tokens of each sentence.
    """

    sentence: Tensor
    history: Tensor
    alive_logprob: Tensor
    finished_history: Tensor
    finished_score: Tensor
    finished_logprob: Tensor
    finished_length: Tensor
    finished_eos: Tensor
    limits: Tensor

    def select(self, keep: Tensor) -> BeamState:
        """The state of sentences `keep` (B',) only."""
        return BeamState(*(getattr(self, f.name)[keep] for f in dataclasses.fields(self)))


def initial_state(session: Session, beam_size: int) -> BeamState:
    """k copies of each session row; only the first is alive, so the first step expands one beam."""
    b, k = session.history.size(0), beam_size
    history = session.history[:, None].repeat(1, k, 1)  # (B, k, T)
    alive = torch.full((b, k), NEG_INF, device=history.device)
    alive[:, 0] = 0.0
    return BeamState(
        sentence=torch.arange(b, device=history.device),
        history=history,
        alive_logprob=alive,
        finished_history=history.clone(),
        finished_score=torch.full_like(alive, NEG_INF),
        finished_logprob=torch.zeros_like(alive),
        finished_length=torch.zeros_like(alive, dtype=torch.long),
        finished_eos=torch.zeros_like(alive, dtype=torch.bool),
        limits=session.limits,
    )


def _gather(x: Tensor, index: Tensor) -> Tensor:
    """x (B, N, ...) and index (B, M) -> (B, M, ...): x[b, index[b, m]]."""
    return x.take_along_dim(index.view(*index.shape, *([1] * (x.dim() - 2))), dim=1)


def advance(
    state: BeamState, logprobs: Tensor, step: int, offset: int, config: GenerationConfig, eos_id: int | None
) -> tuple[BeamState, Tensor]:
    """One beam step.

    Args:
        state: the state before the step; alive beams hold `step` generated tokens.
        logprobs: (B * k, V) adjusted log-probabilities of each alive beam's next token.
        offset: the history column of the first generated token.

    Returns:
        The new state, and (B * k,) the row of the pre-step cache each new alive beam extends.
    """
    b, k = state.alive_logprob.shape
    vocab = logprobs.size(-1)
    total = state.alive_logprob[:, :, None] + logprobs.view(b, k, vocab)  # (B, k, V)
    cand_logprob, flat = total.view(b, k * vocab).topk(2 * k)  # (B, 2k), best first
    parent, token = flat // vocab, flat % vocab
    cand_history = _gather(state.history, parent)  # (B, 2k, T)
    cand_history[:, :, offset + step] = token
    eos = torch.isin(token, torch.tensor(config.end_ids(eos_id), dtype=torch.long, device=token.device))
    ends = eos | (step + 1 >= state.limits[:, None])  # (B, 2k)
    finished = _merge_finished(state, cand_history, cand_logprob, ends, eos, step + 1, config)
    alive_logprob, alive = torch.where(ends, NEG_INF, cand_logprob).topk(k)  # (B, k)
    rows = torch.arange(b, device=flat.device)[:, None] * k + _gather(parent, alive)
    new = dataclasses.replace(finished, history=_gather(cand_history, alive), alive_logprob=alive_logprob)
    return new, rows.flatten()


def _merge_finished(
    state: BeamState, cand_history: Tensor, cand_logprob: Tensor, ends: Tensor, eos: Tensor, length: int,
    config: GenerationConfig,
) -> BeamState:
    """Adds the ending candidates among the k best of the step to the k best finished hypotheses."""
    k = state.alive_logprob.size(1)
    among_best = torch.arange(2 * k, device=ends.device) < k
    lp = length_penalty(length, config.length_penalty, config.length_norm)
    score = torch.where(ends & among_best, cand_logprob / lp, NEG_INF)  # (B, 2k)
    pairs = {
        "finished_history": (state.finished_history, cand_history),
        "finished_score": (state.finished_score, score),
        "finished_logprob": (state.finished_logprob, cand_logprob),
        "finished_length": (state.finished_length, torch.full_like(eos, length, dtype=torch.long)),
        "finished_eos": (state.finished_eos, eos),
    }
    best = torch.cat(pairs["finished_score"], dim=1).topk(k).indices  # (B, k) of the 3k
    return dataclasses.replace(state, **{name: _gather(torch.cat(pair, dim=1), best) for name, pair in pairs.items()})


def _alive_bound(state: BeamState, length: int, config: GenerationConfig) -> Tensor:
    """(B,) the score the stopping rule expects at most from the alive beams (of `length` tokens)."""
    best = state.alive_logprob[:, 0]
    rule = config.early_stopping
    if rule == EarlyStopping.FIRST:
        return torch.full_like(best, NEG_INF)
    if rule == EarlyStopping.NONE:
        return torch.full_like(best, float("inf"))
    if rule == EarlyStopping.HEURISTIC:
        return best / length_penalty(length, config.length_penalty, config.length_norm)
    longest = state.limits.to(best.dtype)
    next_lp = length_penalty(torch.full_like(best, length + 1), config.length_penalty, config.length_norm)
    limit_lp = length_penalty(longest, config.length_penalty, config.length_norm)
    return best / torch.maximum(next_lp, limit_lp)


def sentences_done(state: BeamState, length: int, config: GenerationConfig) -> Tensor:
    """(B,) bool: the sentences whose k best finished hypotheses can no longer change."""
    worst = state.finished_score[:, -1]
    full = worst > NEG_INF
    return (length >= state.limits) | (full & (_alive_bound(state, length, config) <= worst))


def _hypotheses(state: BeamState, offset: int, n_best: int) -> list[list[Hypothesis]]:
    """The n best finished hypotheses of every sentence in `state`, best first."""
    results = []
    for b in range(state.sentence.size(0)):
        found = []
        for j in range(n_best):
            score = float(state.finished_score[b, j])
            if score == NEG_INF:
                break
            length = int(state.finished_length[b, j])
            eos = bool(state.finished_eos[b, j])
            tokens = state.finished_history[b, j, offset : offset + length - int(eos)].tolist()
            found.append(Hypothesis(tokens, score, float(state.finished_logprob[b, j]), eos))
        results.append(found)
    return results


def _retire(
    state: BeamState, rows: Tensor, done: Tensor, results: list[list[Hypothesis]], offset: int, n_best: int
) -> tuple[BeamState, Tensor, Tensor]:
    """Stores the hypotheses of the sentences that are done; returns the others' state, cache rows and
    their indices among the sentences of `state` (the memory rows they read)."""
    finished = state.select(done.nonzero().squeeze(1))
    for sentence, found in zip(finished.sentence.tolist(), _hypotheses(finished, offset, n_best)):
        results[sentence] = found
    keep = (~done).nonzero().squeeze(1)
    return state.select(keep), rows.view(done.size(0), -1)[keep].flatten(), keep


def search(session: Session, config: GenerationConfig, eos_id: int | None) -> list[list[Hypothesis]]:
    """Runs beam search on a prefilled session.

    Returns:
        For every session row, its `config.n_best` best hypotheses, best first.
    """
    k = config.beam_size
    batch = session.logits.size(0)
    session.cache.reorder(torch.arange(batch, device=session.logits.device).repeat_interleave(k))
    placed = torch.arange(batch * k, device=session.logits.device)  # the cache row of each beam
    state = initial_state(session, k)
    logprobs = session.logits.repeat_interleave(k, 0).log_softmax(-1)  # (B * k, V)
    results: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for step in range(int(session.limits.max())):
        history = state.history.flatten(0, 1)[:, : session.offset + step]
        at_limit = (state.limits == step + 1).repeat_interleave(k)
        logprobs = adjust_logits(logprobs, history, config, eos_id, at_limit, session.offset)
        state, parents = advance(state, logprobs, step, session.offset, config, eos_id)
        parents = placed[parents]  # the cache rows the new beams continue
        done = sentences_done(state, step + 1, config)
        if bool(done.any()):
            state, parents, kept = _retire(state, parents, done, results, session.offset, config.n_best)
            if parents.numel() == 0:
                break
            session.cache.reorder(parents, sources=kept)
            placed = torch.arange(parents.numel(), device=parents.device)
        else:
            placed = session.cache.follow(parents)
        tokens = torch.empty_like(placed)
        tokens[placed] = state.history[:, :, session.offset + step].flatten()
        logprobs = decode_one_token(session.model, tokens, session.cache).index_select(0, placed).log_softmax(-1)
    return results


def _check(config: GenerationConfig, eos_id: int | None) -> None:
    if config.sample or config.stop:
        raise GenerationError("beam search neither samples nor uses stop strings; set sample=False and stop=()")
    if config.force_eos and eos_id is None:
        raise GenerationError("force_eos needs eos_id: pass the tokenizer's end-of-sequence id")


@in_inference
def beam_search(
    model: Decoder, prompts: Sequence[Sequence[int]], config: GenerationConfig, eos_id: int | None = None
) -> list[list[Hypothesis]]:
    """Beam search continuations of each prompt with a decoder-only model (prompts left-padded in one batch).

    Returns:
        For every prompt, its `config.n_best` best hypotheses, best first.
    """
    _check(config, eos_id)
    return search(start_decoder(model, prompts, config), config, eos_id)


@in_inference
def beam_search_seq2seq(
    model: EncoderDecoder,
    sources: Sequence[Sequence[int]],
    start_id: int,
    eos_id: int | None,
    pad_id: int,
    config: GenerationConfig,
) -> list[list[Hypothesis]]:
    """Beam search translations of a batch of sources (right-padded, with their mask), at most source length + 50
    tokens each unless `config.max_new_tokens` says otherwise.

    Returns:
        For every source, its `config.n_best` best hypotheses, best first.
    """
    _check(config, eos_id)
    return search(start_seq2seq(model, sources, start_id, pad_id, config), config, eos_id)


def huggingface_config(
    num_beams: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    num_return_sequences: int = 1,
    forced_eos: bool = False,
) -> GenerationConfig:
    """The config under which our beam search returns what HF `generate(num_beams=..., ...)` does.

    Args:
        num_beams, max_new_tokens, length_penalty, early_stopping, num_return_sequences: as in
            Hugging Face's `GenerationConfig`.
        forced_eos: True when the HF model config sets `forced_eos_token_id` (Marian does): HF then
            forces EOS as the last token allowed.
    """
    rules = {True: EarlyStopping.FIRST, False: EarlyStopping.HEURISTIC}
    if early_stopping == "never":
        rule = EarlyStopping.BOUND if length_penalty > 0 else EarlyStopping.HEURISTIC
    elif early_stopping in rules:
        rule = rules[early_stopping]
    else:
        raise GenerationError(f"expected True, False or 'never', got {early_stopping!r}", "early_stopping")
    return GenerationConfig(
        max_new_tokens=max_new_tokens, beam_size=num_beams, length_penalty=length_penalty,
        length_norm=LengthNorm.HF, early_stopping=rule, n_best=num_return_sequences, force_eos=forced_eos,
    )
