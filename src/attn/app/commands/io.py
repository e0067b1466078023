"""How the `attn` commands read their inputs and write their outputs, and name a flag in a library's error."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from attn.core.errors import AttnError, ConfigError, GenerationError
from attn.data.text import decode_text, read_text
from attn.decoding import GenerationConfig, requested
from attn.decoding.grammar import Grammar
from attn.decoding.session import check_logit_bias

# flag -> (its argparse name, the grammar's kind, whether it names a file)
_GRAMMAR_FLAGS = {"--json-schema": ("json_schema", "json_schema", True), "--regex": ("regex", "regex", False),
                  "--grammar": ("grammar", "lark", True)}


def print_table(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> None:
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


def read_inputs(args: argparse.Namespace) -> list[str]:
    """The texts of a command: positional arguments, else --input FILE, else standard input."""
    if args.text:
        return list(args.text)
    text = read_text(args.input) if args.input else decode_text(sys.stdin.buffer.read(), "<stdin>")
    return [line for line in text.splitlines() if line.strip()]


def write_lines(lines: Sequence[str], output: str | None) -> None:
    if output:
        text = "".join(f"{line}\n" for line in lines)
        write_output(output, lambda path: path.write_text(text, encoding="utf-8"))
    else:
        for line in lines:
            print(line)


def write_output(output: str, write: Callable[[Path], object]) -> None:
    """Writes a file through a hidden sibling renamed into place, so a failed write leaves no partial file.

    Raises AttnError when the file cannot be written.
    """
    path = Path(output)
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        write(partial)
        os.replace(partial, path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise AttnError(f"{output}: cannot write the output ({err.strerror}); give a file path in an existing, "
                        "writable directory") from err


def generation_config(args: argparse.Namespace, limit_flag: str = "--max-new-tokens",
                      **defaults: object) -> GenerationConfig:
    """The decoding settings a command's flags ask for (--temperature above 0 samples, and a command's default
    beam search gives way to it), with the command's `defaults` for the flags not given.

    Raises:
        ConfigError: a setting out of range, naming its flag (`limit_flag` for the token limit).
    """
    sampled = bool(getattr(args, "temperature", None))
    fields = {k: v for k, v in defaults.items() if not (sampled and k in ("beam_size", "length_penalty"))}
    for name in ("beam_size", "length_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens", "seed",
                 "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "no_repeat_ngram",
                 "n_best", "stop"):
        value = getattr(args, name, None)
        if value is not None:
            fields[name] = value
    try:
        return requested(**fields, grammar=grammar_of(args))
    except GenerationError as error:
        raise flag_error(error, {"sample": "--temperature", "max_new_tokens": limit_flag}) from None


def grammar_of(args: argparse.Namespace) -> Grammar | None:
    """The grammar that --json-schema, --regex or --grammar gives, read and checked; None without one.

    Raises:
        ConfigError: a file that cannot be read, or a schema or grammar that llguidance rejects, naming the flag.
    """
    for flag, (name, kind, from_file) in _GRAMMAR_FLAGS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        try:
            return Grammar(kind, read_text(value) if from_file else value)
        except AttnError as error:
            raise ConfigError(flag, error.detail) from None
    return None


def check_bias_ids(model: object, config: GenerationConfig) -> None:
    """Raises a ConfigError naming --logit-bias when it biases an id outside the model's vocabulary."""
    try:
        check_logit_bias(model, config)
    except GenerationError as error:
        raise flag_error(error) from None


def flag_error(error: AttnError, flags: dict[str, str] | None = None) -> AttnError:
    """A library's error about one of its arguments as a usage error that names the command-line flag
    (`flags` maps the arguments whose flag is not --NAME); an error about no argument as it is."""
    if error.field is None:
        return error
    return ConfigError((flags or {}).get(error.field, f"--{error.field.replace('_', '-')}"), error.detail)
