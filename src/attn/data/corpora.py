"""Reading text files and turning token ids into batches.

Files: UTF-8 text, optionally gzipped (`.gz`); a UTF-8 byte-order mark at the start is dropped,
and a defect (invalid UTF-8, a binary file, broken gzip) is a `DataFormatError` that names the
file, the 1-based line and the fix. `attn.data.readers` reads examples out of such files (TSV,
CSV, JSON Lines, line-aligned text files).

Batching:
- language modelling: `LMStream` cuts one long id stream into (input, next-token) windows;
- translation: `TokenBudgetSampler` groups examples of similar length into batches under a
  token budget, `collate_translation` pads them and builds the masks;
- classification: `collate_classification`, and `frame_pairs` for sentence pairs;
- `BatchLoader` collates in DataLoader worker processes while the sampler alone decides the
  order, so any number of workers gives the same batches.

Masks are boolean with True = real token, built once here from the sequence lengths.
"""

from __future__ import annotations

import codecs
import functools
import gzip
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from attn.data.tokenizers import Tokenizer
from attn.errors import CheckpointError, ConfigError, DataFormatError, ShapeError
from attn.shipped import locate

MAX_LINE_CHARS = 100_000

Pair = tuple[list[int], list[int]]
_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _check_at_least(name: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(name, f"is {value}, must be at least {minimum}")


# -- reading files ----------------------------------------------------------------------------


def read_text(path: str | Path) -> str:
    """Read a whole UTF-8 text file, gunzipping it when its name ends in `.gz`.

    Args:
        path: the file; a `data/...` path that the working directory lacks names the shipped
            corpus file (`attn.shipped.locate`).

    Returns:
        The text, line ends unchanged, without a leading byte-order mark.

    Raises:
        DataFormatError: the file is missing, not valid gzip, not valid UTF-8 or binary.
    """
    found = locate(path)
    return decode_text(_read_bytes(found), str(found))


def iter_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 text file, gunzipped when its name ends in `.gz`, read one at a time.

    Args:
        path: the file (a `data/...` path as in `read_text`).

    Yields:
        Each line with its line end as `\n` (a `\r` before it dropped), without a leading byte-order mark.

    Raises:
        DataFormatError: the file is missing, not valid gzip, or a line is not valid UTF-8 or binary;
            names the line.
    """
    found = locate(path)
    try:
        with gzip.open(found) if found.suffix == ".gz" else open(found, "rb") as file:
            for number, raw in enumerate(file, 1):
                text = decode_text(raw, str(found), number)
                yield text.removesuffix("\r\n") + "\n" if text.endswith("\r\n") else text
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise not_gzip(found, err) from err
    except OSError as err:
        raise unreadable(found, err) from err


def decode_text(data: bytes, source: str, line: int = 1) -> str:
    """UTF-8 bytes -> text, without a leading byte-order mark.

    Args:
        data: the bytes, e.g. of a file or of standard input, or whole lines of a file read piece
            by piece.
        source: what they came from, for the message (a path, or "<stdin>").
        line: the 1-based line `data` starts on, for the message; a byte-order mark is dropped only
            at line 1 (a file's start).

    Raises:
        DataFormatError: the bytes are binary (hold a NUL byte) or not valid UTF-8; names the line.
    """
    if line == 1:
        data = data.removeprefix(codecs.BOM_UTF8)
    # Text never holds a NUL byte; checked first, so that a binary file is called binary rather
    # than "invalid UTF-8".
    nul = data.find(b"\x00")
    if nul >= 0:
        message = ("contains a NUL byte, so it is binary (or UTF-16) rather than text; give a UTF-8 text file, "
                   "or re-save the file as UTF-8")
        raise DataFormatError(source, message, data.count(b"\n", 0, nul) + line)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        where = data.count(b"\n", 0, err.start) + line
        raise DataFormatError(
            source, f"invalid UTF-8 (byte 0x{data[err.start]:02x}); re-save the file as UTF-8", where
        ) from err


GZIP_ERRORS = (OSError, EOFError, zlib.error)  # what gunzipping a broken file raises


def unreadable(path: Path, err: OSError) -> DataFormatError:
    """The error for a file that cannot be opened or read."""
    return DataFormatError(str(path), f"cannot be read ({err.strerror}); check the path")


def not_gzip(path: Path, err: Exception) -> DataFormatError:
    """The error for a `.gz` file that does not gunzip (one of `GZIP_ERRORS`)."""
    return DataFormatError(
        str(path), f"is not a valid gzip file ({err}); compress it again with gzip or drop the .gz suffix"
    )


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise unreadable(path, err) from err
    if path.suffix != ".gz":
        return data
    try:
        return gzip.decompress(data)
    except GZIP_ERRORS as err:
        raise not_gzip(path, err) from err


# -- language modelling -----------------------------------------------------------------------


class LMStream:
    """One long token stream cut into (input, next-token target) windows of `block_size`.

    The stream is held as it is given, in its own integer type: a tensor, or a NumPy array such
    as the read-only memory map of a token cache (`attn.data.token_cache`), so a stream larger
    than memory works too. Only the windows drawn are read, and only they are widened to int64.
    """

    def __init__(self, ids: torch.Tensor | np.ndarray, block_size: int, seed: int = 0) -> None:
        """Hold a stream.

        Args:
            ids: the token stream, shape (N,), integer dtype (a tensor or a NumPy array / memmap).
            block_size: window length T (the model's context).
            seed: seed of the generator that draws training windows.
        """
        self.ids = _id_array(ids)
        _check_at_least("block_size", block_size, 1)
        if len(self.ids) < 2:
            raise ConfigError("ids", f"the stream has {len(self.ids)} tokens; give at least 2 to predict one")
        self.block_size = block_size
        self._generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.ids)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw training windows at random starts: x = ids[i:i+T], y = ids[i+1:i+T+1].

        Args:
            batch_size: number of windows B.

        Returns:
            (x, y), each of shape (B, T), int64.
        """
        _check_at_least("batch_size", batch_size, 1)
        n, t = len(self.ids), self.block_size
        if n < t + 1:
            raise ConfigError("block_size", f"is {t}, but the stream has only {n} tokens; lower it below {n}")
        starts = torch.randint(n - t, (batch_size,), generator=self._generator)
        offsets = starts.numpy()[:, None] + np.arange(t)  # (B, T)
        return _long(self.ids[offsets]), _long(self.ids[offsets + 1])

    def eval_blocks(self, batch_size: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Non-overlapping windows covering the stream: every token after the first is a target once.

        Full windows come in batches of up to `batch_size`; the remainder, if any, comes last
        as one shorter window.

        Args:
            batch_size: full windows per batch.

        Yields:
            (x, y), each of shape (b, T), or (1, r) for the last partial window; int64.
        """
        _check_at_least("batch_size", batch_size, 1)
        n_targets = len(self.ids) - 1
        t = self.block_size
        full = n_targets // t
        for first in range(0, full, batch_size):
            rows = min(batch_size, full - first)
            begin, end = first * t, (first + rows) * t
            yield _long(self.ids[begin:end]).view(rows, t), _long(self.ids[begin + 1 : end + 1]).view(rows, t)
        if full * t < n_targets:
            yield _long(self.ids[full * t : -1]).unsqueeze(0), _long(self.ids[full * t + 1 :]).unsqueeze(0)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The generator's state, to resume the same sequence of training windows."""
        return {"generator": self._generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a state from `state_dict`."""
        self._generator.set_state(state["generator"])


def _id_array(ids: torch.Tensor | np.ndarray) -> np.ndarray:
    """`ids` as a 1-D NumPy integer array that shares its memory."""
    array = ids.numpy() if isinstance(ids, torch.Tensor) and ids.dtype in _INT_DTYPES else ids
    if not isinstance(array, np.ndarray) or array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        shape, dtype = tuple(getattr(ids, "shape", ())), getattr(ids, "dtype", type(ids).__name__)
        raise ShapeError(
            f"ids must be a 1-D integer tensor, got shape {shape} and {dtype}; "
            "pass torch.tensor(tokenizer.encode(text), dtype=torch.long) or a 1-D integer NumPy array"
        )
    return array


def _long(ids: np.ndarray) -> torch.Tensor:
    """A copy of some ids (a window, a batch of windows) as an int64 tensor."""
    return torch.from_numpy(np.array(ids, dtype=np.int64))


# -- translation ------------------------------------------------------------------------------


def budget_batches(order: Sequence[int], lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """`order` cut greedily into batches whose padded size (rows x longest) stays within `max_tokens`
    and whose rows stay within `max_rows`; a row longer than `max_tokens` forms a batch of its own.

    Example:
        >>> budget_batches([0, 1, 2, 3], [2, 3, 3, 9], max_rows=8, max_tokens=9)
        [[0, 1, 2], [3]]
    """
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in order:
        grown = max(longest, lengths[i])
        if batch and (len(batch) + 1 > max_rows or (len(batch) + 1) * grown > max_tokens):
            batches.append(batch)
            batch, grown = [], lengths[i]
        batch.append(i)
        longest = grown
    if batch:
        batches.append(batch)
    return batches


def length_batches(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Row indices in batches of similar length: sorted shortest first, then cut by `budget_batches`."""
    return budget_batches(sorted(range(len(lengths)), key=lengths.__getitem__), lengths, max_rows, max_tokens)


class TokenBudgetSampler:
    """Batches of example indices under a token budget, in a fresh order every epoch.

    Examples are sorted by length (the longer side, then source, then target) and cut greedily
    into batches whose padded size `n_sentences * longest` stays within `max_tokens` on both
    sides and whose size stays within `max_sentences`. The batches are formed once; each epoch
    visits all of them in an order drawn from (seed, epoch). An example longer than `max_tokens`
    on its own still forms a batch of one, so nothing is lost silently: run `filter_long` first
    to bound lengths.

    Iterating yields the remaining batches of the current epoch and advances the position;
    `state_dict` records (epoch, position) so that training resumes mid-epoch exactly.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        max_sentences: int,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        """Form the batches.

        Args:
            src_lengths: token count of each example's source, as padded in the batch.
            tgt_lengths: token count of each example's target as padded in the batch: with
                `collate_translation`, the target's length + 1 (bos or eos).
            max_tokens: budget per side for `n_sentences * longest` (the paper: ~25,000).
            max_sentences: most examples per batch.
            seed: seeds the order of batches and of equal-length examples.
            shuffle: False keeps the batches in length order every epoch (for evaluation).
        """
        if len(src_lengths) != len(tgt_lengths):
            counts = f"has {len(tgt_lengths)} entries, src_lengths {len(src_lengths)}"
            raise ConfigError("tgt_lengths", f"{counts}; give one length per example on both sides")
        _check_at_least("max_tokens", max_tokens, 1)
        _check_at_least("max_sentences", max_sentences, 1)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._batches = self._form_batches(src_lengths, tgt_lengths, max_tokens, max_sentences)

    def _form_batches(
        self, src: Sequence[int], tgt: Sequence[int], max_tokens: int, max_sentences: int
    ) -> list[list[int]]:
        # Equal-length examples are ordered at random so batches do not follow the corpus order.
        tie = np.random.default_rng(self.seed).permutation(len(src)) if self.shuffle else range(len(src))
        order = sorted(range(len(src)), key=lambda i: (max(src[i], tgt[i]), src[i], tgt[i], tie[i]))
        return budget_batches(order, [max(pair) for pair in zip(src, tgt, strict=True)], max_sentences, max_tokens)

    def __len__(self) -> int:
        return len(self._batches)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All batches of one epoch, in that epoch's order.

        Args:
            epoch: the epoch number (0-based).

        Returns:
            Lists of example indices; together they hold every example once.
        """
        if not self.shuffle:
            return list(self._batches)
        order = np.random.default_rng((self.seed, epoch)).permutation(len(self._batches))
        return [self._batches[i] for i in order]

    def remaining(self) -> list[list[int]]:
        """The batches of the current epoch not yet delivered."""
        return self.epoch_batches(self.epoch)[self.position :]

    def advance(self) -> None:
        """Record one batch as delivered; after the last one, move to the next epoch."""
        self.position += 1
        if self.position >= len(self._batches):
            self.epoch, self.position = self.epoch + 1, 0

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.remaining():
            self.advance()
            yield batch

    def state_dict(self) -> dict[str, int]:
        """The epoch and the number of its batches already delivered."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from a `state_dict` taken with the same lengths and settings.

        Raises:
            CheckpointError: the state does not fit this sampler.
        """
        epoch, position = state.get("epoch"), state.get("position")
        if not isinstance(epoch, int) or not isinstance(position, int) or epoch < 0:
            raise CheckpointError(
                f"sampler state {state!r} needs non-negative integers 'epoch' and 'position'; "
                "pass what state_dict returned"
            )
        if not 0 <= position < max(len(self._batches), 1):
            raise CheckpointError(
                f"sampler state position {position} is outside the {len(self._batches)} batches of "
                "an epoch; resume with the same data and batching settings"
            )
        self.epoch, self.position = epoch, position


@dataclass
class TranslationBatch:
    """A padded batch of translation pairs.

    Attributes:
        src: source ids, shape (B, S).
        src_mask: True at real source tokens, shape (B, S).
        tgt_in: decoder input, bos + target, shape (B, T).
        tgt_out: decoder target, target + eos (tgt_in shifted left by one), shape (B, T).
        tgt_mask: True at real target positions of tgt_in and tgt_out, shape (B, T).
        n_tgt_tokens: number of real target positions (the loss's normaliser).
    """

    src: torch.Tensor
    src_mask: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_mask: torch.Tensor
    n_tgt_tokens: int

    def to(self, device: torch.device | str) -> TranslationBatch:
        """The same batch on `device`."""
        return TranslationBatch(
            *(t.to(device) for t in (self.src, self.src_mask, self.tgt_in, self.tgt_out, self.tgt_mask)),
            n_tgt_tokens=self.n_tgt_tokens,
        )


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pads id lists into (B, L) long ids and a (B, L) bool mask, True at real tokens."""
    rows = [torch.tensor(seq, dtype=torch.long) for seq in seqs]
    tokens = pad_sequence(rows, batch_first=True, padding_value=pad_id)  # (B, L)
    lengths = torch.tensor([len(seq) for seq in seqs])
    return tokens, torch.arange(tokens.shape[1]) < lengths[:, None]


def collate_translation(pairs: Sequence[Pair], pad_id: int, bos_id: int, eos_id: int) -> TranslationBatch:
    """Pad translation pairs into a batch for teacher forcing.

    Args:
        pairs: (source ids, target ids) per example; neither holds bos or eos yet.
        pad_id: padding id.
        bos_id: id put before each target in `tgt_in`.
        eos_id: id put after each target in `tgt_out`.

    Returns:
        The batch; S is the longest source, T the longest target + 1.
    """
    src, src_mask = pad_batch([s for s, _ in pairs], pad_id)
    tgt_in, tgt_mask = pad_batch([[bos_id, *t] for _, t in pairs], pad_id)
    tgt_out, _ = pad_batch([[*t, eos_id] for _, t in pairs], pad_id)
    return TranslationBatch(src, src_mask, tgt_in, tgt_out, tgt_mask, int(tgt_mask.sum()))


def filter_long(
    examples: Sequence[Pair], max_positions: int, mode: Literal["truncate", "drop"]
) -> tuple[list[Pair], int]:
    """Bound pair lengths to what a model with `max_positions` positions takes.

    A source may have `max_positions` tokens; a target `max_positions - 1`, because
    `collate_translation` adds bos or eos to it.

    Args:
        examples: (source ids, target ids) pairs.
        max_positions: the model's longest sequence.
        mode: "truncate" keeps the first tokens of a long side; "drop" removes the pair.

    Returns:
        (kept pairs in order, number of pairs truncated or dropped).
    """
    _check_at_least("max_positions", max_positions, 2)
    if mode not in ("truncate", "drop"):
        raise ConfigError("mode", f"is {mode!r}; use 'truncate' or 'drop'")
    max_src, max_tgt = max_positions, max_positions - 1
    kept: list[Pair] = []
    affected = 0
    for src, tgt in examples:
        if len(src) <= max_src and len(tgt) <= max_tgt:
            kept.append((src, tgt))
            continue
        affected += 1
        if mode == "truncate":
            kept.append((src[:max_src], tgt[:max_tgt]))
    return kept, affected


# -- classification and loaders ---------------------------------------------------------------


def collate_classification(
    ids_list: Sequence[Sequence[int]], labels: Sequence[int], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pad encoded texts into a classification batch.

    Args:
        ids_list: token ids per text (with [CLS]/[SEP] if the model wants them).
        labels: class index per text.
        pad_id: padding id.

    Returns:
        (tokens (B, L), mask (B, L) True at real tokens, labels (B,) long).
    """
    tokens, mask = pad_batch(ids_list, pad_id)
    return tokens, mask, torch.tensor(list(labels), dtype=torch.long)


def frame_pairs(
    firsts: Sequence[Sequence[int]], seconds: Sequence[Sequence[int]], cls_id: int, sep_id: int, max_length: int
) -> tuple[list[list[int]], list[list[int]]]:
    """BERT's sentence-pair inputs: `[CLS] a [SEP] b [SEP]` with segment ids 0 up to the first
    `[SEP]` and 1 after it (Devlin et al., section 3, figure 2).

    A pair longer than `max_length` loses tokens from the end of its longer text first, as Hugging
    Face's "longest_first" truncation does, so that both texts keep their beginnings.

    Args:
        firsts: token ids of the first texts, without special tokens.
        seconds: token ids of the second texts, as many.
        cls_id: the [CLS] id.
        sep_id: the [SEP] id.
        max_length: most tokens of a framed pair (at least 5: three specials and a token of each text).

    Returns:
        (ids, segments): one list per pair, each of the same length.
    """
    _check_at_least("max_length", max_length, 5)
    ids: list[list[int]] = []
    segments: list[list[int]] = []
    for first, second in zip(firsts, seconds, strict=True):
        keep_first, keep_second = _longest_first(len(first), len(second), max_length - 3)
        ids.append([cls_id, *first[:keep_first], sep_id, *second[:keep_second], sep_id])
        segments.append([0] * (keep_first + 2) + [1] * (keep_second + 1))
    return ids, segments


def classifier_inputs(
    tokenizer: Tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int
) -> tuple[list[list[int]], list[list[int]] | None]:
    """Token ids of an encoder classifier's inputs, for training and inference alike.

    Args:
        tokenizer: the model's tokenizer.
        texts: the texts (the first of each pair).
        pairs: the second texts, or None for single texts.
        max_length: most tokens of an input (the model's max_positions, or less).

    Returns:
        (ids, segments): single texts in the tokenizer's frame (`[CLS] … [SEP]`) cut to `max_length`,
        and segments None; or `frame_pairs` of the pairs.

    Raises:
        ConfigError: pairs with a tokenizer that has no [CLS] or [SEP] token.
    """
    if pairs is None:
        return [seq[:max_length] for seq in tokenizer.encode_batch(texts, add_special=True)], None
    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        raise ConfigError("tokenizer", "has no [CLS] or [SEP] token, which sentence pairs need; train a tokenizer "
                                       "(every trained kind has both) or use a BERT-style one")
    firsts, seconds = tokenizer.encode_batch(texts), tokenizer.encode_batch(pairs)
    return frame_pairs(firsts, seconds, tokenizer.cls_id, tokenizer.sep_id, max_length)


def _longest_first(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many tokens of each text fit `budget`: the shorter text keeps up to half (rounded down),
    the longer one the rest; on a tie the second text counts as the longer."""
    if first + second <= budget:
        return first, second
    if first > second:
        kept = min(second, budget // 2)
        return budget - kept, kept
    kept = min(first, budget // 2)
    return kept, budget - kept


class BatchLoader:
    """Collated batches in the order of a `TokenBudgetSampler`, collated by worker processes."""

    def __init__(
        self,
        dataset: Sequence[Any],
        sampler: TokenBudgetSampler,
        collate: Callable[[list[Any]], Any],
        num_workers: int = 0,
    ) -> None:
        """Pair a dataset with a sampler.

        Args:
            dataset: examples addressed by the sampler's indices.
            sampler: decides batches and order; advanced as batches are delivered.
            collate: turns a list of examples into a batch (picklable when num_workers > 0).
            num_workers: collating processes; 0 collates in this process.
        """
        self.dataset = dataset
        self.sampler = sampler
        self.collate = collate
        self.num_workers = num_workers

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        # The sampler advances only when a batch reaches the caller, not when workers
        # prefetch it, so its state_dict stays exact for resuming.
        loader = DataLoader(
            self.dataset,  # type: ignore[arg-type]
            batch_sampler=self.sampler.remaining(),
            collate_fn=self.collate,
            num_workers=self.num_workers,
        )
        for batch in loader:
            self.sampler.advance()
            yield batch


def translation_collate(
    pad_id: int, bos_id: int, eos_id: int
) -> Callable[[Sequence[Pair]], TranslationBatch]:
    """A picklable `collate_translation` with fixed ids, for `BatchLoader` workers."""
    return functools.partial(collate_translation, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
