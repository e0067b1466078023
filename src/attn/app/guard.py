"""Never silently worthless: a model's score next to its task's trivial baseline, and a verdict.

A run that made too few updates, trained in an emulated precision or diverged still ends with
"finished" and a number. This module says whether that number is worth anything:

| task | baseline (`attn.app.baselines`) | metric | clearly better means |
| --- | --- | --- | --- |
| translation | copying the source | BLEU | at least 2 BLEU above |
| lm | a unigram model of the training text | nats per character or token | at least 10 % fewer nats |
| classification | naive Bayes on word counts | accuracy (%) | at least 2 points above |

The score asked for never exceeds the metric's best (100 BLEU, 100 % accuracy): where the baseline already
scores it, a model that scores it too passes, with the line saying so. The quickstart fails when a model is not
clearly better on its test split; `attn train` warns when it is not on the validation split. A warning names
only the causes that the run's own record shows (`likely_causes`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.app.baselines import NaiveBayes, unigram_nll
from attn.inference.metrics import accuracy, bleu, macro_f1
from attn.data.readers import LabelledCorpus, load_labelled
from attn.training import RunResult
from attn.training.logs import METRICS_FILE, read_metrics
from attn.training.runconfig import RunConfig

BLEU_MARGIN = 2.0  # BLEU points above copying the source
NATS_RATIO = 0.9  # at most this share of the unigram model's nats
ACCURACY_MARGIN = 2.0  # accuracy points above naive Bayes
PERCENT_BEST = 100.0  # the best BLEU and accuracy (%)
VALID_TRANSLATIONS = 200  # validation sentences `attn train` decodes (greedily) for its check


@dataclasses.dataclass(frozen=True)
class BaselineCheck:
    """A model's score, its baseline's, and the score that counts as clearly better.

    Attributes:
        split: the data it was measured on ("test", "valid").
        metric: the metric's name as shown ("BLEU", "nats/char", "accuracy (%)").
        baseline_name: what the baseline is ("copying the source").
        required: the score the model must reach (at least, or at most for a loss), never beyond `best`.
        best: the metric's best possible score, or None where it has none within reach (a loss).
    """

    task: str
    split: str
    metric: str
    value: float
    baseline: float
    baseline_name: str
    required: float
    higher_is_better: bool
    decimals: int = 2
    best: float | None = None

    @property
    def passed(self) -> bool:
        """Whether the model is clearly better than the baseline, or scores the best as the baseline does."""
        if not math.isfinite(self.value):
            return False
        return self.value >= self.required if self.higher_is_better else self.value <= self.required

    @property
    def baseline_at_best(self) -> bool:
        """Whether the baseline already scores the metric's best, so that no model can beat it on this data."""
        return self.best is not None and math.isclose(self.baseline, self.best)  # BLEU's 100 may be 100 + 4e-14

    def line(self) -> str:
        """`<split> <metric> <value> against <baseline> for <baseline_name>: <verdict>`."""
        verdict = "clearly better" if self.passed else "NOT clearly better"
        if self.passed and self.baseline_at_best:
            verdict = (f"as good; {self._show(self.baseline)} is the best score, so this data cannot tell the model "
                       "from the baseline")
        return (f"{self.split} {self.metric} {self._show(self.value)} against {self._show(self.baseline)} for "
                f"{self.baseline_name}: {verdict}")

    def _show(self, value: float) -> str:
        return f"{value:.{self.decimals}f}"

    def warning(self, causes: Sequence[str]) -> str:
        """The line to show when the check failed, with the likely causes."""
        need = "at least" if self.higher_is_better else "at most"
        return (f"the {self.task} model is not clearly better than {self.baseline_name}: {self.split} {self.metric} "
                f"{self._show(self.value)} against {self._show(self.baseline)} ({need} {self._show(self.required)} "
                f"needed); likely cause: {'; '.join(causes)}")

    def record(self) -> dict[str, Any]:
        """JSON-ready fields for results files."""
        return {"baseline": self.baseline_name, "baseline_value": round(self.baseline, 4),
                "required": round(self.required, 4), "clearly_better": self.passed,
                "baseline_at_best": self.baseline_at_best}


def _percent_check(task: str, split: str, metric: str, value: float, baseline: float, baseline_name: str,
                   margin: float) -> BaselineCheck:
    """A check of a score in [0, 100] that must be `margin` above the baseline, or 100."""
    return BaselineCheck(task, split, metric, value, baseline, baseline_name, min(baseline + margin, PERCENT_BEST),
                         True, best=PERCENT_BEST)


def translation_check(value: float, sources: Sequence[str], references: Sequence[str], split: str) -> BaselineCheck:
    """BLEU `value` against copying the sources."""
    copied = bleu(list(sources), list(references)).value
    return _percent_check("translation", split, "BLEU", value, copied, "copying the source", BLEU_MARGIN)


def lm_check(value: float, train_ids: Sequence[int], eval_ids: Sequence[int], vocab_size: int, units: int,
             unit: str, split: str) -> BaselineCheck:
    """Nats per `unit` (`value`) against a unigram model of `train_ids` scored on `eval_ids[1:]`
    (the first token is never predicted), divided by `units` characters or tokens."""
    baseline = unigram_nll(train_ids, eval_ids[1:], vocab_size) / units
    return BaselineCheck("lm", split, f"nats/{unit}", value, baseline, "a unigram model of the training text",
                         baseline * NATS_RATIO, False, decimals=3)


def naive_bayes_scores(config: RunConfig, path: str | Path) -> dict[str, float]:
    """Accuracy and macro-F1 in % on the labelled file `path` of naive Bayes trained on the run's
    training file, both read with the run's fields."""
    fields = config.data.fields()
    train = load_labelled(config.data.train, fields)
    held_out = load_labelled(path, fields, train.label_names)
    num_labels = len(train.label_names)
    predicted = NaiveBayes(0.1).fit(_words(train), train.labels, num_labels).predict(_words(held_out))
    return {"accuracy": round(100 * accuracy(predicted, held_out.labels), 2),
            "macro_f1": round(100 * macro_f1(predicted, held_out.labels, num_labels), 2)}


def _words(corpus: LabelledCorpus) -> list[str]:
    """What naive Bayes counts the words of: each text, with its pair's words for sentence pairs."""
    if corpus.pairs is None:
        return corpus.texts
    return [f"{text} {pair}" for text, pair in zip(corpus.texts, corpus.pairs, strict=True)]


def classification_check(value: float, naive_bayes: dict[str, float], split: str) -> BaselineCheck:
    """Accuracy in % (`value`) against naive Bayes's (see `naive_bayes_scores`)."""
    return _percent_check("classification", split, "accuracy (%)", value, naive_bayes["accuracy"], "naive Bayes",
                          ACCURACY_MARGIN)


def likely_causes(updates: int, warmup_steps: int, precision: Mapping[str, Any],
                  losses: Sequence[float]) -> list[str]:
    """What probably kept a run from beating its baseline, as far as the run's own record shows it.

    Args:
        precision: the run's precision record in `metrics.jsonl` (`PrecisionChoice.record()`), or {} without one.
        losses: its training losses, one per update (NaN for a skipped one).
    """
    causes = []
    if updates < max(200, 2 * warmup_steps):
        causes.append(f"too few updates ({updates:,}; warmup alone is {warmup_steps:,}): give it more time or a "
                      "smaller model")
    speedup = precision.get("bf16_speedup")
    if precision.get("precision_requested") == "bf16" and speedup is not None and speedup < 1:
        causes.append(f"train.precision = \"bf16\" although the probe measured a bf16 matmul at {speedup:.2g}x the "
                      "speed of fp32 on this CPU: set train.precision = \"auto\"")
    finite = [x for x in losses if math.isfinite(x)]
    if len(finite) < len(losses):
        causes.append(f"{len(losses) - len(finite)} updates had a non-finite loss: lower optim.lr or set optim.clip")
    elif len(finite) >= 2:
        window = max(1, len(finite) // 10)
        start, end = statistics.fmean(finite[:window]), statistics.fmean(finite[-window:])
        if end >= start:
            causes.append(f"the learning rate may have diverged (training loss {start:.3g} at the start, {end:.3g} "
                          "at the end): lower optim.lr or set optim.clip")
    return causes or ["none in the run's record (enough updates, falling losses, the precision it chose); the model "
                      "may be too small, or the budget too short, for this data"]


def precision_record(run_dir: str | Path) -> dict[str, Any]:
    """The last precision record of a run's `metrics.jsonl` (that of its last start), or {} without one."""
    path = Path(run_dir) / METRICS_FILE
    records = read_metrics(path) if path.is_file() else []
    return next((r for r in reversed(records) if "precision_requested" in r), {})


def verdict(check: BaselineCheck, config: RunConfig, result: RunResult) -> str:
    """The warning for a failed check, with the causes read from the run's record; "" when it passed."""
    if check.passed:
        return ""
    causes = likely_causes(result.step, config.optim.warmup_steps, precision_record(result.run_dir), result.losses)
    return check.warning(causes)
