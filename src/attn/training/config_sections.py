"""The sections of a run configuration (`attn.training.runconfig.RunConfig`): `[data]`, `[tokenizer]`,
`[model]`, `[optim]`, `[batch]`, `[train]` and `[lora]`, each a frozen dataclass that checks its values, and
the choices their fields take.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from attn.artifacts.lora_runs import BasePrecision
from attn.core.config import ModelConfig, coerce_fields, plain_fields
from attn.core.errors import ConfigError
from attn.core.lora import LoRAConfig
from attn.core.presets import preset
from attn.data.readers import Fields
from attn.data.tokenizer_kinds import TRAINED_KINDS
from attn.data.tokenizer_pipelines import minimum_vocab_size
from attn.training.precision import Precision


class Optimizer(str, enum.Enum):
    ADAM = "adam"  # the paper (section 5.3); weight_decay is added to the gradient (L2)
    ADAMW = "adamw"  # decoupled weight decay, for GPT/BERT-style runs
    # `attn.training.update.Muon` on the blocks' matrices, AdamW on the rest; whole matrices, so not with FSDP
    MUON = "muon"


class Schedule(str, enum.Enum):
    NOAM = "noam"  # the paper's warmup then inverse square root; lr multiplies it
    COSINE = "cosine"  # linear warmup then cosine decay; lr is the peak
    CONSTANT = "constant"  # linear warmup then constant; lr is the peak


class NonFinite(str, enum.Enum):
    STOP = "stop"  # raise a TrainingError naming the step
    SKIP = "skip"  # drop that update and go on


class Strategy(str, enum.Enum):
    DDP = "ddp"  # DistributedDataParallel: every rank holds the whole model
    FSDP = "fsdp"  # FSDP2 (fully_shard): parameters, gradients and optimizer state sharded


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the data is and how to read it.

    Paths are relative to the working directory; one under `data/` that is not there names the corpus file shipped
    with attn (`attn.shipped.locate`). A language model's `train` and `valid` may name several files, directories
    and globs, in a list or separated by commas (`attn.data.text_files.corpus_files`); the other tasks read one
    file. `format` and the `*_field` settings say which fields hold what in the training, validation and test files
    (`attn.data.readers.Fields`); `join` names a table whose fields are added to every row, matched on `join_key`.
    `format = "chat"` makes the lm task fine-tune a chat model on conversations (`attn.data.chat_data`), learning
    the assistant's turns only.
    `max_length` bounds training examples in tokens (0 = the model's max_positions); `mask_probability` is the
    share of tokens the masked-LM task predicts.
    """

    train: str | tuple[str, ...] = ""
    valid: str | tuple[str, ...] = ""
    format: str = "auto"  # auto | tsv | csv | jsonl | text | chat
    source_field: str = "en"
    target_field: str = "es"
    text_field: str = "text"
    label_field: str = "label"
    text_pair_field: str = ""
    join: str = ""
    join_key: str = ""
    max_length: int = 0
    mask_probability: float = 0.15

    def __post_init__(self) -> None:
        coerce_fields(self)
        for name in ("train", "valid"):
            paths = getattr(self, name)
            if isinstance(paths, tuple) and not all(isinstance(path, str) for path in paths):
                raise ConfigError(name, f"expected a path or a list of paths, got {list(paths)!r}")
        _check_at_least(self, {"max_length": 0})
        self.fields()
        if not 0.0 < self.mask_probability < 1.0:
            raise ConfigError("mask_probability", f"must be in (0, 1), got {self.mask_probability}")

    def fields(self) -> Fields:
        """How to read the data files: the format, the fields and the join."""
        return Fields.from_mapping(plain_fields(self))


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """The tokenizer to train on the training data (or to load from `path`)."""

    kind: str = "bpe"  # bpe | byte-bpe | wordpiece | unigram | chars
    vocab_size: int = 8000
    # When set, nothing is trained: a directory written by `attn tokenizer train` (Tokenizer.save), a
    # Hugging Face tokenizer.json (or its directory) or a SentencePiece .model file (Tokenizer.load).
    path: str = ""
    lowercase: bool = True  # wordpiece only

    def __post_init__(self) -> None:
        coerce_fields(self)
        if self.kind not in TRAINED_KINDS:
            raise ConfigError("kind", f"unknown kind {self.kind!r}; choose one of {', '.join(TRAINED_KINDS)}")
        # Checked here, before any data is read; a loaded tokenizer (path) or chars has its own size.
        smallest = 1 if self.path or self.kind == "chars" else minimum_vocab_size(self.kind)
        if self.vocab_size < smallest:
            raise ConfigError("vocab_size", f"is {self.vocab_size}, but a {self.kind} tokenizer needs at least "
                                            f"{smallest} (its special tokens and more); raise it")


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """A preset name and the `ModelConfig` fields that override it.

    The vocabulary size and the number of labels come from the tokenizer and the data, so they
    need no override. `init_from` names a Hugging Face directory or an `attn` checkpoint to
    fine-tune: its architecture (with the overrides applied), weights and tokenizer replace the
    preset's; heads it lacks (a classifier) start from fresh weights.
    """

    preset: str = "paper-base"
    overrides: tuple[tuple[str, Any], ...] = ()
    init_from: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.preset, str):
            raise ConfigError("preset", f"expected a preset name, got {self.preset!r}")
        if not isinstance(self.init_from, str):
            raise ConfigError("init_from", f"expected a directory path, got {self.init_from!r}")
        self.build()

    def build(self, base: ModelConfig | None = None) -> ModelConfig:
        """The preset (or `base`, e.g. a pretrained model's config) with the overrides applied."""
        return (base or preset(self.preset)).replace(**dict(self.overrides))

    def to_dict(self) -> dict[str, Any]:
        start = {"init_from": self.init_from} if self.init_from else {}
        return {"preset": self.preset, **start, **dict(self.overrides)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSection:
        fields = dict(data)
        name = fields.pop("preset", cls.preset)
        init_from = fields.pop("init_from", "")
        return cls(name, tuple(sorted(fields.items())), init_from)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer, learning-rate schedule and gradient clipping.

    `lr` multiplies the schedule: for "noam" 1.0 is the paper's rate, for "cosine" and "constant" it is the peak.
    `clip` is the largest global gradient norm (0 = no clipping). With "muon" the blocks' matrices follow
    `muon_lr_ratio` x that rate, their updates scaled to AdamW's size, so a ratio of 1 moves them about as far as
    AdamW would. Under a time budget the warmup ends after `warmup_steps` updates or `warmup_fraction` of the
    budget, whichever comes first (`attn.training.schedules`).
    """

    optimizer: Optimizer = Optimizer.ADAM
    lr: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9
    weight_decay: float = 0.0
    schedule: Schedule = Schedule.NOAM
    warmup_steps: int = 4000
    warmup_fraction: float = 0.1
    min_lr_ratio: float = 0.0
    clip: float = 0.0
    muon_lr_ratio: float = 1.0

    def __post_init__(self) -> None:
        coerce_fields(self)
        _check_at_least(self, {"lr": 0.0, "eps": 0.0, "weight_decay": 0.0, "warmup_steps": 0, "clip": 0.0,
                               "muon_lr_ratio": 0.0})
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(name, f"must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.warmup_fraction < 1.0:
            raise ConfigError("warmup_fraction", f"must be in (0, 1), got {self.warmup_fraction}")


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """Batch sizes. Each is global: a multi-process run splits every batch across the ranks.

    Translation batches hold up to `max_tokens` padded tokens per side and `max_sentences`
    pairs, a chat run's up to `max_tokens` padded tokens and `max_sentences` conversations;
    language-model batches hold `batch_size` windows of `block_size` tokens;
    classification and masked-LM batches hold `batch_size` texts. An update sums the gradients
    of `grad_accum` such batches.
    """

    max_tokens: int = 4096
    max_sentences: int = 256
    batch_size: int = 32
    block_size: int = 128
    grad_accum: int = 1
    eval_batch_size: int = 64

    def __post_init__(self) -> None:
        coerce_fields(self)
        _check_at_least(self, {f.name: 1 for f in dataclasses.fields(self)})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training loop.

    Intervals count updates; 0 turns a periodic action off (evaluation and a checkpoint still happen at the end).
    `metric` is the validation metric of early stopping and of the best checkpoint ("" = the task's: val_loss, or
    val_accuracy for classification); `patience` is how many evaluations without improvement stop the run (0 =
    never). `peak_tflops` is one accelerator's peak, for the model-FLOPs utilisation in the metrics (0 = not
    reported).
    """

    max_steps: int = 1000
    max_minutes: float = 0.0  # stop after this much training time (0 = no limit), then evaluate and save
    eval_interval: int = 500
    eval_batches: int = 0  # 0 = the whole validation set
    checkpoint_interval: int = 1000
    keep_last: int = 5
    log_interval: int = 10
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: Precision = Precision.AUTO  # auto: bf16 only where a probe finds it faster (attn.training.precision)
    compile: bool = False  # torch.compile: forward + loss as one graph (the module alone under DDP/FSDP)
    threads: int = 0  # CPU threads of the loop; 0 = auto: probed before a time-budgeted run, else torch's count
    label_smoothing: float = 0.1
    patience: int = 0
    metric: str = ""
    on_nonfinite: NonFinite = NonFinite.STOP
    quiet: bool = False
    resume: bool = True  # continue from run_dir's latest checkpoint when there is one
    peak_tflops: float = 0.0
    strategy: Strategy = Strategy.DDP
    attention: str = "fast"

    def __post_init__(self) -> None:
        coerce_fields(self)
        minimums = {"max_steps": 1, "keep_last": 1, "log_interval": 1, "peak_tflops": 0.0, "max_minutes": 0.0,
                    "threads": 0}
        minimums.update(dict.fromkeys(("eval_interval", "eval_batches", "checkpoint_interval", "patience"), 0))
        _check_at_least(self, minimums)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError("label_smoothing", f"must be in [0, 1), got {self.label_smoothing}")


@dataclasses.dataclass(frozen=True)
class LoRASection:
    """LoRA fine-tuning of `model.init_from` (`attn.core.lora`): with `rank` > 0 the pretrained weights stay
    frozen and only adapters of that rank on the `targets` (PEFT's module names: q_proj, k_proj, v_proj, o_proj,
    gate_proj, up_proj, down_proj; GPT-2's c_attn, c_proj, c_fc) train, their update scaled by alpha / rank. `base`
    is the precision the frozen weights are held in: "float", or "int8" / "int4" for QLoRA (on the CPU).
    Checkpoints then hold the adapters alone and name the base (`attn.artifacts.lora_runs`).
    """

    rank: int = 0  # 0: no adapters, every weight trains
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    base: BasePrecision = BasePrecision.FLOAT

    def __post_init__(self) -> None:
        coerce_fields(self)
        _check_at_least(self, {"rank": 0})
        self.adapters()

    def adapters(self) -> LoRAConfig:
        """The adapters' settings (checked even while `rank` is 0)."""
        return LoRAConfig(max(self.rank, 1), self.alpha, self.dropout, self.targets)


def _check_at_least(obj: Any, minimums: Mapping[str, float]) -> None:
    for name, minimum in minimums.items():
        value = getattr(obj, name)
        if value < minimum:
            raise ConfigError(name, f"must be >= {minimum}, got {value}")
