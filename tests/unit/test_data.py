"""Tests of the data layer's reading and batching: the shipped corpora, malformed files (`text`,
`readers`), LM windows (`lm_stream`), token-budget batching (`samplers`), collation (`collate`) and
sentence-pair framing (`framing`)."""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, processors

from attn.data.collate import collate_classification, collate_translation, filter_long
from attn.data.framing import frame_pairs
from attn.data.lm_stream import LMStream
from attn.data.readers import Fields, load_labelled, load_parallel, read_table
from attn.data.samplers import TokenBudgetSampler
from attn.data.text import read_text
from attn.core.errors import CheckpointError, ConfigError, DataFormatError, ShapeError

DATA = Path(__file__).resolve().parents[2] / "data"
PAD, BOS, EOS = 0, 2, 3


# -- the shipped corpora ------------------------------------------------------------------------


def test_bible_splits_have_the_documented_rows() -> None:
    stats = json.loads((DATA / "bible-en-es" / "stats.json").read_text(encoding="utf-8"))
    for split, name in (("train", "train.tsv.gz"), ("valid", "valid.tsv"), ("test", "test.tsv")):
        corpus = load_parallel(DATA / "bible-en-es" / name)
        assert len(corpus) == len(corpus.sources) == len(corpus.targets) == stats["counts"][split]
        assert corpus.skipped_blank == 0
    valid = load_parallel(DATA / "bible-en-es" / "valid.tsv")
    john = read_table(DATA / "bible-en-es" / "valid.tsv", {"ref": "ref"}).values["ref"].index("John 3:16")
    assert valid.sources[john].startswith("For God so loved the world, that he gave his only born Son")
    assert valid.targets[john].startswith("Porque de tal manera amó Dios al mundo")


def test_king_james_source_is_joined_by_ref() -> None:
    king_james = Fields(source_field="en_kjv", join="data/bible-en-es/kjv.tsv.gz", join_key="ref")
    valid = load_parallel(DATA / "bible-en-es" / "valid.tsv", king_james)
    john = read_table(DATA / "bible-en-es" / "valid.tsv", {"ref": "ref"}).values["ref"].index("John 3:16")
    assert valid.sources[john].startswith("For God so loved the world, that he gave his only begotten Son")
    assert valid.targets[john].startswith("Porque de tal manera amó Dios al mundo")
    assert len(valid) == 983


def test_shakespeare_texts_have_the_documented_sizes() -> None:
    stats = json.loads((DATA / "shakespeare" / "stats.json").read_text(encoding="utf-8"))
    for split, name in (("train", "train.txt.gz"), ("valid", "valid.txt"), ("test", "test.txt")):
        text = read_text(DATA / "shakespeare" / name)
        assert len(text) == stats[split]["chars"]
        assert text.count("\n") == stats[split]["lines"]


def test_fortunes_have_the_documented_label_counts() -> None:
    stats = json.loads((DATA / "fortunes-topics" / "stats.json").read_text(encoding="utf-8"))
    for split in ("train", "valid", "test"):
        corpus = load_labelled(DATA / "fortunes-topics" / f"{split}.tsv")
        assert corpus.label_names == stats["labels"]
        counts = {name: corpus.labels.count(i) for i, name in enumerate(corpus.label_names)}
        assert {**counts, "total": len(corpus)} == stats["counts"][split]


# -- malformed files ----------------------------------------------------------------------------


def _write_kjv(folder: Path) -> None:
    (folder / "kjv.tsv").write_bytes(b"ref\ten_kjv\nGen 1:1\tIn the beginning\n")


def _with_king_james(path: Path) -> Any:
    return load_parallel(path, Fields(source_field="en_kjv", join=str(path.with_name("kjv.tsv")), join_key="ref"))


MALFORMED: dict[str, tuple[bytes, Callable[[Path], Any], int | None, str]] = {
    "wrong-header": (b"ref\tsrc\ttgt\nGen 1:1\ta\tb\n", load_parallel, 1,
                     "no field 'en' (source_field); the fields here are: ref, src, tgt; set source_field to one"),
    "no-header": (b"Gen 1:1\ta\tb\n", load_parallel, 1,
                  "no field 'en' (source_field); the fields here are: Gen 1:1, a"),
    "empty-file": (b"", load_parallel, 1, "it must start with the header"),
    "header-only": (b"label\ttext\n", load_labelled, None, "add rows"),
    "missing-field": (b"ref\ten\tes\nGen 1:1\ta\tb\nGen 1:2\ta\n", load_parallel, 3, "fill in missing"),
    "stray-tab": (b"label\ttext\nart\tsome\ttext\n", load_labelled, 2, "replace stray tabs by spaces"),
    "empty-field": (b"label\ttext\nart\t  \n", load_labelled, 2, "fill it in or delete the line"),
    "invalid-utf8": (b"label\ttext\nart\tok\nart\tcaf\xe9\n", load_labelled, 3, "re-save the file as UTF-8"),
    "binary-garbage": (b"\x1f\x8b\x08\x00\xff\xfe\x00junk\n\x00", load_labelled, 1, "re-save the file as"),
    "nul-in-text": (b"label\ttext\nart\tab\x00cd\n", load_labelled, 2, "give a UTF-8 text file"),
    "long-line": (
        b"label\ttext\nart\tshort\nart\t" + b"x" * 60 + b"\n",
        functools.partial(load_labelled, max_line_chars=50),
        3,
        "raise max_line_chars",
    ),
    "unknown-label": (
        b"label\ttext\nart\ta\nfood\tb\n",
        functools.partial(load_labelled, labels=["art", "law"]),
        3,
        "known labels: art, law",
    ),
    "missing-kjv-ref": (
        b"ref\ten\tes\nGen 1:1\ta\tb\nGen 1:2\tc\td\n",
        _with_king_james,
        3,
        "ref='Gen 1:2' has no row in the join table",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_names_file_line_and_fix(tmp_path: Path, case: str) -> None:
    content, load, line, fix = MALFORMED[case]
    path = tmp_path / f"{case}.tsv"
    path.write_bytes(content)
    _write_kjv(tmp_path)
    with pytest.raises(DataFormatError) as caught:
        load(path)
    message = str(caught.value)
    assert f"{case}.tsv{'' if line is None else f':{line}'}: " in message
    assert fix in message
    assert caught.value.line == line


def test_duplicate_kjv_ref_is_reported(tmp_path: Path) -> None:
    (tmp_path / "pairs.tsv").write_bytes(b"ref\ten\tes\nGen 1:1\ta\tb\n")
    (tmp_path / "kjv.tsv").write_bytes(b"ref\ten_kjv\nGen 1:1\tx\nGen 1:1\ty\n")
    with pytest.raises(DataFormatError, match=r"kjv.tsv:3: key ref='Gen 1:1' occurs twice"):
        _with_king_james(tmp_path / "pairs.tsv")


def test_broken_gzip_and_missing_file_are_data_format_errors(tmp_path: Path) -> None:
    (tmp_path / "train.tsv.gz").write_bytes(b"label\ttext\nart\tnot compressed\n")
    with pytest.raises(DataFormatError, match=r"train.tsv.gz: is not a valid gzip file .*drop the .gz"):
        load_labelled(tmp_path / "train.tsv.gz")
    with pytest.raises(DataFormatError, match=r"absent.tsv: cannot be read .*check the path"):
        read_text(tmp_path / "absent.tsv")




def test_blank_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "blank.tsv"
    path.write_bytes(b"label\ttext\n\nart\ta\n   \nlaw\tb\n\n")
    corpus = load_labelled(path)
    assert (corpus.texts, corpus.labels, corpus.label_names) == (["a", "b"], [0, 1], ["art", "law"])
    assert corpus.skipped_blank == 3


def test_windows_line_ends_are_read(tmp_path: Path) -> None:
    path = tmp_path / "crlf.tsv"
    path.write_bytes(b"ref\ten\tes\r\nGen 1:1\ta b\tc d\r\n")
    corpus = load_parallel(path)
    assert (corpus.lines, corpus.sources, corpus.targets) == ([2], ["a b"], ["c d"])


def test_given_labels_fix_the_class_indices(tmp_path: Path) -> None:
    path = tmp_path / "eval.tsv"
    path.write_bytes(b"label\ttext\nlaw\ta\nart\tb\n")
    corpus = load_labelled(path, labels=["law", "art", "food"])
    assert corpus.pairs is None
    assert (corpus.labels, corpus.label_names) == ([0, 1], ["law", "art", "food"])


# -- language-model windows ---------------------------------------------------------------------


def test_training_windows_are_shifted_by_one_and_seeded() -> None:
    stream = LMStream(torch.arange(1000), block_size=64, seed=7)
    x, y = stream.sample(8)
    assert x.shape == y.shape == (8, 64)
    assert torch.equal(y, x + 1)
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)  # windows are contiguous slices
    assert int(x.min()) >= 0 and int(y.max()) <= 999
    again, _ = LMStream(torch.arange(1000), block_size=64, seed=7).sample(8)
    other, _ = LMStream(torch.arange(1000), block_size=64, seed=8).sample(8)
    assert torch.equal(x, again) and not torch.equal(x, other)


def test_training_windows_resume_from_state() -> None:
    stream = LMStream(torch.arange(500), block_size=16, seed=0)
    stream.sample(4)
    state = stream.state_dict()
    expected, _ = stream.sample(4)
    resumed = LMStream(torch.arange(500), block_size=16, seed=123)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.sample(4)[0], expected)


@pytest.mark.parametrize(("n", "block", "batch"), [(1000, 64, 4), (129, 64, 1), (130, 64, 3), (5, 64, 2)])
def test_eval_blocks_predict_every_token_once(n: int, block: int, batch: int) -> None:
    blocks = list(LMStream(torch.arange(n), block_size=block).eval_blocks(batch))
    targets = torch.cat([y.flatten() for _, y in blocks])
    assert torch.equal(targets, torch.arange(1, n))
    assert all(torch.equal(y, x + 1) and x.shape[0] <= batch for x, y in blocks)
    assert sum(x.shape[0] for x, _ in blocks) == -(-(n - 1) // block)


def test_lm_stream_rejects_bad_input() -> None:
    with pytest.raises(ShapeError, match=r"1-D integer tensor, got shape \(2, 3\)"):
        LMStream(torch.zeros(2, 3, dtype=torch.long), block_size=4)
    with pytest.raises(ShapeError, match="float32"):
        LMStream(torch.zeros(10), block_size=4)
    with pytest.raises(ConfigError, match="block_size: is 10, but the stream has only 10 tokens"):
        LMStream(torch.arange(10), block_size=10).sample(1)
    with pytest.raises(ConfigError, match="ids: the stream has 1 tokens"):
        LMStream(torch.arange(1), block_size=4)
    with pytest.raises(ConfigError, match="batch_size: is 0"):
        next(LMStream(torch.arange(10), block_size=4).eval_blocks(0))


# -- token-budget batching ----------------------------------------------------------------------


def _lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [rng.randint(1, 120) for _ in range(n)]
    return src, [max(1, s + rng.randint(-20, 20)) for s in src]


def _check_epoch(
    batches: list[list[int]], src: list[int], tgt: list[int], max_tokens: int, max_sentences: int
) -> None:
    assert sorted(i for batch in batches for i in batch) == list(range(len(src)))
    for batch in batches:
        assert 1 <= len(batch) <= max_sentences
        if len(batch) > 1:
            assert len(batch) * max(src[i] for i in batch) <= max_tokens
            assert len(batch) * max(tgt[i] for i in batch) <= max_tokens


def _draw(sampler: TokenBudgetSampler, count: int) -> list[list[int]]:
    """The next `count` batches the sampler delivers."""
    return [sampler.draw()[1] for _ in range(count)]


def test_sampler_covers_every_example_once_within_budget() -> None:
    src, tgt = _lengths(3000)
    sampler = TokenBudgetSampler(src, tgt, max_tokens=2000, max_sentences=64, seed=1)
    epochs = [_draw(sampler, len(sampler)), _draw(sampler, len(sampler))]
    for batches in epochs:
        _check_epoch(batches, src, tgt, 2000, 64)
    assert epochs[0] != epochs[1]
    assert sorted(map(sorted, epochs[0])) == sorted(map(sorted, epochs[1]))
    assert sampler.state_dict() == {"epoch": 2, "position": 0}
    # Sorting by length keeps padding low: well over 80% of each side's padded cells are real.
    real = sum(src)
    padded = sum(len(b) * max(src[i] for i in b) for b in epochs[0])
    assert real / padded > 0.8


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=200),
    max_tokens=st.integers(1, 2000),
    max_sentences=st.integers(1, 50),
)
def test_sampler_invariants_hold_for_any_lengths(
    lengths: list[tuple[int, int]], max_tokens: int, max_sentences: int
) -> None:
    src, tgt = [s for s, _ in lengths], [t for _, t in lengths]
    sampler = TokenBudgetSampler(src, tgt, max_tokens, max_sentences, seed=3)
    _check_epoch(sampler.epoch_batches(0), src, tgt, max_tokens, max_sentences)


def test_sampler_is_reproducible_from_seed_and_epoch() -> None:
    src, tgt = _lengths(1000)
    first = TokenBudgetSampler(src, tgt, 1500, 32, seed=5)
    second = TokenBudgetSampler(src, tgt, 1500, 32, seed=5)
    other_seed = TokenBudgetSampler(src, tgt, 1500, 32, seed=6)
    assert first.epoch_batches(3) == second.epoch_batches(3)
    assert first.epoch_batches(0) != first.epoch_batches(1)
    assert first.epoch_batches(0) != other_seed.epoch_batches(0)
    assert _draw(first, len(first)) == second.epoch_batches(0)


def test_sampler_without_shuffle_keeps_length_order() -> None:
    src, tgt = _lengths(500)
    sampler = TokenBudgetSampler(src, tgt, 1000, 16, shuffle=False)
    batches = sampler.epoch_batches(0)
    assert batches == sampler.epoch_batches(4)
    order = [i for batch in batches for i in batch]
    assert [(max(src[i], tgt[i]), src[i], tgt[i]) for i in order] == sorted(
        (max(s, t), s, t) for s, t in zip(src, tgt, strict=True)
    )


def test_oversized_example_forms_a_batch_of_one() -> None:
    sampler = TokenBudgetSampler([5, 5000, 5, 6], [5, 5, 5000, 6], 100, max_sentences=8, shuffle=False)
    assert sampler.epoch_batches(0) == [[0, 3], [2], [1]]


def test_sampler_resumes_mid_epoch_exactly() -> None:
    src, tgt = _lengths(800)
    sampler = TokenBudgetSampler(src, tgt, 1000, 32, seed=2)
    _draw(sampler, len(sampler) + 5)  # epoch 0 and five batches of epoch 1
    state = sampler.state_dict()
    assert state == {"epoch": 1, "position": 5}
    expected = _draw(sampler, 2 * len(sampler))
    resumed = TokenBudgetSampler(src, tgt, 1000, 32, seed=2)
    resumed.load_state_dict(state)
    assert _draw(resumed, 2 * len(sampler)) == expected
    assert expected[: len(sampler) - 5] == sampler.epoch_batches(1)[5:]


def test_sampler_rejects_bad_settings_and_states() -> None:
    with pytest.raises(ConfigError, match="max_tokens"):
        TokenBudgetSampler([1], [1], max_tokens=0, max_sentences=1)
    with pytest.raises(ConfigError, match="tgt_lengths"):
        TokenBudgetSampler([1, 2], [1], max_tokens=10, max_sentences=1)
    sampler = TokenBudgetSampler([1, 2, 3], [1, 2, 3], max_tokens=3, max_sentences=1)
    with pytest.raises(CheckpointError, match="position 3 is outside the 3 batches"):
        sampler.load_state_dict({"epoch": 0, "position": 3})
    with pytest.raises(CheckpointError, match="non-negative integers"):
        sampler.load_state_dict({"epoch": -1, "position": 0})


# -- collation ----------------------------------------------------------------------------------


def _translation_data(n: int) -> list[tuple[list[int], list[int]]]:
    """Random (source, target) id lists of 1 to 40 tokens, none of them a special id."""
    rng = random.Random(1)

    def ids() -> list[int]:
        return [rng.randint(7, 999) for _ in range(rng.randint(1, 40))]

    return [(ids(), ids()) for _ in range(n)]


def test_collate_translation_values() -> None:
    batch = collate_translation([([5, 6, 7], [8, 9]), ([5], [8, 9, 10, 11])], PAD, BOS, EOS)
    assert batch.src.tolist() == [[5, 6, 7], [5, 0, 0]]
    assert batch.tgt_in.tolist() == [[2, 8, 9, 0, 0], [2, 8, 9, 10, 11]]
    assert batch.tgt_out.tolist() == [[8, 9, 3, 0, 0], [8, 9, 10, 11, 3]]
    assert torch.equal(batch.src_mask, batch.src != PAD)
    assert torch.equal(batch.tgt_mask, batch.tgt_in != PAD)
    assert torch.equal(batch.tgt_mask, batch.tgt_out != PAD)
    assert batch.n_tgt_tokens == 8
    assert batch.src_mask.dtype == torch.bool and batch.src.dtype == torch.long


def test_collate_translation_offsets_targets_by_one() -> None:
    pairs = _translation_data(11)
    batch = collate_translation(pairs, PAD, BOS, EOS)
    for row, (_, tgt) in enumerate(pairs):
        assert batch.tgt_in[row, : len(tgt) + 1].tolist() == [BOS, *tgt]
        assert batch.tgt_out[row, : len(tgt) + 1].tolist() == [*tgt, EOS]
        assert torch.equal(batch.tgt_in[row, 1 : len(tgt) + 1], batch.tgt_out[row, : len(tgt)])
    assert batch.n_tgt_tokens == sum(len(t) + 1 for _, t in pairs)


def test_collate_classification_values() -> None:
    tokens, mask, labels = collate_classification([[4, 9, 5], [4, 5]], [2, 0], pad_id=PAD)
    assert tokens.tolist() == [[4, 9, 5], [4, 5, 0]]
    assert mask.tolist() == [[True, True, True], [True, True, False]]
    assert labels.tolist() == [2, 0] and labels.dtype == torch.long


def test_filter_long_truncates_or_drops_and_counts() -> None:
    examples = [([1] * 5, [2] * 4), ([1] * 6, [2]), ([1], [2] * 5), ([1] * 2, [2] * 2)]
    kept, dropped = filter_long(examples, max_positions=5, mode="drop")
    assert (kept, dropped) == ([examples[0], examples[3]], 2)
    kept, truncated = filter_long(examples, max_positions=5, mode="truncate")
    assert truncated == 2
    assert [(len(s), len(t)) for s, t in kept] == [(5, 4), (5, 1), (1, 4), (2, 2)]
    with pytest.raises(ConfigError, match="mode"):
        filter_long(examples, 5, mode="clip")  # type: ignore[arg-type]


# -- sentence pairs -----------------------------------------------------------------------------


def test_pairs_are_framed_as_bert_reads_them() -> None:
    cls, sep = 101, 102
    ids, segments = frame_pairs([[7, 8, 9]], [[20, 21]], cls, sep, max_length=512)
    assert ids == [[101, 7, 8, 9, 102, 20, 21, 102]]
    assert segments == [[0, 0, 0, 0, 0, 1, 1, 1]]  # [CLS] a a a [SEP] are segment 0; b b [SEP] segment 1


def _hf_pair_tokenizer(max_length: int) -> HFTokenizer:
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, **{str(i): 10 + i for i in range(100)}}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    hf.enable_truncation(max_length, strategy="longest_first")
    return hf


@pytest.mark.parametrize("max_length", [5, 8, 9, 16])
def test_long_pairs_are_cut_as_hugging_face_cuts_them(max_length: int) -> None:
    hf = _hf_pair_tokenizer(max_length)
    rng = random.Random(max_length)
    lengths = [(a, b) for a in range(1, 13) for b in range(1, 13)] + [(rng.randint(1, 40), rng.randint(1, 40))
                                                                      for _ in range(50)]
    firsts = [list(range(10, 10 + a)) for a, _ in lengths]
    seconds = [list(range(50, 50 + b)) for _, b in lengths]
    ids, segments = frame_pairs(firsts, seconds, 1, 2, max_length)
    for first, second, got, got_segments in zip(firsts, seconds, ids, segments, strict=True):
        expected = hf.encode(" ".join(str(i - 10) for i in first), " ".join(str(i - 10) for i in second))
        assert (got, got_segments) == (expected.ids, expected.type_ids), (len(first), len(second))
