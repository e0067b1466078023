"""Language modelling: next-token prediction over a text stream with a decoder-only model.

Trains on text files, tokenized once into a memory-mapped token cache in the run directory, with GPT-2's
optimizer recipe as nanoGPT trains it; scored in nats per token and character over a whole file; a run must have
a tenth fewer validation nats per token than a unigram model of its training text. A chat model fine-tuned on
conversations (`data.format = "chat"`) learns the assistant's turns and is scored by the BLEU and chrF of its
answers to a JSON Lines file of conversations; it has no baseline check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.inference.continuation import continue_texts
from attn.inference.evaluation import evaluate_chat, evaluate_lm
from attn.app.guard import BaselineCheck, lm_check
from attn.app.tasks.spec import EvalOptions, TaskSpec
from attn.artifacts import Bundle
from attn.core.config import Architecture
from attn.data.file_formats import resolve_format
from attn.data.token_cache import open_token_cache
from attn.decoding import GenerationConfig
from attn.training.runconfig import RunConfig
from attn.training.task_data import TOKEN_CACHE_FOLDER, lm_task


def _evaluate(bundle: Bundle, path: str | Path, options: EvalOptions) -> dict[str, Any]:
    """Nats per token of a text file; BLEU and chrF of the answers to a JSON Lines file of conversations."""
    if resolve_format(path) == "jsonl":
        return evaluate_chat(bundle, path, options.generation, options.limit)
    return evaluate_lm(bundle, path, options.context, options.stride)


def _baseline(bundle: Bundle, config: RunConfig, metrics: Mapping[str, float]) -> BaselineCheck | None:
    """`val_loss` (nats per token, as the trainer measured it) against a unigram model of the training text,
    both read from the run's token caches (the corpus may be larger than memory)."""
    if "val_loss" not in metrics or config.data.format == "chat":  # a chat run scores the answers alone
        return None
    caches = Path(config.run_dir) / TOKEN_CACHE_FOLDER
    eval_ids = open_token_cache(caches / "valid", bundle.tokenizer)
    train_ids = open_token_cache(caches / "train", bundle.tokenizer)
    return lm_check(metrics["val_loss"], train_ids, eval_ids, bundle.tokenizer.vocab_size, len(eval_ids) - 1,
                    "token", "valid")


def _infer(bundle: Bundle, texts: Sequence[str]) -> list[dict[str, Any]]:
    found = continue_texts(bundle, texts, GenerationConfig())
    return [{"prompt": prompt, "continuation": continuations[0].text} for prompt, continuations in zip(texts, found)]


SPEC = TaskSpec(
    name="lm",
    summary="next-token prediction over a text stream with a decoder-only model",
    architecture=Architecture.DECODER_ONLY,
    data=lm_task,
    # GPT-2 as nanoGPT trains it: AdamW (0.9, 0.95), weight decay 0.1, clipping at 1, cosine from a 6e-4 peak.
    defaults={
        "optim": {"optimizer": "adamw", "schedule": "cosine", "lr": 6e-4, "beta2": 0.95, "eps": 1e-8,
                  "weight_decay": 0.1, "warmup_steps": 200, "clip": 1.0},
        "train": {"label_smoothing": 0.0},
    },
    recipe="configs/quickstart-lm.toml",
    evaluator=_evaluate,
    baseline=_baseline,
    infer=_infer,
)
