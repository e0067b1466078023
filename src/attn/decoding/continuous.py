"""The decoding loop of decoder-only models: rows join a running batch between decode steps and leave it as soon as
they are done. The library's `generate` and `stream`, the command line, chat and the server's continuous batching
all decode through it.

A `RunningBatch` keeps one KV cache for all its active rows; `add` queues a prompt with its own decoding settings.
Each `step` prefills the queued prompts together (one left-padded `decode_step`) and stacks their cache under the
running one (`stack_rows`), chooses every row's next token under that row's settings, drops the rows that finished
or were `remove`d (`KVCache.reorder`, then `KVCache.trim_padding` frees the columns only they used), and feeds the
others' tokens in one `decode_one_token`. With a `PrefixCache`, a prompt that starts with tokens decoded before
starts from their keys and values and feeds only the rest, and every row that leaves keeps its keys and values there.
A row with a grammar (`attn.decoding.grammar`) gets its own matcher from the batch's `matcher` factory when it is
added; at each step its scores outside the matcher's mask are -inf, and its token is fed to the matcher.

Padding is masked and positions count real tokens only, so each row gets the tokens and scores it gets decoded alone
(scores equal up to float rounding of the larger matrix products), whatever joins or leaves around it. Only the
batch's longest row sets the cache length, so a short request that joins a long one attends over padding it skips,
and no row ever needs more than `max_positions` columns.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Hashable, Iterator, Sequence

import torch
from torch import Tensor

from attn.core.errors import GenerationError
from attn.core.kv_cache import KVCache, stack_rows
from attn.core.linear import packed_weights
from attn.decoding.generation_config import Decode, GenerationConfig
from attn.decoding.grammar import MatcherFactory, RowMatcher
from attn.decoding.prefix_cache import PrefixCache, start_from_prefix
from attn.decoding.sampling import adjust_logits, choose_tokens, seeded_generator
from attn.decoding.session import (
    check_call,
    check_logit_bias,
    check_prompts,
    decode_one_token,
    decoder_limit,
    model_device,
    start_decoder,
)
from attn.decoding.text import StopStrings
from attn.models import Decoder


@dataclasses.dataclass(frozen=True)
class RowToken:
    """One row's new token.

    Attributes:
        key: the key the row was added with.
        token: the chosen token id (the EOS id too, when the row ends with it).
        scores: (V,) float, the scores the token was chosen from: the model's logits after the logit
            adjustments (logit bias, penalties, bans, forced EOS) and the grammar's mask, before temperature,
            top-k, top-p and min-p.
        finish: None while the row goes on; "stop" (EOS, a stop id, a stop string or a completed grammar) or
            "length" (its token limit) on its last step.
    """

    key: Hashable
    token: int
    scores: Tensor
    finish: str | None


@dataclasses.dataclass
class _Row:
    key: Hashable
    config: GenerationConfig
    limit: int
    history: list[int]  # the prompt, then every new token
    prompt_length: int
    generator: torch.Generator | None
    stops: StopStrings | None
    grammar: RowMatcher | None

    @property
    def capacity(self) -> int:
        """Cache columns the row needs: its prompt and every new token but the last."""
        return self.prompt_length + self.limit - 1


class RunningBatch:
    """The active rows of a decoder-only model, decoded together one token per step.

    Example:
        >>> import torch
        >>> from attn import GenerationConfig, build_model, preset
        >>> _ = torch.manual_seed(0)
        >>> batch = RunningBatch(build_model(preset("char-gpt-tiny")).eval(), eos_id=None)
        >>> batch.add("a", [2, 17, 5], GenerationConfig(max_new_tokens=2))
        >>> [step.key for step in batch.step()]
        ['a']
        >>> batch.add("b", [2, 9], GenerationConfig(max_new_tokens=3))
        >>> [(step.key, step.finish) for step in batch.step()]
        [('a', 'length'), ('b', None)]
        >>> len(batch)
        1
    """

    def __init__(self, model: Decoder, eos_id: int | None, decode: Decode | None = None,
                 matcher: MatcherFactory | None = None, prefix_cache: PrefixCache | None = None) -> None:
        """Args:
        model: the language model, in eval mode.
        eos_id: the token that ends a row (None: rows end at their limit or a stop string).
        decode: token ids -> text; needed by rows with stop strings.
        matcher: a row's grammar -> its matcher (`attn.decoding.grammar`); needed by rows with a grammar.
        prefix_cache: where prompts find the keys and values of their start, and rows that leave keep theirs.
        """
        self.model = model
        self.eos_id = eos_id
        self.decode = decode
        self.matcher = matcher
        self.rows: list[_Row] = []  # in cache order
        self.pending: list[_Row] = []
        self.cache: KVCache | None = None
        self.logits: Tensor | None = None  # (len(rows), V): each running row's next-token scores
        self._packing = contextlib.ExitStack()  # the model's packed weights, held while rows run
        self.prefix_cache = prefix_cache
        self._intact = True  # whether the cache holds every row's keys and values, none half written

    def __len__(self) -> int:
        """Rows running or waiting to join."""
        return len(self.rows) + len(self.pending)

    def add(self, key: Hashable, prompt: Sequence[int], config: GenerationConfig,
            generator: torch.Generator | None = None) -> None:
        """Queues a prompt; it joins the batch at the next `step`. A sampled row draws from `generator` when one
        is given (rows may share one), else from its own, seeded by `config.seed`.

        Raises:
            GenerationError: beam search (it cannot join a batch row by row), an empty prompt, an id
                outside the vocabulary (in the prompt or `logit_bias`), a prompt and limit beyond
                `max_positions`, or settings that need what this batch lacks (stop strings without `decode`,
                `force_eos` without `eos_id`, a grammar without `matcher`), or a grammar the vocabulary cannot
                follow.
        """
        if config.beam_size > 1:
            raise GenerationError("beam search cannot join a running batch; set beam_size=1")
        check_call(config, self.eos_id, self.decode)
        check_prompts(self.model, [prompt])
        check_logit_bias(self.model, config)
        limit = decoder_limit(config.max_new_tokens, len(prompt), self.model.max_positions)
        stops = StopStrings(config.stop, self.decode) if config.stop and self.decode is not None else None
        generator = generator if generator is not None else seeded_generator(config.seed, model_device(self.model))
        grammar = self._grammar(config)
        self.pending.append(_Row(key, config, limit, list(prompt), len(prompt), generator, stops, grammar))

    def close(self) -> None:
        """Drops every row, running or waiting, and releases the model's packed weights."""
        self.pending = []
        self._keep([])
        self._packing.close()

    def remove(self, key: Hashable) -> None:
        """Drops a row (e.g. its client went away); an unknown or finished key is ignored."""
        self.pending = [row for row in self.pending if row.key != key]
        self._keep([i for i, row in enumerate(self.rows) if row.key != key])

    @torch.inference_mode()
    def step(self) -> list[RowToken]:
        """Joins the queued prompts, chooses one token per row, drops the finished rows and feeds the rest.

        Returns:
            One `RowToken` per row that was active in this step, in batch order.
        """
        self.prefill()
        steps = [self._choose(i, row) for i, row in enumerate(self.rows)]
        self._keep([i for i, step in enumerate(steps) if step.finish is None])
        if self.rows:
            tokens = torch.tensor([row.history[-1] for row in self.rows], device=self.logits.device)
            with self._changing():
                self.logits = decode_one_token(self.model, tokens, self.cache)
        return steps

    @torch.inference_mode()
    def prefill(self) -> None:
        """Joins the queued prompts now (`step` does it first): their errors and the prefill come before any token.

        The prompts the prefix cache knows no start of are prefilled together; each other one alone, from its
        cached start. While rows run, the model's float32 linear weights stay packed for the CPU
        (`packed_weights`); they are released when the last row leaves.
        """
        if not self.pending:
            return
        if self.cache is None:
            self._packing.enter_context(packed_weights(self.model))
        capacity = max(row.capacity for row in self.rows + self.pending)
        found = [(row, None if self.prefix_cache is None else self.prefix_cache.longest_prefix(row.history))
                 for row in self.pending]
        fresh = [row for row, prefix in found if prefix is None]
        parts = [] if self.cache is None else [(self.cache, self.logits)]
        parts += [self._start(fresh)] if fresh else []
        parts += [start_from_prefix(self.model, row.history, prefix, row.capacity)
                  for row, prefix in found if prefix is not None]
        with self._changing():
            self.cache = parts[0][0] if len(parts) == 1 else stack_rows(*(c for c, _ in parts), max_length=capacity)
            self.logits = torch.cat([logits for _, logits in parts])
            self.rows += fresh + [row for row, prefix in found if prefix is not None]
            self.pending = []

    def _start(self, rows: list[_Row]) -> tuple[KVCache, Tensor]:
        """The cache of `rows`' prompts, prefilled together, and their next tokens' scores."""
        longest = max(row.prompt_length for row in rows)
        prefill = GenerationConfig(max_new_tokens=max(row.capacity for row in rows) - longest + 1)
        session = start_decoder(self.model, [row.history for row in rows], prefill)
        return session.cache, session.logits

    def _choose(self, index: int, row: _Row) -> RowToken:
        logits = self.logits[index : index + 1]  # (1, V)
        at_limit = len(row.history) - row.prompt_length + 1 == row.limit
        history = torch.tensor([row.history], device=logits.device)
        adjusted = adjust_logits(logits, history, row.config, self.eos_id, torch.tensor([at_limit]),
                                 row.prompt_length)
        if row.grammar is not None:
            adjusted = adjusted.where(self._allowed(row, adjusted.size(-1)).to(adjusted.device), float("-inf"))
        token = int(choose_tokens(adjusted, row.config, row.generator))
        row.history.append(token)
        return RowToken(row.key, token, adjusted[0], self._finish(row, token, at_limit))

    def _grammar(self, config: GenerationConfig) -> RowMatcher | None:
        if config.grammar is None:
            return None
        if self.matcher is None:
            raise GenerationError("this running batch was made without a grammar matcher; pass matcher= to "
                                  "RunningBatch (attn.data.grammar_tokens.grammar_matchers(tokenizer))",
                                  "grammar")
        return self.matcher(config.grammar)

    def _allowed(self, row: _Row, vocab_size: int) -> Tensor:
        """(V,) bool: the tokens the row's grammar allows next, its end ids too while the grammar could end."""
        allowed = row.grammar.allowed(vocab_size)
        if row.grammar.accepting():
            allowed[[token for token in row.config.end_ids(self.eos_id) if token < vocab_size]] = True
        return allowed

    def _finish(self, row: _Row, token: int, at_limit: bool) -> str | None:
        if token in row.config.end_ids(self.eos_id):
            return "stop"
        if row.grammar is not None:
            row.grammar.consume(token)
            if row.grammar.done():
                return "stop"
        if row.stops is not None and row.stops.completed(row.history, row.prompt_length):
            return "stop"
        return "length" if at_limit else None

    def _keep(self, kept: list[int]) -> None:
        """Keeps the running rows at `kept` (cache order) and frees what the others held."""
        if len(kept) == len(self.rows):
            return
        if self.prefix_cache is not None and self._intact:
            for i in sorted(set(range(len(self.rows))) - set(kept)):
                self.prefix_cache.keep(self.cache, i, self.rows[i].history)
        with self._changing():
            self.rows = [self.rows[i] for i in kept]
            if not kept:
                self.cache = self.logits = None
                self._packing.close()
                return
            index = torch.tensor(kept, device=self.logits.device)
            self.cache.reorder(index)
            self.cache.trim_padding()
            self.logits = self.logits[index]

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Marks the cache as changing: one that an error cuts short holds keys never written, which no row may
        leave to the prefix cache (until the batch empties)."""
        intact = self._intact or self.cache is None
        self._intact = False
        yield
        self._intact = intact
