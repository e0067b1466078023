"""What structured output costs a decode step, and how often its answers are valid: SmolLM2-135M-Instruct decoding
the same rows with and without a JSON schema each (llguidance's token masks, `attn.decoding.grammar`).

    python -m benchmarks.structured_output             # SmolLM2-135M-Instruct, batch 1 and 8, 3 repetitions
    python -m benchmarks.structured_output --quick     # a tiny random model, 16 new tokens, 1 repetition: it runs

Each row is a chat question with its own schema of `SCHEMAS` (nested objects, arrays, enums, bounded numbers,
optional fields, string patterns), answered greedily in one `RunningBatch` of `--batch` rows. The constrained run
goes first; each row then decodes again without its grammar for exactly as many tokens as it made with it (no end
token, so the two runs step the same batch through the same lengths), and the difference of their times per
decode step is what the masks added. The two runs take turns, `--reps` times. Validity: the share of constrained
answers that end with their grammar (not at the limit) and that jsonschema-rs finds valid under their schema.

Results: `--out` (default benchmarks/results/structured-output/)<date>.json and .md, with the command, the commit,
the machine and its load (`uptime`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema_rs
import torch

from attn.artifacts import Bundle, load_model
from attn.core.presets import preset
from attn.data.grammar_tokens import grammar_matchers
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig, RunningBatch
from attn.decoding.grammar import Grammar
from attn.models import build_model
from benchmarks.chat_model import gguf_path
from benchmarks.harness import RESULTS_DIR, script_record, write_record
from benchmarks.serving_load import uptime

_NAME = {"type": "string", "maxLength": 16}
SCHEMAS = [
    ("Describe Paris as JSON.", {"type": "object", "additionalProperties": False, "required": ["name", "country"],
                                 "properties": {"name": _NAME, "country": _NAME}}),
    ("Give me a colour as JSON.", {"type": "object", "additionalProperties": False, "required": ["colour", "hex"],
                                   "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                                  "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}}),
    ("Describe a person as JSON.", {"type": "object", "additionalProperties": False, "required": ["name", "age"],
                                    "properties": {"name": _NAME, "age": {"type": "integer", "minimum": 0,
                                                                          "maximum": 120},
                                                   "nickname": _NAME}}),
    ("List three fruits as JSON.", {"type": "object", "additionalProperties": False, "required": ["fruits"],
                                    "properties": {"fruits": {"type": "array", "items": _NAME, "maxItems": 3}}}),
    ("Rate a film from 0 to 1 as JSON.", {"type": "object", "additionalProperties": False, "required": ["score"],
                                          "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1},
                                                         "liked": {"type": "boolean"}}}),
    ("Plan a trip as JSON.", {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                              "properties": {"city": {"type": "object", "additionalProperties": False,
                                                      "required": ["name"], "properties": {"name": _NAME}},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 9}}}),
    ("Give a flight code as JSON.", {"type": "object", "additionalProperties": False, "required": ["code"],
                                     "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}}),
    ("Is the sky blue? Answer as JSON.", {"type": "object", "additionalProperties": False, "required": ["answer"],
                                          "properties": {"answer": {"enum": ["yes", "no"]},
                                                         "why": {"type": "string", "maxLength": 24}}}),
]
TINY_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"


def tiny_bundle() -> Bundle:
    """A seeded random model over a byte-level BPE tokenizer (one llguidance reads), with a plain template."""
    tokenizer = Tokenizer.train_bpe([question for question, _ in SCHEMAS] * 4, 300, byte_level=True)
    config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0, max_positions=512)
    torch.manual_seed(0)
    return Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task="lm", model_config=config,
                  path=Path("tiny"), chat_template=TINY_TEMPLATE)


@dataclasses.dataclass
class Decoded:
    seconds: float
    steps: int
    tokens: list[list[int]]
    finishes: list[str]


def decode(bundle: Bundle, prompts: list[list[int]], configs: list[GenerationConfig]) -> Decoded:
    """Every row decoded together; the time of the decode steps (the prefill apart), and each row's tokens."""
    batch = RunningBatch(bundle.model, None, bundle.tokenizer.decode, grammar_matchers(bundle.tokenizer))
    for key, (prompt, config) in enumerate(zip(prompts, configs)):
        batch.add(key, prompt, config)
    batch.prefill()
    tokens: list[list[int]] = [[] for _ in prompts]
    finishes = [""] * len(prompts)
    steps, start = 0, time.perf_counter()
    while len(batch):
        for step in batch.step():
            tokens[step.key].append(step.token)
            finishes[step.key] = step.finish or ""
        steps += 1
    return Decoded(time.perf_counter() - start, steps, tokens, finishes)


def valid(text: str, schema: dict[str, Any]) -> bool:
    try:
        return jsonschema_rs.is_valid(schema, json.loads(text))
    except json.JSONDecodeError:
        return False


def run(bundle: Bundle, batch: int, new_tokens: int, reps: int) -> dict[str, Any]:
    """Both runs of `batch` rows, `reps` times in turn; per-step times, the masks' share and the validity."""
    asked = [SCHEMAS[i % len(SCHEMAS)] for i in range(batch)]
    prompts = [bundle.tokenizer.encode(bundle.render_chat([{"role": "user", "content": q}])) for q, _ in asked]
    grammars = [GenerationConfig(max_new_tokens=new_tokens, grammar=Grammar("json_schema", json.dumps(schema)))
                for _, schema in asked]
    decode(bundle, prompts, grammars)  # warm-up: llguidance reads the vocabulary, the weights are packed
    timings: dict[str, list[float]] = {"grammar": [], "plain": []}
    for _ in range(reps):
        constrained = decode(bundle, prompts, grammars)
        plain = decode(bundle, prompts, [GenerationConfig(max_new_tokens=len(t)) for t in constrained.tokens])
        timings["grammar"].append(constrained.seconds / constrained.steps * 1e3)
        timings["plain"].append(plain.seconds / plain.steps * 1e3)
    texts = [bundle.tokenizer.decode(tokens) for tokens in constrained.tokens]
    ok = [finish == "stop" and valid(text, schema) for text, finish, (_, schema)
          in zip(texts, constrained.finishes, asked)]
    median = {name: statistics.median(values) for name, values in timings.items()}
    return {"batch": batch, "ms_per_step": timings, "median_ms_per_step": median,
            "added_ms_per_step": median["grammar"] - median["plain"], "steps": constrained.steps,
            "valid": sum(ok) / len(ok), "answers": texts}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny random model, 16 new tokens, 1 repetition")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="rows decoded together (default 1 8)")
    parser.add_argument("--new-tokens", type=int, help="the most new tokens of an answer (default 96; 16 --quick)")
    parser.add_argument("--reps", type=int, help="timed repetitions of each run (default 3; 1 with --quick)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "structured-output",
                        help="the folder of the result files")
    args = parser.parse_args(argv)
    args.new_tokens = args.new_tokens or (16 if args.quick else 96)
    args.reps = args.reps or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs each batch size, writes the result files and prints the table."""
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = tiny_bundle() if args.quick else load_model(gguf_path(), "cpu")
    record = script_record("structured_output", argv, "tiny random model" if args.quick else str(gguf_path()),
                           {"new_tokens": args.new_tokens, "reps": args.reps})
    record["results"] = [run(bundle, batch, args.new_tokens, args.reps) for batch in args.batch]
    record["load_after"] = uptime()
    write_record(args.out, "-quick" if args.quick else "", record, markdown(record))
    return 0


def markdown(record: dict[str, Any]) -> str:
    where = (f"`{record['command']}` at {record['commit']} on {record['machine']}, torch {record['torch']}, "
             f"{record['threads']} thread(s); {record['model']}; at most {record['settings']['new_tokens']} new "
             f"tokens, {record['settings']['reps']} repetition(s)")
    lines = [f"# A JSON schema per row: the masks' time per decode step and the answers' validity ({record['date']})",
             "", where, "", f"load before: `{record['load_before']}`", f"load after: `{record['load_after']}`", "",
             "| batch | decode steps | ms/step with grammars | ms/step without | added ms/step | valid answers |",
             "|---|---|---|---|---|---|"]
    for found in record["results"]:
        median = found["median_ms_per_step"]
        lines.append(f"| {found['batch']} | {found['steps']} | {median['grammar']:.2f} | {median['plain']:.2f} | "
                     f"{found['added_ms_per_step']:.2f} | {found['valid']:.0%} |")
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    sys.exit(main())
