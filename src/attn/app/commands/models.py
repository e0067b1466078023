"""The commands about models and their parts: `attn convert` (Hugging Face directories in and out), `presets`
and `tokenizer` (`train`, `encode`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attn.app.commands.flags import subcommand
from attn.app.commands.io import flag_error, print_table
from attn.artifacts import load_model, save_model
from attn.artifacts.pretrained import FAMILIES, export_pretrained
from attn.artifacts.pretrained.gguf_export import QUANTIZATIONS, export_gguf
from attn.core.errors import CheckpointError, ConfigError
from attn.core.lora import merge_lora
from attn.core.presets import preset, preset_names
from attn.core.quantized import Quantization
from attn.data.tokenizer_kinds import TRAINED_KINDS
from attn.data.tokenizer_training import train_tokenizer_files
from attn.data.tokenizers import Tokenizer
from attn.models import build_model, count_parameters


def add_convert_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "convert", cmd_convert, "import a Hugging Face directory (GPT-2, BERT, Marian, Llama and its "
                   "kin), or export one", "attn convert --to attn hf_gpt2_dir my_checkpoint")
    p.add_argument("source", help="the directory (or GGUF file) to convert")
    p.add_argument("output", help="the directory to write (--to gguf: the .gguf file)")
    p.add_argument("--to", required=True, choices=["attn", "gguf", *FAMILIES],
                   help="'attn' imports a Hugging Face directory; a family name exports an attn checkpoint; 'gguf' "
                   "writes a decoder as a llama.cpp GGUF file")
    p.add_argument("--quantize", choices=[*(q.value for q in Quantization), *QUANTIZATIONS],
                   help=f"--to attn: {', '.join(q.value for q in Quantization)} weights (see attn generate "
                   f"--quantize); --to gguf: the GGUF type, {', '.join(QUANTIZATIONS)} (default f32; q4_k_m mixes "
                   "Q4_K and Q6_K blocks as llama.cpp's Q4_K_M does)")


def cmd_convert(args: argparse.Namespace) -> int:
    if args.to == "gguf":
        return _convert_to_gguf(args)
    if args.quantize in QUANTIZATIONS:
        raise ConfigError("--quantize", f"{args.quantize} is a GGUF type: use it with --to gguf; attn checkpoints "
                                        f"hold {', '.join(q.value for q in Quantization)} weights")
    if args.quantize is not None and args.to != "attn":
        raise ConfigError("--quantize", f"{args.to} directories hold float weights: convert --to attn to store "
                                        f"{args.quantize} weights")
    bundle = load_model(args.source, "cpu", require_tokenizer=False, quantize=args.quantize, dequantize=True)
    merge_lora(bundle.model)  # a LoRA run converts as its base with the adapters folded in
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


def _convert_to_gguf(args: argparse.Namespace) -> int:
    quantize = args.quantize or "f32"
    if quantize not in QUANTIZATIONS:
        raise ConfigError("--quantize", f"GGUF files hold {', '.join(QUANTIZATIONS)} weights, not {quantize}")
    bundle = load_model(args.source, "cpu", require_tokenizer=False, dequantize=True)
    end_of_turn = next((i for i in bundle.stop_ids if i != bundle.eos_id), None)
    out = export_gguf(bundle.model, bundle.model_config, args.output, bundle.tokenizer, quantize=quantize,
                      chat_template=bundle.chat_template, eot_id=end_of_turn, name=Path(args.source).stem,
                      family=bundle.imported.family if bundle.imported is not None else None)
    print(f"exported {args.source} as a {quantize} GGUF file: {out}")
    return 0


def add_presets_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "presets", cmd_presets, "list the model presets with their sizes and parameter counts",
                   "attn presets --json")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def cmd_presets(args: argparse.Namespace) -> int:
    rows = presets_table()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    shown = [{**r, "parameters": _format_count(int(r["parameters"]))} for r in rows]
    print_table(shown, ["name", "architecture", "layers", "d_model", "heads", "d_ff", "vocab", "positional", "norm",
                        "parameters"])
    return 0


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


def add_tokenizer_parsers(sub: argparse._SubParsersAction) -> None:
    """`attn tokenizer` and its verbs, `train` and `encode`."""
    group = sub.add_parser("tokenizer", help="train a tokenizer on text files, or show how one encodes a text",
                           description="train a tokenizer on text files (into a directory that a run config's "
                           "tokenizer.path loads), or show how one encodes a text")
    verbs = group.add_subparsers(dest="tokenizer_command", metavar="VERB", required=True)
    p = subcommand(verbs, "train", cmd_tokenizer_train, "train a tokenizer on text files, one text per line",
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
    p = subcommand(verbs, "encode", cmd_tokenizer_encode, "print the tokens and ids of texts",
                   'attn tokenizer encode --tokenizer tok/ "To be, or not to be"')
    p.add_argument("--tokenizer", "-t", required=True,
                   help="a tokenizer directory, a Hugging Face tokenizer.json or a SentencePiece .model file")
    p.add_argument("text", nargs="+", help="the texts")
    p.add_argument("--add-special", dest="add_special", action="store_true", help="add the tokenizer's frame")


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
