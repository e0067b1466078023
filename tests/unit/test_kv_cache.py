"""The KV cache: cached decoding equals the uncached forward pass for every positional scheme and
norm placement, left padding, the reset lifecycle, overflow, reordering, and the rows of a
continuous batch (stacking caches, trimming padding).

The Llama family's parts (grouped-query attention, QK-norm, sliding windows, rope scaling, soft caps,
their norms) decode with the cache as without, and the cache holds key/value heads, not query heads.

Cached decoding runs without autograd, so its steps go through the output projection's decoding layout
(the weight on the left); the uncached reference runs with autograd on, through `F.linear` on the weight
itself.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attn.core.config import (
    ModelConfig,
    Norm,
    NormPlacement,
    Positional,
    QKNorm,
    RopeScaling,
)
from attn.core.errors import GenerationError
from attn.core.kv_cache import KVCache, stack_rows
from attn.models import Decoder, EncoderDecoder, build_model
from attn.core.presets import preset

VARIANTS = [(p, n) for p in Positional for n in NormPlacement]
IDS = [f"{p.value}-{n.value}" for p, n in VARIANTS]


def _build(name: str, positional: Positional, norm: NormPlacement) -> Decoder | EncoderDecoder:
    torch.manual_seed(0)
    config: ModelConfig = preset(name).replace(
        positional=positional, norm_placement=norm, dropout=0.0, attention_dropout=0.0
    )
    return build_model(config).eval()


def _uncached(model, *inputs) -> torch.Tensor:
    """The forward pass with autograd on: the output projection multiplies by its weight with F.linear."""
    with torch.enable_grad():
        return model(*inputs).detach()


def _decode_in_pieces(model, tokens: torch.Tensor, cache, prefix: int) -> torch.Tensor:
    """Prefills `prefix` tokens at once, then feeds the rest one at a time; all logits (B, T, V)."""
    pieces = [model.decode_step(tokens[:, :prefix], cache)]
    pieces += [model.decode_step(tokens[:, t : t + 1], cache) for t in range(prefix, tokens.size(1))]
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize(("positional", "norm"), VARIANTS, ids=IDS)
def test_decoder_cached_equals_uncached(positional, norm):
    model = _build("gpt2-tiny", positional, norm)
    tokens = torch.randint(0, 97, (2, 12))
    full = _uncached(model, tokens)
    with torch.no_grad():
        cached = _decode_in_pieces(model, tokens, model.new_cache(2, 12), prefix=5)
    assert_close(cached, full, atol=1e-5, rtol=0)


LLAMA = dict(
    positional=Positional.ROTARY, norm=Norm.RMS, gated_ffn=True, activation="silu", attention_bias=False,
    ffn_bias=False, kv_heads=2, dropout=0.0, attention_dropout=0.0,
)
LLAMA_VARIANTS = {
    "llama": {},
    "multi-query": {"kv_heads": 1},
    "qwen2-bias": {"attention_bias": True, "attention_out_bias": False},
    "qk-norm-head": {"qk_norm": QKNorm.HEAD, "head_size": 16},
    "qk-norm-projection": {"qk_norm": QKNorm.PROJECTION, "norm_placement": NormPlacement.OUTPUT},
    "gemma2": {"norm": Norm.RMS_UNIT_OFFSET, "norm_placement": NormPlacement.PRE_POST, "activation": "gelu-tanh",
               "attention_scale_dim": 24, "attention_softcap": 5.0, "logit_softcap": 3.0, "sliding_window": 4,
               "layer_types": ("sliding_attention", "full_attention"), "scale_embedding": True},
    "gemma3-local-base": {"sliding_window": 3, "layer_types": ("sliding_attention", "full_attention"),
                          "local_rotary_base": 500.0, "rotary_base": 1e6},
    "mistral-window": {"sliding_window": 5},
    "llama3-scaling": {"rope_scaling": RopeScaling.LLAMA3, "rope_factor": 8.0, "rope_original_positions": 16},
    "yarn-partial": {"rope_scaling": RopeScaling.YARN, "rope_factor": 4.0, "rope_original_positions": 16,
                     "rotary_fraction": 0.5},
}


@pytest.mark.parametrize("variant", list(LLAMA_VARIANTS))
def test_llama_parts_decode_with_the_cache_as_without(variant):
    torch.manual_seed(0)
    model = build_model(preset("gpt2-tiny").replace(**{**LLAMA, **LLAMA_VARIANTS[variant]})).eval()
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16]]
    steps = torch.randint(0, 97, (2, 6))
    longest = max(map(len, prompts))
    batch = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[False] * (longest - len(p)) + [True] * len(p) for p in prompts])
    with torch.no_grad():
        cache = model.new_cache(2, longest + 6)
        first = model.decode_step(batch, cache, mask)[:, -1:]
        batched = torch.cat([first] + [model.decode_step(steps[:, t : t + 1], cache) for t in range(6)], dim=1)
    assert cache.keys.size(2) == model.blocks[0].attn.kv_heads == LLAMA_VARIANTS[variant].get("kv_heads", 2)
    for row, prompt in enumerate(prompts):
        alone = _uncached(model, torch.tensor([prompt + steps[row].tolist()]))[:, len(prompt) - 1 :]
        assert_close(batched[row : row + 1], alone, atol=1e-5, rtol=0)


def test_a_prefill_of_the_last_position_only_gives_its_logits_and_the_same_cache():
    model = build_model(preset("gpt2-tiny").replace(**LLAMA)).eval()
    tokens = torch.randint(0, 97, (2, 7))
    mask = torch.tensor([[False, False] + [True] * 5, [True] * 7])
    with torch.no_grad():
        full, last = model.new_cache(2, 8), model.new_cache(2, 8)
        expected = model.decode_step(tokens, full, mask)[:, -1:]
        assert_close(model.decode_step(tokens, last, mask, last_only=True), expected, atol=1e-6, rtol=0)
        step = torch.tensor([[3], [4]])
        assert_close(model.decode_step(step, last), model.decode_step(step, full), atol=1e-6, rtol=0)


def test_grouped_query_cache_bytes_are_two_x_layers_x_kv_heads_x_head_dim_x_length():
    """SmolLM2-135M's shape (30 layers, 9 query heads sharing 3 key/value heads of 64) at 2,048 tokens, fp32."""
    config = preset("smollm2-135m")
    with torch.device("meta"):
        cache = build_model(config).new_cache(1, 2048)
    size = cache.keys.numel() * cache.keys.element_size() + cache.values.numel() * cache.values.element_size()
    assert size == 2 * 30 * 3 * 64 * 2048 * 4  # 94.4 MB; a third of what 9 query heads would take
    assert cache.keys.shape == (30, 1, 3, 2048, 64)


@pytest.mark.parametrize(("positional", "norm"), VARIANTS, ids=IDS)
def test_encoder_decoder_cached_equals_uncached(positional, norm):
    model = _build("paper-base-tiny", positional, norm)
    src = torch.randint(1, 97, (2, 7))
    src_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    tgt = torch.randint(0, 97, (2, 9))
    full = _uncached(model, src, tgt, src_mask)
    with torch.no_grad():
        cache = model.new_cache(model.encode(src, src_mask), src_mask, 9)
        cached = _decode_in_pieces(model, tgt, cache, prefix=3)
    assert_close(cached, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("positional", "norm"), VARIANTS, ids=IDS)
def test_left_padded_prompts_decode_as_if_alone(positional, norm):
    model = _build("gpt2-tiny", positional, norm)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]
    steps = torch.randint(0, 97, (3, 4))
    longest = max(map(len, prompts))
    batch = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[False] * (longest - len(p)) + [True] * len(p) for p in prompts])
    with torch.no_grad():
        cache = model.new_cache(3, longest + 4)
        first = model.decode_step(batch, cache, mask)[:, -1:]
        batched = torch.cat([first] + [model.decode_step(steps[:, t : t + 1], cache) for t in range(4)], dim=1)
        for row, prompt in enumerate(prompts):
            alone = _uncached(model, torch.tensor([prompt + steps[row].tolist()]))[:, len(prompt) - 1 :]
            assert_close(batched[row : row + 1], alone, atol=1e-5, rtol=0)


def test_encoder_mlm_logits_without_autograd_equal_those_with_it():
    """The third architecture's output projection (the masked-LM head) takes the same decoding layouts."""
    torch.manual_seed(0)
    model = build_model(preset("bert-base-tiny").replace(dropout=0.0, attention_dropout=0.0)).eval()
    tokens = torch.randint(0, 97, (2, 9))
    with torch.enable_grad():
        expected = model.mlm_logits(tokens).detach()
    with torch.no_grad():
        assert_close(model.mlm_logits(tokens), expected, atol=1e-5, rtol=0)


def _storages(cache: KVCache) -> dict[int, int]:
    """Bytes of every distinct storage the cache's tensors (its memory included) point into."""
    tensors = [value for value in vars(cache).values() if isinstance(value, torch.Tensor)]
    tensors += [tensor for pair in cache.memory for tensor in pair]
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


@pytest.mark.parametrize("name", ["gpt2-tiny", "paper-base-tiny"])
def test_a_new_cache_holds_keys_values_positions_and_memory_only(name):
    """No copy of the output matrix: the bytes are those of the cache's own tensors, counted from the config."""
    model, config = _build(name, Positional.LEARNED, NormPlacement.PRE), preset(name)
    batch, length, source = 2, 8, 5
    with torch.no_grad():
        model(*([torch.tensor([[3]])] * (1 if isinstance(model, Decoder) else 2)))  # one row: makes the copy
        if isinstance(model, Decoder):
            cache, memory = model.new_cache(batch, length), 0
        else:
            cache = model.new_cache(model.encode(torch.randint(1, 97, (batch, source))), None, length)
            memory = 2 * config.decoder_layers * batch * source * config.d_model * 4  # keys and values, fp32
    keys_values = 2 * config.decoder_layers * batch * length * config.d_model * 4
    positions_and_mask = batch * length * (8 + 1)  # int64 positions, bool mask
    assert sum(_storages(cache).values()) == keys_values + positions_and_mask + memory


def test_reset_empties_the_cache_for_reuse():
    model = _build("gpt2-tiny", Positional.ROTARY, NormPlacement.PRE)
    first, second = torch.randint(0, 97, (2, 6)), torch.randint(0, 97, (2, 6))
    with torch.no_grad():
        cache = model.new_cache(2, 6)
        model.decode_step(first, cache, torch.tensor([[False, True, True, True, True, True]] * 2))
        cache.reset()
        assert cache.length == 0
        reused = _decode_in_pieces(model, second, cache, prefix=2)
        fresh = _decode_in_pieces(model, second, model.new_cache(2, 6), prefix=2)
    assert_close(reused, fresh, atol=0, rtol=0)


def test_overflow_raises_generation_error():
    model = _build("gpt2-tiny", Positional.LEARNED, NormPlacement.PRE)
    cache = model.new_cache(1, 4)
    with torch.no_grad():
        model.decode_step(torch.tensor([[1, 2, 3]]), cache)
        with pytest.raises(GenerationError, match="holds 4 tokens and already has 3"):
            model.decode_step(torch.tensor([[4, 5]]), cache)


def test_reorder_follows_rows_of_a_decoder():
    model = _build("gpt2-tiny", Positional.RELATIVE, NormPlacement.PRE)
    tokens = torch.randint(0, 97, (3, 5))
    mask = torch.tensor([[True] * 5, [False, False, True, True, True], [False] + [True] * 4])
    index = torch.tensor([2, 0, 0, 1])  # B' = 4 rows from B = 3: reorder and copy
    step = torch.randint(0, 97, (4, 1))
    with torch.no_grad():
        cache = model.new_cache(3, 6)
        model.decode_step(tokens, cache, mask)
        cache.reorder(index)
        reordered = model.decode_step(step, cache)
        fresh = model.new_cache(4, 6)
        model.decode_step(tokens[index], fresh, mask[index])
        expected = model.decode_step(step, fresh)
    assert_close(reordered, expected, atol=1e-5, rtol=0)


def test_reorder_carries_the_cross_attention_memory():
    model = _build("paper-base-tiny", Positional.SINUSOIDAL, NormPlacement.POST)
    src = torch.randint(1, 97, (2, 5))
    src_mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    index = torch.tensor([1, 1, 0])
    with torch.no_grad():
        cache = model.new_cache(model.encode(src, src_mask), src_mask, 4)
        model.decode_step(torch.tensor([[3], [4]]), cache)
        cache.reorder(index, sources=index)
        reordered = model.decode_step(torch.tensor([[7], [8], [9]]), cache)
        fresh = model.new_cache(model.encode(src[index], src_mask[index]), src_mask[index], 4)
        model.decode_step(torch.tensor([[4], [4], [3]]), fresh)
        expected = model.decode_step(torch.tensor([[7], [8], [9]]), fresh)
    assert_close(reordered, expected, atol=1e-5, rtol=0)


def test_reorder_within_sources_keeps_the_memory_in_place():
    model = _build("paper-base-tiny", Positional.SINUSOIDAL, NormPlacement.PRE)
    src = torch.randint(1, 97, (2, 5))
    src_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    beams = torch.tensor([0, 0, 1, 1])  # two beams per source, both reading its memory row
    index = torch.tensor([1, 1, 3, 2])  # every row stays with its source, as beams of one sentence do
    first, second = torch.tensor([[3], [4], [5], [6]]), torch.tensor([[7], [8], [9], [10]])
    with torch.no_grad():
        cache = model.new_cache(model.encode(src, src_mask), src_mask, 4)
        cache.reorder(beams)
        model.decode_step(first, cache)
        memory = cache.memory
        cache.reorder(index)
        in_place = cache.memory is memory
        reordered = model.decode_step(second, cache)
        fresh = model.new_cache(model.encode(src[beams], src_mask[beams]), src_mask[beams], 4)
        model.decode_step(first[index], fresh)
        expected = model.decode_step(second, fresh)
        cache.reorder(torch.tensor([2, 3]), sources=torch.tensor([1]))  # the first sentence leaves
        last = model.decode_step(second[2:], cache)
        fresh.reorder(torch.tensor([2, 3]), sources=torch.tensor([2, 3]))
        expected_last = model.decode_step(second[2:], fresh)
    assert in_place and memory[0][0].size(0) == 2  # one memory row per source, shared by its beams
    assert cache.memory[0][0].size(0) == 1
    assert_close(reordered, expected, atol=1e-5, rtol=0)
    assert_close(last, expected_last, atol=1e-5, rtol=0)


def test_rows_that_cannot_share_the_memory_evenly_are_refused():
    model = _build("paper-base-tiny", Positional.SINUSOIDAL, NormPlacement.PRE)
    src = torch.randint(1, 97, (2, 5))
    with torch.no_grad():
        cache = model.new_cache(model.encode(src), None, 4)
        with pytest.raises(GenerationError, match="3 rows cannot read 2 memory rows"):
            cache.reorder(torch.tensor([0, 0, 1]))


def test_follow_decodes_as_reorder_and_copies_only_the_rows_no_beam_continues():
    model = _build("paper-base-tiny", Positional.SINUSOIDAL, NormPlacement.PRE)
    src = torch.randint(1, 97, (2, 5))
    src_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    beams = torch.tensor([0, 0, 0, 1, 1, 1])  # three beams per source
    first, second = torch.randint(1, 97, (6, 1)), torch.randint(1, 97, (6, 1))
    parents = torch.tensor([2, 0, 2, 5, 4, 3])  # row 1 has no child, row 2 two; the second sentence permutes
    with torch.no_grad():
        cache = model.new_cache(model.encode(src, src_mask), src_mask, 4)
        cache.reorder(beams)
        model.decode_step(first, cache)
        keys = cache.keys.clone()
        rows = cache.follow(parents)
        placed = torch.empty_like(rows)
        placed[rows] = second.squeeze(1)
        followed = model.decode_step(placed[:, None], cache)[rows]
        fresh = model.new_cache(model.encode(src[beams], src_mask[beams]), src_mask[beams], 4)
        model.decode_step(first, fresh)
        fresh.reorder(parents)
        expected = model.decode_step(second, fresh)
    assert rows.tolist() == [2, 0, 1, 5, 4, 3]  # beam 2 continues row 2 too: the copy goes to row 1
    assert_close(keys[:, [0, 2, 3, 4, 5], :, :1], cache.keys[:, [0, 2, 3, 4, 5], :, :1], atol=0, rtol=0)
    assert_close(cache.keys[:, 1, :, :1], keys[:, 2, :, :1], atol=0, rtol=0)
    assert_close(followed, expected, atol=1e-5, rtol=0)


def test_follow_copies_every_row_where_reading_the_rows_would_wait_for_a_device(monkeypatch):
    model = _build("gpt2-tiny", Positional.LEARNED, NormPlacement.PRE)
    tokens, parents, step = torch.randint(0, 97, (3, 4)), torch.tensor([2, 0, 0]), torch.randint(0, 97, (3, 1))
    monkeypatch.setattr("attn.core.kv_cache.cheap_to_read", lambda _: False)
    with torch.no_grad():
        cache = model.new_cache(3, 6)
        model.decode_step(tokens, cache)
        rows = cache.follow(parents)
        followed = model.decode_step(step, cache)
        fresh = model.new_cache(3, 6)
        model.decode_step(tokens[parents], fresh)
        expected = model.decode_step(step, fresh)
    assert rows.tolist() == [0, 1, 2]  # beam order, as reorder leaves it
    assert_close(followed, expected, atol=1e-5, rtol=0)


def test_follow_refuses_a_copy_across_sentences_or_another_batch_size():
    model = _build("paper-base-tiny", Positional.SINUSOIDAL, NormPlacement.PRE)
    src = torch.randint(1, 97, (2, 5))
    with torch.no_grad():
        cache = model.new_cache(model.encode(src), None, 4)
        cache.reorder(torch.tensor([0, 0, 1, 1]))
        model.decode_step(torch.tensor([[3], [4], [5], [6]]), cache)
        for parents in ([0, 1, 0, 0], [2, 3, 0, 1]):  # rows 2, 3 would continue rows of another sentence
            with pytest.raises(GenerationError, match="same cross-attention memory"):
                cache.follow(torch.tensor(parents))
        with pytest.raises(GenerationError, match="keeps the batch's 4 rows, got 3"):
            cache.follow(torch.tensor([0, 1, 2]))


def test_reorders_alternate_between_two_buffers():
    cache = _filled(2, 3, 10.0)
    first = cache.keys.data_ptr()
    cache.reorder(torch.tensor([1, 0]))
    second = cache.keys.data_ptr()
    cache.reorder(torch.tensor([1]))
    assert cache.keys.data_ptr() == first != second  # the first buffer, reused for the smaller batch
    assert cache.keys[0, :, 0, :3, 0].tolist() == [[10, 11, 12]]


def _filled(batch: int, length: int, first: float) -> KVCache:
    """A 1-layer, 1-head cache of `length` tokens per row, key value = first + token index, positions 0.."""
    cache = KVCache(1, batch, 1, 8, 1)
    cache.extend(torch.arange(length).expand(batch, length), torch.ones(batch, length, dtype=torch.bool))
    values = first + torch.arange(length, dtype=torch.float32).expand(1, batch, 1, length)[..., None]
    cache.slots[0].update(values, -values)
    return cache


def test_stacked_rows_end_aligned_and_left_padded():
    stacked = stack_rows(_filled(1, 3, 10.0), _filled(2, 1, 20.0), _filled(1, 2, 30.0), max_length=6)
    assert (stacked.batch, stacked.length, stacked.max_length) == (4, 3, 6)
    assert stacked.keys[0, :, 0, :3, 0].tolist() == [[10, 11, 12], [0, 0, 20], [0, 0, 20], [0, 30, 31]]
    assert stacked.values[0, 0, 0, :3, 0].tolist() == [-10, -11, -12]
    assert stacked.mask[:, :3].tolist() == [[True] * 3, [False, False, True], [False, False, True],
                                            [False, True, True]]
    assert stacked.next_positions().squeeze(1).tolist() == [3, 1, 1, 2]  # positions count real tokens only


def test_stacking_refuses_cross_attention_caches_and_too_little_room():
    with pytest.raises(GenerationError, match="room for 3"):
        stack_rows(_filled(1, 3, 0.0), _filled(1, 1, 0.0), max_length=2)
    memory = _filled(1, 1, 0.0)
    memory.memory = [(torch.zeros(1), torch.zeros(1))]
    with pytest.raises(GenerationError, match="decoder-only"):
        stack_rows(_filled(1, 1, 0.0), memory, max_length=4)


def test_trim_padding_frees_the_columns_only_padding_holds():
    stacked = stack_rows(_filled(1, 4, 10.0), _filled(1, 2, 20.0), max_length=6)
    stacked.reorder(torch.tensor([1]))
    stacked.trim_padding()
    assert (stacked.length, stacked.start) == (2, 2)
    assert stacked.keys[0, 0, 0, :2, 0].tolist() == [20, 21]
    assert stacked.positions[0, :2].tolist() == [0, 1] and stacked.mask[0, :2].all()
