"""Cases 2 and 3: decoding with the KV cache against Hugging Face `generate`, same weights in both.

Case 2: greedy decoding of a `gpt2`-shaped model, batch 1 and 8, 128 new tokens after a
32-token prompt, no EOS (every row makes all its tokens); tokens/s = batch x new tokens / time.
Case 3: beam search (beam 4) of a `marian-base`-shaped model over 8 random sources of 12 to 24
tokens, at most 64 new tokens, with the settings under which both return the same hypotheses
(`attn.decoding.beam_search.huggingface_config`); sentences/s. Two settings: the random weights as they are
(the hypotheses run to the length limit), and the same weights with the end-of-sentence logit raised
by `EOS_BIAS` in both models, so that hypotheses end with EOS at different lengths and the stopping
rule is in the timed path. The time includes the prefill (case 2) and the encoder (case 3).
A setting whose contenders produce different tokens fails its case (`harness.require_same`): a
speed ratio between different outputs means nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attn.artifacts.pretrained import SpecialIds
from attn.decoding import GenerationConfig, generate
from attn.decoding.beam_search import beam_search_seq2seq, huggingface_config
from attn.core.presets import preset
from benchmarks.harness import (
    CaseResult,
    Contender,
    Row,
    Settings,
    compare,
    require_same,
    rows_for,
)
from benchmarks.peers import twins

HF = "HF generate"
PROMPT = 32
GREEDY_BATCHES = (1, 8)
NEW_TOKENS = {"greedy": 128, "beam": 64}
QUICK_NEW_TOKENS = 16
BEAMS = 4
SOURCES = 8
SOURCE_LENGTHS = (12, 24)
EOS, PAD = 0, 1
# Added to the EOS logit of both models in case 3's second setting: most hypotheses then end with EOS
# at different lengths (quick shapes: 8 of 8; full size: 6 of 8, after 0 to 37 tokens), none without it.
EOS_BIAS = 4.0


def preset_name(name: str, settings: Settings) -> str:
    """The preset a case uses: its tiny variant in a quick run."""
    return f"{name}-tiny" if settings.quick else name


def _pair(name: str, family: str, hf_class: str, ids: SpecialIds, settings: Settings) -> tuple[nn.Module, nn.Module]:
    """Our model and HF's with the same weights, in eval mode on the run's device and dtype."""
    ours, theirs = twins(preset(preset_name(name, settings)), family, hf_class, ids)
    return ours.to(settings.device, settings.dtype), theirs.to(settings.device, settings.dtype)


def _random_ids(rows: int, length: int, vocab: int, seed: int) -> Tensor:
    """(rows, length) ids avoiding the special ids EOS and PAD."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(max(EOS, PAD) + 1, vocab, (rows, length), generator=generator)


def _greedy_contenders(ours: nn.Module, hf: nn.Module, batch: int, new: int, device: torch.device) -> list[Contender]:
    prompts = _random_ids(batch, PROMPT, ours.lm_head.out_features, seed=batch)
    config = GenerationConfig(max_new_tokens=new)
    ids = prompts.to(device)

    def theirs() -> Tensor:
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                          num_beams=1, pad_token_id=PAD)
        return out[:, PROMPT:]

    return [Contender("attn", lambda: generate(ours, prompts.tolist(), config), batch * new),
            Contender(HF, theirs, batch * new)]


def greedy(settings: Settings) -> CaseResult:
    """Case 2."""
    ours, hf = _pair("gpt2", "gpt2", "GPT2LMHeadModel", SpecialIds(), settings)
    new = QUICK_NEW_TOKENS if settings.quick else NEW_TOKENS["greedy"]
    rows: list[Row] = []
    for batch in GREEDY_BATCHES:
        contenders = _greedy_contenders(ours, hf, batch, new, settings.device)
        setting = f"{preset_name('gpt2', settings)} B={batch} prompt={PROMPT} new={new}"
        require_same(setting, {"attn": contenders[0].run(), HF: contenders[1].run().tolist()})
        rows += rows_for(setting, "tokens/s", compare(contenders, settings))
    return CaseResult(2, "Greedy generation with the KV cache", "> 1: attn is faster", rows,
                      {"HF attention": hf.config._attn_implementation})


def _sources(count: int, vocab: int) -> list[list[int]]:
    """Random sources of SOURCE_LENGTHS[0]..SOURCE_LENGTHS[1] tokens, each ending in EOS."""
    low, high = SOURCE_LENGTHS
    lengths = torch.randint(low, high + 1, (count,), generator=torch.Generator().manual_seed(1)).tolist()
    ids = _random_ids(count, high, vocab, seed=2)
    return [row[: n - 1] + [EOS] for row, n in zip(ids.tolist(), lengths)]


def _hf_beams(hf: nn.Module, sources: list[list[int]], new: int, device: torch.device) -> list[tuple[list[int], bool]]:
    """HF's best hypothesis per source: its tokens before EOS, and whether it ended with EOS."""
    longest = max(map(len, sources))
    ids = torch.tensor([s + [PAD] * (longest - len(s)) for s in sources], device=device)
    out = hf.generate(input_ids=ids, attention_mask=(ids != PAD).long(), num_beams=BEAMS, max_new_tokens=new,
                      length_penalty=1.0, early_stopping=False, do_sample=False)
    return [_until_eos(row[1:]) for row in out.tolist()]  # drop the start token


def _until_eos(tokens: list[int]) -> tuple[list[int], bool]:
    return (tokens[: tokens.index(EOS)], True) if EOS in tokens else (tokens, False)


def _raise_eos(ours: nn.Module, hf: nn.Module, amount: float) -> None:
    """Adds `amount` to the EOS logit of both models (our output bias is Marian's final-logits bias)."""
    with torch.no_grad():
        ours.lm_head.bias[EOS] += amount
        hf.final_logits_bias[0, EOS] += amount


def beam(settings: Settings) -> CaseResult:
    """Case 3."""
    ours, hf = _pair("marian-base", "marian", "MarianMTModel", SpecialIds(pad=PAD, eos=EOS), settings)
    new = QUICK_NEW_TOKENS if settings.quick else NEW_TOKENS["beam"]
    sources = _sources(SOURCES, ours.lm_head.out_features)
    forced = hf.generation_config.forced_eos_token_id is not None
    config = huggingface_config(BEAMS, new, length_penalty=1.0, early_stopping=False, forced_eos=forced)

    def mine() -> list[tuple[list[int], bool]]:
        found = beam_search_seq2seq(ours, sources, PAD, EOS, PAD, config)
        return [(hypotheses[0].tokens, hypotheses[0].finished) for hypotheses in found]

    contenders = [Contender("attn", mine, len(sources)),
                  Contender(HF, lambda: _hf_beams(hf, sources, new, settings.device), len(sources))]
    rows: list[Row] = []
    for bias in (0.0, EOS_BIAS):
        _raise_eos(ours, hf, bias)
        setting = f"{preset_name('marian-base', settings)} beam={BEAMS} sources={len(sources)} new<={new} eos+{bias:g}"
        outputs = contenders[0].run()
        require_same(setting, {"attn": outputs, HF: contenders[1].run()})
        found = rows_for(setting, "sentences/s", compare(contenders, settings))
        found[0].notes["mean output tokens"] = sum(len(tokens) for tokens, _ in outputs) / len(outputs)
        found[0].notes["ended with EOS"] = sum(finished for _, finished in outputs)
        rows += found
    return CaseResult(3, "Beam search (beam 4)", "> 1: attn is faster", rows,
                      {"HF attention": hf.config._attn_implementation})
