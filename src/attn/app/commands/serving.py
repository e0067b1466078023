"""`attn serve`: the models over HTTP (`attn.app.serve`), its flags the server's options."""

from __future__ import annotations

import argparse

from attn.app.commands.flags import dtype_flag, quantize_flag, subcommand
from attn.decoding import DEFAULT_PREFIX_CACHE_BYTES
from attn.app.serve import (
    ServeOptions,
    api_keys,
    listen,
    load_served_models,
    run_server,
)


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = subcommand(sub, "serve", cmd_serve, "serve models over HTTP (completions, translation, embeddings, "
                   "classification, attention; a page at /)", "attn serve --model runs/quickstart/translation "
                   "--model lm=runs/quickstart/shakespeare --port 8000")
    p.add_argument("--model", "-m", action="append", required=True, metavar="[NAME=]DIR",
                   help="a model to serve, named NAME or after its folder (repeatable); DIR may be a Hugging Face Hub "
                   "model, ORG/NAME or ORG/NAME:QUANT")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=DIR",
                   help="a LoRA adapter (PEFT's format: adapter_config.json, adapter_model.safetensors) served as the "
                   "model NAME beside its base, which keeps one copy of its weights (repeatable); the base is the "
                   "one language model of --model, or the one the adapter's base_model_name_or_path names")
    p.add_argument("--device", default="auto", help="where the models run: auto, cpu, cuda or cuda:N")
    quantize_flag(p)
    dtype_flag(p)
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
    p.add_argument("--prefix-cache-bytes", dest="prefix_cache_bytes", type=int, default=DEFAULT_PREFIX_CACHE_BYTES,
                   metavar="N", help="the most bytes of keys and values each model keeps of finished answers, so a "
                   "prompt that starts as an earlier prompt and answer did (the next turn of a chat) feeds only the "
                   "rest; least recently used dropped first (default: 1 GiB; 0: none kept)")
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


def cmd_serve(args: argparse.Namespace) -> int:
    options = ServeOptions(args.host, args.port, args.max_body_bytes, args.max_queue, args.batching,
                           args.max_batch_tokens, api_keys(args.api_key_file), args.insecure_no_key,
                           args.request_timeout, args.max_tokens_cap, args.max_n, args.max_concurrent_per_key,
                           tuple(args.cors_origins), prefix_cache_bytes=args.prefix_cache_bytes)
    bound = listen(options)  # before the models load: a port in use is said at once
    run_server(load_served_models(args.model, args.device, args.quantize, args.dtype, args.lora), options, bound)
    return 0
