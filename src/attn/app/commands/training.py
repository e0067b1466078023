"""The commands that train and judge models: `attn quickstart`, `train`, `evaluate`, `average` and `plot`,
each over a function of `attn.app.runs`, `attn.app.tasks`, `attn.training` or `attn.app.quickstart`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence

from attn.app.commands.flags import decoding_flags, model_flags, subcommand
from attn.app.commands.io import generation_config, print_table
from attn.app.plots import plot_run
from attn.app.quickstart import run_quickstart
from attn.app.runs import (
    DATA_FLAGS,
    check_run,
    configure,
    default_run_dir,
    recipe_tables,
    train,
    write_run_config,
)
from attn.app.tasks import EvalOptions, evaluate, task_names
from attn.artifacts import load_model
from attn.core.errors import ConfigError
from attn.training import (
    TrainingInterrupted,
    last_checkpoints,
    read_run_tables,
    write_averaged_checkpoint,
)
from attn.training.runconfig import RunConfig


def add_quickstart_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "quickstart", cmd_quickstart, "train, evaluate and use a translator, a Shakespeare LM "
                   "and a topic classifier on the shipped data", "attn quickstart --run-dir runs/quickstart")
    p.add_argument("--run-dir", default="runs/quickstart", help="where checkpoints, metrics and plots go")
    p.add_argument("--budget", choices=["full", "smoke"], default="full",
                   help="'full' is the ~15-minute quickstart; 'smoke' a few steps per task (tests)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def cmd_quickstart(args: argparse.Namespace) -> int:
    summary = run_quickstart(args.run_dir, budget=args.budget, quiet=args.quiet)
    if args.budget == "full" and not summary["clearly_better_than_baselines"]:
        print("attn: quickstart failed: a model is not clearly better than its trivial baseline (see the warnings "
              "above)", file=sys.stderr)
        return 1
    return 0


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "train", cmd_train, "train a task on your data from its small recipe, or a model from a "
                   "TOML run config", "attn train lm --train texts.txt --valid valid.txt --minutes 10\n"
                   "  attn train --config configs/translation-quick.toml train.max_steps=2000")
    p.add_argument("words", nargs="*", metavar="[TASK] [section.key=value ...]",
                   help=f"a task to train from its shipped recipe ({', '.join(task_names(trainable=True))}), then "
                   "overrides of config fields")
    p.add_argument("--config", "-c", help="a run config (configs/*.toml, or a run's run.toml) instead of a task")
    p.add_argument("--train", metavar="FILES", help="the training data (a task needs it)")
    p.add_argument("--valid", metavar="FILES", help="the validation data (default: none)")
    for flag, field, what in (("--source", "source_field", "the source language, column or key (translation)"),
                              ("--target", "target_field", "the target language, column or key (translation)"),
                              ("--text-field", "text_field", "the column or key of the texts"),
                              ("--label-field", "label_field", "the column or key of the labels (classification)"),
                              ("--text-pair-field", "text_pair_field", "the column or key of second texts")):
        p.add_argument(flag, dest=field, metavar="NAME", help=f"{what}: data.{field}")
    p.add_argument("--minutes", type=float, help="a wall-clock budget (train.max_minutes) instead of a step count")
    p.add_argument("--preset", metavar="NAME",
                   help="a fresh model of this preset instead of the recipe's model (attn presets)")
    p.add_argument("--init", metavar="MODEL",
                   help="fine-tune this model instead of the recipe's (an attn checkpoint or run, a Hugging Face "
                        "directory, a .gguf file or a packaged model such as SmolLM2-135M-Instruct), with its "
                        "tokenizer: model.init_from")
    p.add_argument("--run-dir", dest="run_dir", help="where the run goes (a task's default: runs/TASK-DATE-TIME)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def cmd_train(args: argparse.Namespace) -> int:
    config, task = train_config(args)  # a mistake in it is reported before the trainer loads
    written = None
    if task is not None:
        # Written before training, so that a run killed at any point still has the config that reproduces it.
        # The run.toml's header is this process's command line.
        command = shlex.join(["attn", *sys.argv[1:]])
        written = write_run_config(config, command) if os.environ.get("RANK", "0") == "0" else None
        print(f"attn: training {task} in {config.run_dir}", flush=True)
    try:
        result = train(config)
    except TrainingInterrupted as stop:
        if stop.checkpoint is not None:  # rank 0 speaks for all ranks of a torchrun job
            resume = (_resume_command(args.config, args.words, args.quiet) if written is None else
                      _resume_command(str(written), [], False))
            print(f"attn: {stop}; resume with: {resume}", file=sys.stderr)
        return stop.exit_code
    print(result.summary())
    if written is not None:
        print(f"run config: {written} (train it again: {shlex.join(['attn', 'train', '--config', str(written)])} "
              "run_dir=NEW_DIR)")
    checked = check_run(config, result)
    if checked is not None:
        check, warning = checked
        print(check.line())
        if warning:
            print(f"attn: warning: {warning}", file=sys.stderr)
    return 0


def train_config(args: argparse.Namespace) -> tuple[RunConfig, str | None]:
    """The run config of `attn train` (from --config, or from the named task's recipe), with the flags and
    overrides applied; and the task, when one was named.

    Raises:
        ConfigError: neither or both of a task and --config, a task without --train, or an invalid setting.
    """
    words = list(args.words)
    task = words.pop(0) if words and "=" not in words[0] else None
    overrides = [*words, *(["train.quiet=true"] if args.quiet else [])]
    data = {name: getattr(args, name) for name in DATA_FLAGS if getattr(args, name) is not None}
    if args.config is not None:
        if task is not None:
            raise ConfigError("--config", f"give a task ({task!r}) or --config, not both")
        tables, run_dir = read_run_tables(args.config), args.run_dir
    else:
        if task is None:
            raise ConfigError("train", f"name a task ({', '.join(task_names(trainable=True))}) and its --train "
                                       "data, or give --config RUN.toml")
        tables = recipe_tables(task)
        if not args.train:
            raise ConfigError("--train", f"is required to train a task: the training data, e.g. attn train {task} "
                                         "--train FILE --valid FILE")
        run_dir = args.run_dir or default_run_dir(task)
    return configure(tables, data, args.minutes, args.preset or "", run_dir or "", overrides, args.init or ""), task


def _resume_command(config: str, overrides: Sequence[str], quiet: bool) -> str:
    """The command that continues the run: `attn train --config` with the same overrides and resuming switched on.

    Under torchrun it is a torchrun command with as many processes per node (a multi-node job adds its node
    options again)."""
    kept = [item for item in overrides if item.partition("=")[0].strip() != "train.resume"]
    arguments = ["train", "--config", config, *kept, "train.resume=true", *(["--quiet"] if quiet else [])]
    world = os.environ.get("WORLD_SIZE", "1")
    per_node = os.environ.get("LOCAL_WORLD_SIZE", world)
    launcher = ["attn"] if world == "1" else ["torchrun", f"--nproc_per_node={per_node}", "-m", "attn.app.cli"]
    return shlex.join([*launcher, *arguments])


def add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "evaluate", cmd_evaluate, "score a model on a data file with its task's metric",
                   "attn evaluate --model runs/quickstart/translation data/bible-en-es/test.tsv --json")
    model_flags(p, "a checkpoint, run directory or Hugging Face directory")
    p.add_argument("data", help="the data file (TSV for translation/classification, text for LMs, JSON Lines of "
                   "conversations for chat models: BLEU of the answers to each last assistant turn)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--limit", type=int, help="translation, chat: only the first N sentences or conversations")
    p.add_argument("--context", type=int, help="LM: window length in tokens (default: the model's positions)")
    p.add_argument("--stride", type=int, help="LM: slide the window by this many tokens and score only its "
                   "newest ones, so each has at least context - stride tokens before it (default: non-overlapping "
                   "windows)")
    decoding_flags(p)


def cmd_evaluate(args: argparse.Namespace) -> int:
    config = generation_config(args, beam_size=4, length_penalty=0.6)  # checked before a model is loaded
    bundle = load_model(args.model, args.device, quantize=args.quantize, dtype=args.dtype)
    result = evaluate(bundle, args.data, EvalOptions(config, args.limit, args.context, args.stride))
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    shown = {k: v for k, v in result.items() if not isinstance(v, (list, dict))}
    print_table([{"metric": k, "value": v} for k, v in shown.items()], ["metric", "value"])
    if "confusion_matrix" in result:
        print("\nconfusion matrix (rows: true label, columns: predicted)")
        labels = result["labels"]
        print_table([{"label": n, **{str(j): c for j, c in enumerate(row)}} for n, row in
                     zip(labels, result["confusion_matrix"])], ["label", *map(str, range(len(labels)))])
    return 0


def add_average_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "average", cmd_average, "average the weights of the last N checkpoints (paper: 5)",
                   "attn average --run runs/translation --last 5 --output runs/translation/averaged")
    p.add_argument("--run", help="a run directory whose last checkpoints to average")
    p.add_argument("--last", type=int, default=5, help="how many of the run's last checkpoints")
    p.add_argument("checkpoints", nargs="*", help="explicit checkpoint directories instead of --run")
    p.add_argument("--output", "-o", required=True, help="the averaged checkpoint's directory")


def cmd_average(args: argparse.Namespace) -> int:
    if not args.checkpoints and args.run is None:
        raise ConfigError(
            "average", "no checkpoints given; name a run with --run RUN_DIR or list checkpoint directories"
        )
    paths = args.checkpoints or last_checkpoints(args.run, args.last)
    out = write_averaged_checkpoint(paths, args.output)
    print(f"averaged {len(paths)} checkpoints into {out}")
    return 0


def add_plot_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "plot", cmd_plot, "draw loss, validation metric and learning-rate curves of a run",
                   "attn plot runs/quickstart/translation")
    p.add_argument("run_dir", help="the run directory (holds metrics.jsonl)")
    p.add_argument("--output", "-o", help="where to write the PNGs (default: the run directory)")


def cmd_plot(args: argparse.Namespace) -> int:
    for path in plot_run(args.run_dir, args.output):
        print(f"wrote {path}")
    return 0
