"""Translation: source -> target sentences with the encoder-decoder (the paper's task).

Trains on the `data.source_field` -> `data.target_field` pairs of any file `attn.data.readers` reads, with a
joint tokenizer; scored with sacreBLEU and chrF of beam-searched translations; a run must beat copying the
source by 2 BLEU on its validation sentences (decoded greedily).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.inference.evaluation import evaluate_translation
from attn.app.guard import VALID_TRANSLATIONS, BaselineCheck, translation_check
from attn.inference.metrics import bleu
from attn.app.tasks.spec import EvalOptions, TaskSpec
from attn.inference.translation import translate
from attn.artifacts import Bundle
from attn.core.config import Architecture
from attn.data.readers import load_parallel
from attn.decoding import GenerationConfig
from attn.training.runconfig import RunConfig
from attn.training.task_data import translation_task


def _evaluate(bundle: Bundle, path: str | Path, options: EvalOptions) -> dict[str, Any]:
    return evaluate_translation(bundle, path, options.generation, options.limit)


def _baseline(bundle: Bundle, config: RunConfig, metrics: Mapping[str, float]) -> BaselineCheck:
    """BLEU of the first `VALID_TRANSLATIONS` validation sources, decoded greedily, against copying them."""
    corpus = load_parallel(config.data.valid, config.data.fields())
    sources, references = corpus.sources[:VALID_TRANSLATIONS], corpus.targets[:VALID_TRANSLATIONS]
    hypotheses = translate(bundle, sources, GenerationConfig())
    return translation_check(bleu(hypotheses, references).value, sources, references, "valid")


def _infer(bundle: Bundle, texts: Sequence[str]) -> list[dict[str, Any]]:
    return [{"translation": t} for t in translate(bundle, texts)]


SPEC = TaskSpec(
    name="translation",
    summary="source -> target sentences with an encoder-decoder",
    architecture=Architecture.ENCODER_DECODER,
    data=translation_task,
    defaults={},  # the dataclass defaults are the paper's recipe (sections 5.3-5.4)
    recipe="configs/quickstart-translation.toml",
    evaluator=_evaluate,
    baseline=_baseline,
    infer=_infer,
)
