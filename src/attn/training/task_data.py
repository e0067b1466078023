"""Task adapters: how each task turns its files into `Batch`es for one training engine.

A task's adapter (a `TaskBuilder`) trains the tokenizer on the training split (or reuses the resumed checkpoint's,
or loads `tokenizer.path`), sets the model's vocabulary size (and number of labels) from it, and returns a
`TaskData`. Which adapter, architecture and validation metric a task has is declared by its entry in the task
registry (`attn.app.tasks`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from attn.core.config import ModelConfig
from attn.core.errors import ConfigError, DataFormatError
from attn.data.batches import (
    Batch,
    BatchSource,
    IndexedBatches,
    WindowBatches,
    lm_batch,
)
from attn.data.chat_data import (
    ChatExample,
    collate_chat,
    drop_long,
    encode_conversations,
    read_conversations,
    unscored_id,
)
from attn.data.chat_template import ChatTemplate
from attn.data.collate import (
    Pair,
    TranslationBatch,
    collate_classification,
    collate_translation,
    filter_long,
    pad_batch,
)
from attn.data.file_formats import resolve_format
from attn.data.framing import classifier_inputs
from attn.data.lm_stream import LMStream
from attn.data.readers import (
    Fields,
    LabelledCorpus,
    load_labelled,
    load_parallel,
    read_table,
)
from attn.data.samplers import TokenBudgetSampler
from attn.data.text import read_text
from attn.data.text_files import corpus_files, text_chunks
from attn.data.token_cache import token_ids
from attn.data.tokenizer_roles import ROLE_TOKENS
from attn.data.tokenizers import Tokenizer
from attn.training.config_sections import BatchConfig, TokenizerConfig
from attn.training.runconfig import RunConfig


@dataclass
class TaskData:
    """Everything the trainer needs from a task.

    Attributes:
        model_config: the model to build (vocabulary and labels filled in from the data).
        head: the model method that gives the logits: "forward", "classify" or "mlm_logits".
        ignore_id: the target id that is not scored (the padding id), or None.
        train: this rank's training batches.
        valid: returns the validation batches (every rank sees all of them), or None.
        metric: the validation metric for early stopping and the best checkpoint (`TaskSpec.build` sets the task's).
        info: JSON-ready facts inference needs (`task.json`), e.g. the label names.
    """

    model_config: ModelConfig
    head: str
    ignore_id: int | None
    train: BatchSource
    valid: Callable[[], Iterable[Batch]] | None
    metric: str = "val_loss"
    tokenizer: Tokenizer | None = None
    info: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None  # the fine-tuned model's, kept in its checkpoints


@dataclass(frozen=True)
class TaskContext:
    """What a task builder needs to know about the process and the run being resumed."""

    rank: int = 0
    world_size: int = 1
    tokenizer: Tokenizer | None = None  # the resumed checkpoint's, reused instead of training one
    chat_template: str | None = None  # the resumed or fine-tuned model's


TaskBuilder = Callable[[RunConfig, ModelConfig, TaskContext], TaskData]
TOKEN_CACHE_FOLDER = "data"  # in the run directory: the language model's token caches (attn.data.token_cache)
TextBatches = tuple[list[list[int]], Callable[..., Batch]]  # encoded texts, (indices, epoch) -> Batch


# -- translation ------------------------------------------------------------------------------


def translation_task(config: RunConfig, model_config: ModelConfig, ctx: TaskContext) -> TaskData:
    """Source -> target translation with a joint source-target tokenizer (section 5.1)."""
    corpus = load_parallel(_required(config.data.train, "data.train"), config.data.fields())
    tokenizer = ctx.tokenizer or make_tokenizer(config.tokenizer, corpus.sources + corpus.targets)
    pad, bos, eos = special_ids(tokenizer, "pad", "bos", "eos", source=config.tokenizer.path)
    model_config = model_config.replace(vocab_size=tokenizer.vocab_size)
    limit = length_limit(config, model_config)
    pairs, _ = filter_long(_encode_pairs(tokenizer, corpus.sources, corpus.targets), limit, "drop")
    batch = config.batch

    def batches_of(examples: Sequence[Pair]) -> Callable[..., Batch]:
        return lambda indices, epoch=0: translation_batch(
            collate_translation([examples[i] for i in indices], pad, bos, eos)
        )

    sampler = TokenBudgetSampler(
        [len(s) for s, _ in pairs], [len(t) + 1 for _, t in pairs], batch.max_tokens, batch.max_sentences,
        seed=config.train.seed,
    )
    train = IndexedBatches(sampler, batches_of(pairs), ctx.rank, ctx.world_size)
    valid = None
    if config.data.valid:
        held_out = load_parallel(_required(config.data.valid, "data.valid"), config.data.fields())
        valid_pairs, _ = filter_long(_encode_pairs(tokenizer, held_out.sources, held_out.targets), limit, "truncate")
        valid = _fixed_batches(
            [len(s) for s, _ in valid_pairs], [len(t) + 1 for _, t in valid_pairs], batch, batches_of(valid_pairs)
        )
    info = {"task": "translation", "fields": config.data.fields().to_dict()}
    return TaskData(model_config, "forward", pad, train, valid, tokenizer=tokenizer, info=info)


def translation_batch(batch: TranslationBatch) -> Batch:
    """A collated translation batch as the trainer's `Batch` (targets: tgt_out, pad not scored)."""
    inputs = (batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    return Batch(inputs, batch.tgt_out, batch.n_tgt_tokens, int(batch.src_mask.sum()) + batch.n_tgt_tokens)


def _encode_pairs(tokenizer: Tokenizer, sources: Sequence[str], targets: Sequence[str]) -> list[Pair]:
    return list(zip(tokenizer.encode_batch(sources), tokenizer.encode_batch(targets), strict=True))


# -- language modelling -----------------------------------------------------------------------


def lm_task(config: RunConfig, model_config: ModelConfig, ctx: TaskContext) -> TaskData:
    """Next-token prediction over the files of data.train, tokenized once into a token cache in RUN_DIR/data and
    read through a memory map; over the assistant's turns of conversations with `data.format = "chat"`."""
    if config.data.format == "chat":
        return chat_task(config, model_config, ctx)
    files = corpus_files(config.data.train, "data.train")
    valid_files = corpus_files(config.data.valid, "data.valid") if config.data.valid else None
    bar = _progress_bars(config, ctx)
    chunks = text_chunks(files, config.tokenizer.kind == "chars", progress=bar("training the tokenizer"))
    tokenizer = ctx.tokenizer or make_tokenizer(config.tokenizer, chunks)
    model_config = model_config.replace(vocab_size=tokenizer.vocab_size)
    block = config.batch.block_size
    if block > model_config.max_positions:
        limit = model_config.max_positions
        raise ConfigError("batch.block_size", f"is {block}, more than the model's max_positions={limit}; lower it")
    cache = Path(config.run_dir) / TOKEN_CACHE_FOLDER
    ids = token_ids(files, tokenizer, cache / "train", progress=bar("tokenizing data.train"))
    train = WindowBatches(LMStream(ids, block, seed=config.train.seed), config.batch.batch_size, ctx.rank, ctx.world_size)
    valid = None
    if valid_files:
        held_out = LMStream(token_ids(valid_files, tokenizer, cache / "valid", bar("tokenizing data.valid")), block)
        valid = lambda: (lm_batch(x, y) for x, y in held_out.eval_blocks(config.batch.eval_batch_size))
    return TaskData(model_config, "forward", None, train, valid, tokenizer=tokenizer, info={"task": "lm"},
                    chat_template=ctx.chat_template)


def chat_task(config: RunConfig, model_config: ModelConfig, ctx: TaskContext) -> TaskData:
    """Next-token prediction of the assistant's turns of conversations (`attn.data.chat_data`), written by the chat
    template of the model fine-tuned or resumed, in batches of similar length under `batch.max_tokens` and
    `batch.max_sentences`. A conversation longer than `length_limit` is dropped, with a warning that counts them.

    Raises:
        ConfigError: no chat template or tokenizer comes with the model (`model.init_from`).
        DataFormatError: a malformed conversation (its line), or a template that cannot mark the assistant's turns.
    """
    if ctx.chat_template is None or ctx.tokenizer is None:
        raise ConfigError("data.format", "chat needs the chat template and tokenizer of the model it fine-tunes; "
                                         "set model.init_from (--init) to a chat model, e.g. SmolLM2-135M-Instruct")
    tokenizer = ctx.tokenizer
    token = tokenizer.id_to_token
    template = ChatTemplate(ctx.chat_template, {
        "bos_token": None if tokenizer.bos_id is None else token(tokenizer.bos_id),
        "eos_token": None if tokenizer.eos_id is None else token(tokenizer.eos_id)})
    model_config = model_config.replace(vocab_size=tokenizer.vocab_size)
    limit = length_limit(config, model_config)

    def examples(path: str, key: str) -> list[ChatExample]:
        kept, dropped = drop_long(encode_conversations(path, read_conversations(path), template, tokenizer), limit)
        if dropped:
            warnings.warn(f"{key}: {dropped} conversations longer than {limit} tokens were dropped; raise "
                          "data.max_length (at most the model's max_positions) or shorten them", stacklevel=2)
        if not kept:
            raise ConfigError(key, f"no conversation of {path} fits in {limit} tokens; raise data.max_length")
        return kept

    train = examples(_required(config.data.train, "data.train"), "data.train")
    valid = examples(_required(config.data.valid, "data.valid"), "data.valid") if config.data.valid else []
    ignore = unscored_id(tokenizer.vocab_size, train, valid)

    def batches_of(split: Sequence[ChatExample]) -> Callable[..., Batch]:
        def make(indices: Sequence[int], epoch: int = 0) -> Batch:
            x, y = collate_chat([split[i] for i in indices], ignore)
            return Batch((x,), y, int((y != ignore).sum()), sum(len(split[i].ids) - 1 for i in indices))

        return make

    lengths = [len(example.ids) - 1 for example in train]
    batch = config.batch
    sampler = TokenBudgetSampler(lengths, [0] * len(train), batch.max_tokens, batch.max_sentences,
                                 seed=config.train.seed)
    source = IndexedBatches(sampler, batches_of(train), ctx.rank, ctx.world_size)
    held_out = (_fixed_batches([len(e.ids) - 1 for e in valid], [0] * len(valid), batch, batches_of(valid))
                if valid else None)
    return TaskData(model_config, "forward", ignore, source, held_out, tokenizer=tokenizer,
                    info={"task": "lm"}, chat_template=ctx.chat_template)


def _progress_bars(config: RunConfig, ctx: TaskContext) -> Callable[[str], str]:
    """A progress bar's description, or "" (no bar) except on rank 0 of a run that is not quiet."""
    shown = not config.train.quiet and ctx.rank == 0
    return lambda what: what if shown else ""


# -- classification ---------------------------------------------------------------------------


def classification_task(config: RunConfig, model_config: ModelConfig, ctx: TaskContext) -> TaskData:
    """One label per text (or per text pair), from the encoder's first-token summary.

    With `data.text_pair_field` set, each example is `[CLS] text [SEP] pair [SEP]` with BERT's
    segment ids (0 up to the first [SEP], 1 after it), which `classify` adds as segment embeddings.

    Raises:
        DataFormatError: a malformed training file, or one whose rows all have the same label.
        ConfigError: sentence pairs for a model without segment embeddings.
    """
    fields = config.data.fields()
    corpus = load_labelled(_required(config.data.train, "data.train"), fields)
    if len(corpus.label_names) < 2:
        only = corpus.label_names[0]
        raise DataFormatError(corpus.path, f"every row has the label {only!r}; a classifier needs at least two classes")
    if fields.text_pair_field and model_config.type_vocab_size < 2:
        raise ConfigError("model.type_vocab_size", f"is {model_config.type_vocab_size}, but sentence pairs "
                          "(data.text_pair_field) need two segment embeddings; set it to 2 or use a bert preset")
    tokenizer = ctx.tokenizer or make_tokenizer(config.tokenizer, corpus.texts + (corpus.pairs or []))
    (pad,) = special_ids(tokenizer, "pad", source=config.tokenizer.path)
    model_config = model_config.replace(vocab_size=tokenizer.vocab_size, num_labels=len(corpus.label_names))
    limit = length_limit(config, model_config)

    def batches_of(split: LabelledCorpus) -> TextBatches:
        ids, segments = classifier_inputs(tokenizer, split.texts, split.pairs, limit)

        def make(indices: Sequence[int], epoch: int = 0) -> Batch:
            labels = [split.labels[i] for i in indices]
            tokens, mask, targets = collate_classification([ids[i] for i in indices], labels, pad)
            inputs: tuple[Tensor, ...] = (tokens, mask)
            if segments is not None:  # padding positions are masked, so their segment id does not matter
                inputs += (pad_batch([segments[i] for i in indices], 0)[0],)
            return Batch(inputs, targets, len(indices), int(mask.sum()))

        return ids, make

    held_out = (load_labelled(_required(config.data.valid, "data.valid"), fields, corpus.label_names)
                if config.data.valid else None)
    train, valid = _text_batches(config, ctx, limit, batches_of(corpus), batches_of(held_out) if held_out else None)
    info = {"task": "classification", "label_names": corpus.label_names, "fields": fields.to_dict()}
    return TaskData(model_config, "classify", None, train, valid, tokenizer=tokenizer, info=info)


# -- masked language modelling ----------------------------------------------------------------


@dataclass(frozen=True)
class Masker:
    """BERT's masking: each ordinary token is predicted with probability p; of those, 80% are
    replaced by the mask token, 10% by a random token and 10% kept. At least one token per
    text is predicted. Draws come from (seed, key), so a text's masks are reproducible.
    """

    probability: float
    mask_id: int
    pad_id: int
    specials: tuple[int, ...]
    vocab_size: int
    seed: int

    def __call__(self, ids: Sequence[int], key: tuple[int, ...]) -> tuple[list[int], list[int]]:
        """ids (L,) -> (inputs (L,), targets (L,) with pad_id where nothing is predicted)."""
        rng = np.random.default_rng((self.seed, *key))
        tokens = np.asarray(ids, dtype=np.int64)
        ordinary = ~np.isin(tokens, self.specials)
        chosen = ordinary & (rng.random(len(tokens)) < self.probability)
        if ordinary.any() and not chosen.any():
            chosen[rng.choice(np.flatnonzero(ordinary))] = True
        roll = rng.random(len(tokens))
        inputs = np.where(chosen & (roll < 0.8), self.mask_id, tokens)
        swapped = chosen & (roll >= 0.8) & (roll < 0.9)
        inputs[swapped] = rng.integers(max(self.specials) + 1, self.vocab_size, int(swapped.sum()))
        return inputs.tolist(), np.where(chosen, tokens, self.pad_id).tolist()


_TRAIN_STREAM, _VALID_STREAM = 0, 1


def mlm_task(config: RunConfig, model_config: ModelConfig, ctx: TaskContext) -> TaskData:
    """Masked-token prediction over texts (one per line, or the text column of a labelled TSV).

    Training texts get fresh masks every epoch; validation texts always the same ones.
    """
    texts = _texts(_required(config.data.train, "data.train"), config.data.fields())
    tokenizer = ctx.tokenizer or make_tokenizer(config.tokenizer, texts)
    pad, mask_id = special_ids(tokenizer, "pad", "mask", source=config.tokenizer.path)
    model_config = model_config.replace(vocab_size=tokenizer.vocab_size)
    limit = length_limit(config, model_config)
    roles = ("pad", "unk", "bos", "eos", "cls", "sep", "mask")
    specials = tuple(i for i in (getattr(tokenizer, f"{role}_id") for role in roles) if i is not None)
    masker = Masker(config.data.mask_probability, mask_id, pad, specials, tokenizer.vocab_size, config.train.seed)

    def batches_of(lines: Sequence[str], stream: int) -> TextBatches:
        ids = [seq[:limit] for seq in tokenizer.encode_batch(lines, add_special=True)]

        def make(indices: Sequence[int], epoch: int = 0) -> Batch:
            masked = [masker(ids[i], (stream, epoch, i)) for i in indices]
            tokens, mask = pad_batch([m[0] for m in masked], pad)
            targets, _ = pad_batch([m[1] for m in masked], pad)
            return Batch((tokens, mask), targets, int((targets != pad).sum()), int(mask.sum()))

        return ids, make

    held_out = (batches_of(_texts(_required(config.data.valid, "data.valid"), config.data.fields()), _VALID_STREAM)
                if config.data.valid else None)
    train, valid = _text_batches(config, ctx, limit, batches_of(texts, _TRAIN_STREAM), held_out)
    return TaskData(model_config, "mlm_logits", pad, train, valid, tokenizer=tokenizer, info={"task": "mlm"})


def _texts(path: str, fields: Fields) -> list[str]:
    """The `text_field` of a table (TSV, CSV, JSON Lines), or the non-blank lines of a text file."""
    if resolve_format(path, fields.format) != "text":
        return read_table(path, {"text_field": fields.text_field}, fields).values["text_field"]
    return [line for line in read_text(path).splitlines() if line.strip()]


# -- shared helpers ---------------------------------------------------------------------------


def make_tokenizer(config: TokenizerConfig, texts: Iterable[str]) -> Tokenizer:
    """Loads `config.path`, or trains a tokenizer of `config.kind` on `texts` (read once, lazily)."""
    if config.path:
        return Tokenizer.load(config.path)
    return Tokenizer.train(config.kind, texts, config.vocab_size, config.lowercase)


def special_ids(tokenizer: Tokenizer, *roles: str, source: str = "") -> tuple[int, ...]:
    """The ids of special-token roles ("pad", "bos", ...), which the task cannot do without; `source` (where the
    tokenizer came from, `tokenizer.path`) is for the message.

    Raises:
        ConfigError: the tokenizer has no token for some of the roles; names them all.
    """
    ids = {role: getattr(tokenizer, f"{role}_id") for role in roles}
    missing = [role for role, token_id in ids.items() if token_id is None]
    if missing:
        names = "; ".join(f"{role}: {' or '.join(ROLE_TOKENS[role])}" for role in missing)
        raise ConfigError(
            "tokenizer.path", f"{source or 'the tokenizer'} has no {', '.join(missing)} token, which this task needs "
            f"(it needs {', '.join(roles)}); add them to its special tokens under these names ({names}), or train "
            "one with attn tokenizer train"
        )
    return tuple(ids.values())


def length_limit(config: RunConfig, model_config: ModelConfig) -> int:
    """The longest example in tokens: data.max_length, capped by the model's max_positions."""
    return min(config.data.max_length or model_config.max_positions, model_config.max_positions)


def _required(path: str | tuple[str, ...], key: str) -> str:
    """The one file of a task that reads one (every task but the language model)."""
    if isinstance(path, tuple):
        raise ConfigError(key, f"a list of files is read by the lm task only; this task reads one file, so give "
                               f"one path instead of {list(path)!r}")
    if not path:
        raise ConfigError(key, "is not set; give the path of the file, e.g. in the TOML or as an override")
    return path


def _text_batches(
    config: RunConfig, ctx: TaskContext, limit: int, train: TextBatches, valid: TextBatches | None
) -> tuple[BatchSource, Callable[[], list[Batch]] | None]:
    """Training batches of `batch_size` texts grouped by length, and fixed validation batches."""
    ids, make = train
    size = config.batch.batch_size
    # The token budget never binds: batch_size texts of at most `limit` tokens.
    sampler = TokenBudgetSampler([len(x) for x in ids], [0] * len(ids), size * limit, size, seed=config.train.seed)
    source = IndexedBatches(sampler, make, ctx.rank, ctx.world_size)
    if valid is None:
        return source, None
    valid_ids, valid_make = valid
    return source, _fixed_batches([len(x) for x in valid_ids], [0] * len(valid_ids), config.batch, valid_make)


def _fixed_batches(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], batch: BatchConfig, make: Callable[..., Batch]
) -> Callable[[], list[Batch]]:
    """Validation batches in length order, collated once on first use."""
    if not src_lengths:
        raise ConfigError("data.valid", "the validation file has no usable examples")
    sampler = TokenBudgetSampler(src_lengths, tgt_lengths, batch.max_tokens, batch.eval_batch_size, shuffle=False)
    return functools.cache(lambda: [make(indices) for indices in sampler.epoch_batches(0)])
