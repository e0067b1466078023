"""A training run from its configuration: check the run directory, build the task and the model, and fit.

`run_training` is the entry point; `attn.train` calls it with the builder of the run's task (`attn.app.tasks`).
Before it trains a tokenizer or builds a model it checks the run directory and its free disk space
(`attn.training.preflight`); it refuses a run directory that holds checkpoints unless `train.resume` is set, and
resumes from the latest one when it is. The model starts fresh, from the checkpoint, or from a pretrained one,
whole or with LoRA adapters (`attn.training.finetune`); `set_up_trainer` chooses the machine's settings
(`attn.training.machine`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from attn.artifacts.checkpoint import latest_checkpoint, load_checkpoint
from attn.artifacts.lora_runs import LoRARun
from attn.core.config import ModelConfig
from attn.core.errors import CheckpointError, ConfigError, TrainingError
from attn.models import Model, build_model
from attn.training.distributed import (
    DistContext,
    all_gather_objects,
    init_distributed,
    shutdown,
    wrap_model,
)
from attn.training.finetune import (
    check_lora_device,
    check_resumed_lora,
    copy_pretrained,
    initial_model,
    start_lora,
)
from attn.training.logs import RunResult
from attn.training.machine import TrialPasses, choose_machine
from attn.training.preflight import prepare_run_dir
from attn.training.retention import config_difference
from attn.training.runconfig import RunConfig
from attn.training.task_data import TaskBuilder, TaskContext, TaskData
from attn.training.trainer import Trainer
from attn.training.update import Objective, TaskForward, batch_loss


def run_training(run_config: RunConfig, model_config: ModelConfig | None = None, *, task_builder: TaskBuilder) -> RunResult:
    """Trains a model as `run_config` says, resuming from the run's latest checkpoint if there is one.

    Works the same in one process and under `torchrun` (`attn.training.distributed`); every rank gets the
    `RunResult`, with checkpoint paths on rank 0 only.

    Args:
        model_config: the model to train instead of `run_config.model` (vocabulary size and labels still come from
            the data).
        task_builder: builds the task's data, e.g. `attn.app.tasks.get_task(run_config.task).build`.

    Raises:
        ConfigError: invalid settings; CheckpointError: an unusable checkpoint to resume, or one that cannot be
        written; TrainingError: an unwritable run_dir, too little free disk, or a non-finite loss with
        `on_nonfinite = "stop"`; TrainingInterrupted: SIGINT or SIGTERM stopped training (a checkpoint was saved).
    """
    ctx = init_distributed(run_config.train.device)
    try:
        model_config = model_config or run_config.model_config()
        _preflight(run_config, model_config, ctx)
        # No name holds the trainer (and its DDP wrapper): it is released once `fit` returns, before
        # `shutdown` destroys the process group.
        return _prepare(run_config, model_config, task_builder, ctx).fit()
    finally:
        shutdown(ctx)


def _preflight(config: RunConfig, model_config: ModelConfig, ctx: DistContext) -> None:
    """Rank 0 checks the run directory and free disk space; every rank raises its error."""
    problem = None
    if ctx.is_main:
        try:
            prepare_run_dir(config.run_dir, model_config)
        except TrainingError as err:
            problem = err
    problem = all_gather_objects(problem, ctx)[0]
    if problem is not None:
        raise problem


def seed_everything(seed: int) -> None:
    """Seeds Python's, NumPy's and torch's global generators (a resumed run restores them instead)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _prepare(config: RunConfig, model_config: ModelConfig, builder: TaskBuilder, ctx: DistContext) -> Trainer:
    train_config = config.train
    previous = latest_checkpoint(config.run_dir)
    if previous is not None and not train_config.resume:
        raise ConfigError(
            "train.resume", f"{config.run_dir} already holds checkpoints; choose a new run_dir, delete it, or resume"
        )
    check_lora_device(config.lora, ctx.device)
    initial = initial_model(config.model.init_from)
    base = initial.model if initial is not None else None  # what a LoRA checkpoint's adapters were trained over
    resumed = load_checkpoint(previous, train_config.attention, with_state=True, base=base) if previous else None
    if initial is not None:
        model_config = config.model.build(initial.model_config)
    seed_everything(train_config.seed)
    tokenizer = (resumed and resumed.tokenizer) or (initial and initial.tokenizer)
    template = (resumed and resumed.chat_template) or (initial and initial.chat_template)
    task = builder(config, model_config, TaskContext(ctx.rank, ctx.world_size, tokenizer, template))
    if resumed is None:
        model = build_model(task.model_config, train_config.attention)
        fresh = copy_pretrained(initial, model) if initial is not None else []
        lora = start_lora(config.lora, config.model.init_from, model, fresh) if config.lora.rank else None
    else:
        if resumed.model_config != task.model_config:
            raise CheckpointError(
                f"{resumed.path}: its model differs from this run's in "
                f"{config_difference(resumed.model_config, task.model_config)!r}; use the same model settings "
                "to resume, or a new run_dir"
            )
        check_resumed_lora(config.lora, resumed.lora, resumed.path)
        model, lora = resumed.model, resumed.lora
    # Ranks start from the same weights but draw different dropout masks.
    torch.manual_seed(train_config.seed + ctx.rank)
    trainer = set_up_trainer(config, task, model.to(ctx.device).train(), ctx, resumed.state if resumed else None,
                             lora)
    if ctx.is_main:
        trainer.machine.announce(trainer.metrics_log, trainer.step, train_config.quiet)
    return trainer


def set_up_trainer(
    config: RunConfig, task: TaskData, model: Model, ctx: DistContext = DistContext(),
    state: Mapping[str, Any] | None = None, lora: LoRARun | None = None,
) -> Trainer:
    """The trainer of a run: its model (already on `ctx.device`) wrapped for the ranks, the machine's precision
    and CPU threads chosen, and `state` (`Trainer.state_dict` of the checkpoint it resumes from) loaded if given.
    `lora`: the record of a LoRA run, whose checkpoints hold the adapters alone."""
    train = config.train
    wrapped = wrap_model(TaskForward(model, task.head), ctx, train.strategy, find_unused=task.head != "forward")
    # `train.compile` compiles the forward pass and the loss as one function (calling DDP's or FSDP2's wrapper).
    objective = Objective(task.ignore_id, train.label_smoothing,
                          loss_fn=torch.compile(batch_loss) if train.compile else batch_loss)
    machine = choose_machine(train, task.model_config, TrialPasses(wrapped, objective, task.train, ctx), state)
    trainer = Trainer(config, task, model, wrapped, objective, machine, ctx, lora)
    if state is not None:
        trainer.load_state_dict(state)
    return trainer
