"""The `attn` command line: the commands, thin over importable functions (their flags: `attn.app.cli_parser`).

Every subcommand parses its arguments (reading and writing through `attn.app.cli_io`) and calls a function
of the library (`attn.app.inference`, `attn.app.tasks`, `attn.app.runs`, `attn.artifacts.pretrained`,
`attn.app.quickstart`). A user's mistake (an
`AttnError`) is printed on one line; configuration and usage errors exit with status 2, other
errors with 1; no traceback. An unexpected error (a fault of attn) is one line too, exit 1, unless
ATTN_DEBUG=1 asks for its traceback. The commands that train or serve keep freed CPU memory for
the next step (`KEEPS_MEMORY`, `attn.app.allocator`) unless ATTN_KEEP_MEMORY=0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
import traceback
from collections.abc import Sequence

from attn.app.allocator import keep_freed_memory
from attn.inference.attention_views import attention_of
from attn.inference.chat import ChatSession, conversation
from attn.inference.classification import classify, embed
from attn.app.cli_io import (
    flag_error,
    generation_config,
    print_table,
    read_inputs,
    write_lines,
    write_output,
)
from attn.app.cli_parser import Handler, check_text_arguments, command_parser
from attn.inference.continuation import check_samples, continue_texts, generate_stream
from attn.app.plots import plot_attention, plot_run
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
from attn.app.serve import (
    ServeOptions,
    api_keys,
    listen,
    load_served_models,
    run_server,
)
from attn.app.tasks import EvalOptions, evaluate, task_names
from attn.inference.translation import translate
from attn.artifacts import load_model, save_model
from attn.artifacts.pretrained import FAMILIES, export_pretrained
from attn.data.tokenizer_training import train_tokenizer_files
from attn.data.tokenizers import Tokenizer
from attn.core.errors import AttnError, CheckpointError, ConfigError, GenerationError
from attn.core.linear import inference
from attn.models import build_model, count_parameters
from attn.core.presets import preset, preset_names
from attn.training import (
    TrainingInterrupted,
    last_checkpoints,
    read_run_tables,
    write_averaged_checkpoint,
)
from attn.training.runconfig import RunConfig

# -- presets ----------------------------------------------------------------------------------


def presets_table() -> list[dict[str, object]]:
    """One row per preset: its shape and parameter count (built on the meta device, no memory used)."""
    import torch

    rows = []
    for name in preset_names():
        cfg = preset(name)
        with torch.device("meta"):
            params = count_parameters(build_model(cfg))
        rows.append({
            "name": name, "architecture": cfg.architecture.value, "layers": f"{cfg.encoder_layers}+{cfg.decoder_layers}",
            "d_model": cfg.d_model, "heads": cfg.heads, "d_ff": cfg.d_ff, "vocab": cfg.vocab_size,
            "positional": cfg.positional.value, "norm": cfg.norm_placement.value, "parameters": params,
        })
    return rows


def _format_count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def cmd_presets(args: argparse.Namespace) -> int:
    rows = presets_table()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    shown = [{**r, "parameters": _format_count(int(r["parameters"]))} for r in rows]
    print_table(shown, ["name", "architecture", "layers", "d_model", "heads", "d_ff", "vocab", "positional", "norm",
                        "parameters"])
    return 0


# -- inference --------------------------------------------------------------------------------


def cmd_translate(args: argparse.Namespace) -> int:
    config = generation_config(args, beam_size=4, length_penalty=0.6)  # checked before a model is loaded
    loaded = load_model(args.model, args.device, quantize=args.quantize)
    outputs = translate(loaded, read_inputs(args), config)
    if args.json:
        print(json.dumps([{"translation": t} for t in outputs], ensure_ascii=False))
    else:
        write_lines(outputs, args.output)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    config = generation_config(args)  # checked before a model is loaded
    try:
        check_samples(args.n, config)
    except GenerationError as error:
        raise flag_error(error, {"samples": "--n"}) from None
    if args.system is not None and not args.chat:
        raise ConfigError("--system", "is the system message of a chat: give --chat as well")
    inputs = list(args.text) or (read_inputs(args) if args.input else [args.prompt])
    loaded = load_model(args.model, args.device, quantize=args.quantize)
    prompts, shown = inputs, inputs  # shown: what is printed before each continuation
    if args.chat:  # each input is a user's message; its answer is printed alone
        prompts = [loaded.render_chat(conversation(text, args.system)) for text in inputs]
        shown = [""] * len(inputs)
    if len(prompts) == 1 and args.n == 1 and config.beam_size == 1 and not (args.json or args.output):
        pieces = generate_stream(loaded, prompts[0], config, args.chat)  # checks the prompt's length before anything is printed
        print(shown[0], end="", flush=True)
        for piece in pieces:
            print(piece, end="", flush=True)
        print()
        return 0
    found = continue_texts(loaded, prompts, config, args.n, chat=args.chat)
    if args.json:
        print(json.dumps([{"prompt": prompt, "continuations": [dataclasses.asdict(c) for c in continuations]}
                          for prompt, continuations in zip(inputs, found)], ensure_ascii=False))
    else:  # each prompt with its continuation; a blank line between two
        write_lines(["\n\n".join(head + c.text for head, cs in zip(shown, found) for c in cs)], args.output)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    config = generation_config(args)  # checked before a model is loaded
    session = ChatSession(load_model(args.model, args.device, quantize=args.quantize), config, args.system)
    with inference(session.loaded.model):  # weights packed once for every answer, not once for each
        return _chat_loop(session, args.model)


def _chat_loop(session: ChatSession, model: str) -> int:
    interactive = sys.stdin.isatty()
    with contextlib.suppress(AttributeError):  # a line that is not UTF-8 is refused, and the chat goes on
        sys.stdin.reconfigure(errors="surrogateescape")  # (unless standard input is not a text file: tests)
    print(f"attn chat: {model}; /reset starts a new conversation, Ctrl-C stops an answer, Ctrl-D or Ctrl-C at "
          "the prompt ends", file=sys.stderr)
    while True:
        try:
            text = input("> " if interactive else "").strip()
        except (EOFError, KeyboardInterrupt):
            if interactive:
                print()
            return 0
        if text == "/reset":
            session.reset()
            print("attn chat: a new conversation", file=sys.stderr)
        elif text:
            _answer(session, text)


def _answer(session: ChatSession, text: str) -> None:
    """Prints the answer to `text` as it streams; Ctrl-C stops it. A mistake (a conversation too long for the
    model) is one line, and the chat goes on."""
    try:
        pieces = session.reply(text)
    except AttnError as error:
        print(f"attn: error: {error}; /reset starts a new conversation", file=sys.stderr)
        return
    with contextlib.closing(pieces):
        try:
            for piece in pieces:
                print(piece, end="", flush=True)
        except KeyboardInterrupt:
            print(flush=True)
            print("attn chat: answer stopped", file=sys.stderr)
            return
    print(flush=True)


def cmd_classify(args: argparse.Namespace) -> int:
    loaded = load_model(args.model, args.device, quantize=args.quantize)
    texts = read_inputs(args)
    if loaded.fields.text_pair_field:
        firsts, seconds = _split_pairs(texts)
        predictions = classify(loaded, firsts, pairs=seconds)
    else:
        predictions = classify(loaded, texts)
    if args.json:
        print(json.dumps([{"text": t, "label": p.label, "probability": round(p.probability, 4)}
                          for t, p in zip(texts, predictions)], ensure_ascii=False))
    else:
        write_lines([f"{p.label}\t{p.probability:.3f}\t{t}" for t, p in zip(texts, predictions)], args.output)
    return 0


def _split_pairs(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    """The inputs of a sentence-pair classifier, one TEXT<TAB>PAIR per input, as two lists."""
    firsts, seconds = [], []
    for number, line in enumerate(lines, start=1):
        first, tab, second = line.partition("\t")
        if not tab:
            raise AttnError(f"input {number} has no tab: this classifier takes sentence pairs, give each as "
                            "TEXT<TAB>PAIR")
        firsts.append(first)
        seconds.append(second)
    return firsts, seconds


def cmd_embed(args: argparse.Namespace) -> int:
    loaded = load_model(args.model, args.device, quantize=args.quantize)
    texts = read_inputs(args)
    vectors = embed(loaded, texts, args.batch_size)
    if args.output and args.output.endswith(".npy"):
        import numpy as np

        write_output(args.output, lambda path: np.save(path, vectors.numpy()))
        print(f"wrote {len(texts)} embeddings of size {vectors.size(1)} to {args.output}")
    elif args.output and args.output.endswith(".safetensors"):
        from safetensors.torch import save_file

        write_output(args.output, lambda path: save_file({"embeddings": vectors.contiguous()}, str(path)))
        print(f"wrote {len(texts)} embeddings of size {vectors.size(1)} to {args.output}")
    else:
        write_lines([json.dumps({"text": t, "embedding": [round(x, 6) for x in v.tolist()]}, ensure_ascii=False)
                      for t, v in zip(texts, vectors)], args.output)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    config = generation_config(args, beam_size=4, length_penalty=0.6)  # checked before a model is loaded
    loaded = load_model(args.model, args.device, quantize=args.quantize)
    result = evaluate(loaded, args.data, EvalOptions(config, args.limit, args.context, args.stride))
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


def cmd_attention(args: argparse.Namespace) -> int:
    bundle = load_model(args.model, args.device, quantize=args.quantize)
    view = attention_of(bundle, " ".join(args.text), args.kind, args.layer, args.head)
    path = plot_attention(view.weights, view.queries, view.keys, view.title, args.output)
    print(f"wrote {path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    options = ServeOptions(args.host, args.port, args.max_body_bytes, args.max_queue, args.batching,
                           args.max_batch_tokens, api_keys(args.api_key_file), args.insecure_no_key,
                           args.request_timeout, args.max_tokens_cap, args.max_n, args.max_concurrent_per_key,
                           tuple(args.cors_origins))
    bound = listen(options)  # before the models load: a port in use is said at once
    run_server(load_served_models(args.model, args.device, args.quantize), options, bound)
    return 0


# -- training ---------------------------------------------------------------------------------


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
    """The run config of `attn train` (from --config, or from the named task's recipe), with the
    flags and overrides applied; and the task, when one was named.

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

    Under torchrun it is a torchrun command with as many processes per node (a multi-node job
    adds its node options again).
    """
    kept = [item for item in overrides if item.partition("=")[0].strip() != "train.resume"]
    arguments = ["train", "--config", config, *kept, "train.resume=true", *(["--quiet"] if quiet else [])]
    world = os.environ.get("WORLD_SIZE", "1")
    per_node = os.environ.get("LOCAL_WORLD_SIZE", world)
    launcher = ["attn"] if world == "1" else ["torchrun", f"--nproc_per_node={per_node}", "-m", "attn.app.cli"]
    return shlex.join([*launcher, *arguments])


def cmd_average(args: argparse.Namespace) -> int:
    if not args.checkpoints and args.run is None:
        raise ConfigError(
            "average", "no checkpoints given; name a run with --run RUN_DIR or list checkpoint directories"
        )
    paths = args.checkpoints or last_checkpoints(args.run, args.last)
    out = write_averaged_checkpoint(paths, args.output)
    print(f"averaged {len(paths)} checkpoints into {out}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    for path in plot_run(args.run_dir, args.output):
        print(f"wrote {path}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    if args.quantize is not None and args.to != "attn":
        raise ConfigError("--quantize", f"{args.to} directories hold float weights: convert --to attn to store "
                                        f"{args.quantize} weights")
    bundle = load_model(args.source, "cpu", require_tokenizer=False, quantize=args.quantize)
    if args.to == "attn":
        if bundle.imported is None and args.quantize is None:
            raise CheckpointError(f"{args.source}: already an attn checkpoint (no Hugging Face config.json); "
                                  f"convert --to one of {', '.join(FAMILIES)} to export it")
        out = save_model(bundle, args.output)
        origin = f"imported {bundle.imported.family}" if bundle.imported is not None else "converted"
        weights = f" with {args.quantize} weights" if args.quantize else ""
        print(f"{origin} from {args.source} into {out}{weights}")
    else:
        out = export_pretrained(bundle.model, bundle.model_config, args.output, args.to, bundle.tokenizer,
                                chat_template=bundle.chat_template)
        print(f"exported {args.source} as a Hugging Face {args.to} directory: {out}")
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    summary = run_quickstart(args.run_dir, budget=args.budget, quiet=args.quiet)
    if args.budget == "full" and not summary["clearly_better_than_baselines"]:
        print("attn: quickstart failed: a model is not clearly better than its trivial baseline (see the warnings "
              "above)", file=sys.stderr)
        return 1
    return 0


# -- tokenizers -------------------------------------------------------------------------------


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    try:
        trained = train_tokenizer_files(args.kind, args.inputs, args.vocab_size, args.output, args.force,
                                        args.lowercase, args.fields)
    except ConfigError as error:
        raise flag_error(error, {"inputs": "inputs", "texts": "inputs"}) from None
    tokenizer = trained.tokenizer
    print(f"trained a {tokenizer.kind} tokenizer on {trained.lines} texts of {len(trained.files)} file(s)")
    print(f"vocabulary size: {tokenizer.vocab_size}")
    specials = [f"{role}={tokenizer.id_to_token(i)} ({i})" for role, i in tokenizer.roles.items() if i is not None]
    print(f"special tokens: {', '.join(specials)}")
    print(f"wrote {trained.output}; load it with tokenizer.path = {json.dumps(str(trained.output))}")
    return 0


def cmd_tokenizer_encode(args: argparse.Namespace) -> int:
    tokenizer = Tokenizer.load(args.tokenizer)
    for text in args.text:
        ids = tokenizer.encode(text, add_special=args.add_special)
        print(f"tokens: {json.dumps([tokenizer.id_to_token(i) for i in ids], ensure_ascii=False)}")
        print(f"ids: {json.dumps(ids)}")
    return 0


HANDLERS: dict[str, Handler] = {
    "quickstart": cmd_quickstart, "train": cmd_train, "evaluate": cmd_evaluate, "translate": cmd_translate,
    "generate": cmd_generate, "chat": cmd_chat, "classify": cmd_classify, "embed": cmd_embed, "convert": cmd_convert,
    "average": cmd_average, "plot": cmd_plot, "attention": cmd_attention, "serve": cmd_serve,
    "tokenizer train": cmd_tokenizer_train, "tokenizer encode": cmd_tokenizer_encode, "presets": cmd_presets,
}


# The commands that run training or serving steps, which allocate and free the same large tensors
# every step: they keep freed memory for the next (`attn.app.allocator`).
KEEPS_MEMORY = ("train", "quickstart", "serve")


def build_parser() -> argparse.ArgumentParser:
    """The parser of `attn` (`attn.app.cli_parser`), whose commands run the functions of this module."""
    return command_parser(HANDLERS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and (args.func is not cmd_train or any(item.startswith("-") for item in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:  # overrides after the options: attn train TASK --train FILE key=value
        args.words += extra
    if args.command in KEEPS_MEMORY and os.environ.get("ATTN_KEEP_MEMORY") != "0":
        keep_freed_memory()  # once, before any step: the setting is the whole process's
    try:
        check_text_arguments(args)
        return args.func(args)
    except ConfigError as error:
        print(f"attn: error: {error}", file=sys.stderr)
        return 2
    except AttnError as error:
        print(f"attn: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # a path no library function checked: a missing file, a directory, no permission
        where = f"{error.filename}: " if error.filename else ""
        print(f"attn: error: {where}{error.strerror or error}; check the path and its permissions", file=sys.stderr)
        return 1
    except KeyboardInterrupt as error:  # Ctrl-C, or TrainingInterrupted from a quickstart step
        print(f"attn: {error or 'interrupted'}", file=sys.stderr)
        return getattr(error, "exit_code", 130)
    except Exception as error:  # a fault of attn or of a library under it, not the user's
        if os.environ.get("ATTN_DEBUG") == "1":
            traceback.print_exc()
        else:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            print(f"attn: internal error ({type(error).__name__}{': ' if reason else ''}{reason}); run it again "
                  "with ATTN_DEBUG=1 to see the traceback", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
