"""The `attn` command line: thin argument parsing over importable functions.

A user's mistake (an `AttnError`) is printed on one line and exits with status 2 for usage
errors and 1 otherwise; no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from attn import __version__
from attn.config import preset, preset_names
from attn.errors import AttnError, ConfigError
from attn.models import build_model, count_parameters


def presets_table() -> list[dict[str, object]]:
    """One row per preset: its shape and parameter count (built on the meta device, no memory used)."""
    rows = []
    for name in preset_names():
        cfg = preset(name)
        with torch.device("meta"):
            params = count_parameters(build_model(cfg))
        rows.append({
            "name": name,
            "architecture": cfg.architecture.value,
            "layers": f"{cfg.encoder_layers}+{cfg.decoder_layers}",
            "d_model": cfg.d_model,
            "heads": cfg.heads,
            "d_ff": cfg.d_ff,
            "vocab": cfg.vocab_size,
            "positional": cfg.positional.value,
            "norm": cfg.norm.value,
            "parameters": params,
        })
    return rows


def _format_count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def cmd_presets(args: argparse.Namespace) -> int:
    rows = presets_table()
    if args.json:
        import json

        print(json.dumps(rows, indent=2))
        return 0
    columns = ["name", "architecture", "layers", "d_model", "heads", "d_ff", "vocab", "positional", "norm", "parameters"]
    cells = [[_format_count(r[c]) if c == "parameters" else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attn",
        description="Train, evaluate and use Transformer models (encoder-decoder, encoder-only, decoder-only).",
    )
    parser.add_argument("--version", action="version", version=f"attn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser(
        "presets",
        help="list the model presets with their sizes and parameter counts",
        description="List the named model presets.\n\nexample:\n  attn presets --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_presets)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as error:
        print(f"attn: error: {error}", file=sys.stderr)
        return 2
    except AttnError as error:
        print(f"attn: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
