"""The flags that several `attn` commands share (a model to load, inputs and outputs, decoding), the
parser of one command with its example, and the check of the arguments that hold texts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from attn.artifacts.dtypes import CHOICES as DTYPES
from attn.core.quantized import Quantization
from attn.data.text import check_unicode

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


def subcommand(sub: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int], summary: str,
               example: str) -> argparse.ArgumentParser:
    """The parser of command `name`, which runs `run` (`args.func`); its help shows `summary` and `example`."""
    p = sub.add_parser(name, help=summary, description=f"{summary}\n\nexample:\n  {example}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=run)
    return p


def model_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--model", "-m", required=True,
                   help=f"{what}, or a Hugging Face Hub model: ORG/NAME, or ORG/NAME:QUANT for its GGUF file of that "
                   "quantization (from huggingface_hub's cache, downloaded when it lacks it unless HF_HUB_OFFLINE=1)")
    p.add_argument("--device", default="auto",
                   help="where the model runs: auto (the GPU when there is one), cpu, cuda or cuda:N")
    quantize_flag(p)
    dtype_flag(p)


def quantize_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantize", choices=[q.value for q in Quantization],
                   help="the weights in 8 bits (int8), 8 bits with each layer's input quantized per token too "
                   "(int8-dynamic: the fastest, less exact) or 4 bits (int4: linear layers in groups of 32); "
                   "smaller, on the CPU (--device cpu)")


def dtype_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="the dtype of the float weights (default float32); auto takes bfloat16 (float16 on a GPU "
                   "without it) where a decode step measured at load runs faster and the next-token distributions "
                   "stay close to float32's (ATTN_AUTO_PRECISION=bf16 or fp32 decides it on a CPU instead)")


def input_flags(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    p.add_argument("text", nargs="*", help="input texts (default: --input FILE, else standard input, one per line)")
    p.add_argument("--input", "-i", help="read inputs from this file, one per line")
    p.add_argument("--output", "-o", help="write outputs to this file instead of standard output")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON")


def decoding_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam-size", dest="beam_size", type=int, help="beam size (1 = greedy)")
    p.add_argument("--length-penalty", dest="length_penalty", type=float, help="GNMT length penalty alpha")
    sampling_flags(p)
    p.add_argument("--no-repeat-ngram", dest="no_repeat_ngram", type=int)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int,
                   help="most new tokens (default: translate source length + 50; generate 200, fewer when the "
                   "model's positions run out)")


def sampling_flags(p: argparse.ArgumentParser) -> None:
    """The flags of each token's choice, as OpenAI's and vLLM's settings of the same names mean them."""
    p.add_argument("--temperature", type=float,
                   help="0 (the default) decodes greedily; above 0 samples at that temperature")
    p.add_argument("--top-k", dest="top_k", type=int, help="keep the k most likely tokens (with --temperature)")
    p.add_argument("--top-p", dest="top_p", type=float, help="nucleus sampling mass in (0, 1] (with --temperature)")
    p.add_argument("--min-p", dest="min_p", type=float,
                   help="keep the tokens at least this times as likely as the most likely one, in [0, 1] "
                   "(with --temperature)")
    p.add_argument("--seed", type=int, help="seed of the sampler (with --temperature)")
    p.add_argument("--repetition-penalty", dest="repetition_penalty", type=float,
                   help="CTRL's penalty (> 0; 1 = off) on every token of the prompt and the answer so far")
    p.add_argument("--frequency-penalty", dest="frequency_penalty", type=float,
                   help="in [-2, 2]: each token's score less this times its count among the new tokens")
    p.add_argument("--presence-penalty", dest="presence_penalty", type=float,
                   help="in [-2, 2]: each token's score less this once it is among the new tokens")
    p.add_argument("--logit-bias", dest="logit_bias", action="append", type=_bias, metavar="ID=BIAS",
                   help="add BIAS (-100..100) to token ID's score before any other setting (repeatable)")


def grammar_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a grammar the answer follows (`attn.decoding.grammar`), one at most."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--json-schema", dest="json_schema", metavar="FILE",
                       help="answer with JSON valid under the JSON schema in FILE")
    group.add_argument("--regex", metavar="PATTERN", help="answer with text that matches PATTERN, whole")
    group.add_argument("--grammar", metavar="FILE",
                       help="answer with text of the Lark grammar in FILE (llguidance's dialect, which may embed "
                       "JSON schemas as %%json {...})")


def _bias(text: str) -> tuple[int, float]:
    """`ID=BIAS` as (token id, bias)."""
    token, _, bias = text.partition("=")
    try:
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not ID=BIAS; give a token id and a number, e.g. "
                                         "--logit-bias 42=-100") from None
