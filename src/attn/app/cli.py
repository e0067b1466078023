"""The `attn` command line: the parser put together from the commands of `attn.app.commands`, and `main`.

A user's mistake (an `AttnError`) is printed on one line; configuration and usage errors exit with status 2,
other errors with 1; no traceback. An unexpected error is one line too, exit 1, unless ATTN_DEBUG=1 asks for its
traceback. The commands that train or serve keep freed CPU memory (`KEEPS_MEMORY`) unless ATTN_KEEP_MEMORY=0.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from attn import __version__
from attn.app.allocator import keep_freed_memory
from attn.app.commands.flags import check_text_arguments
from attn.app.commands.inference import (
    add_attention_parser,
    add_chat_parser,
    add_classify_parser,
    add_embed_parser,
    add_generate_parser,
    add_translate_parser,
)
from attn.app.commands.models import (
    add_convert_parser,
    add_presets_parser,
    add_tokenizer_parsers,
)
from attn.app.commands.serving import add_serve_parser
from attn.app.commands.training import (
    add_average_parser,
    add_evaluate_parser,
    add_plot_parser,
    add_quickstart_parser,
    add_train_parser,
)
from attn.core.errors import AttnError, ConfigError

# The commands in the order `attn --help` lists them.
COMMANDS = (
    add_quickstart_parser, add_train_parser, add_evaluate_parser, add_translate_parser, add_generate_parser,
    add_chat_parser, add_classify_parser, add_embed_parser, add_convert_parser, add_average_parser, add_plot_parser,
    add_attention_parser, add_serve_parser, add_tokenizer_parsers, add_presets_parser,
)

# The commands that run training or serving steps, which allocate and free the same large tensors
# every step: they keep freed memory for the next (`attn.app.allocator`).
KEEPS_MEMORY = ("train", "quickstart", "serve")


def build_parser() -> argparse.ArgumentParser:
    """The parser of `attn`, whose commands run their `cmd_` functions (`args.func`)."""
    parser = argparse.ArgumentParser(
        prog="attn", description="Train, evaluate and use Transformer models (encoder-decoder, encoder-only, "
        "decoder-only) on the shipped corpora or your own.",
        epilog="environment: ATTN_DEBUG=1 shows the traceback of an unexpected error; ATTN_KEEP_MEMORY=0 has train, "
        "quickstart and serve give freed CPU memory back to the system (glibc's malloc) instead of keeping it for "
        "the next step")
    parser.add_argument("--version", action="version", version=f"attn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_command in COMMANDS:
        add_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command != "train" or any(item.startswith("-") for item in extra)):
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
