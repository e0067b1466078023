"""The weight-reading floor of one decode step of SmolLM2-135M-Instruct, beside the whole steps, at batch 1 and 8.

Times (median of 20, 2 threads), for each batch: the products of every weight matrix of the model
with that many rows, through `F.linear` (MKL, what transformers runs) and `attn.core.linear.linear` (oneDNN,
what attn runs), attn's `decode_step` of one token per row after a chat prompt, and transformers' forward
of one token per row with its KV cache, both on the same GGUF file. Also the time to sum every weight
once (2 threads): the rate at which this machine reads them, the floor of any float32 kernel. Then, at
batch 1, for each of attn's weight schemes (`attn.core.quantized`: int8, int8-dynamic, int4), the products of
every quantized layer alone (each layer's own kernel) and the quantized model's decode step. Writes the
JSON to the path given (with the commit and machine).

    python benchmarks/probes/decode-floor.py benchmarks/results/chat-model-cpu/decode-floor.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers

import attn
from attn.core.linear import linear
from attn.core.quantized import Int4Linear, QuantizedLinear, quantize
from benchmarks.chat_model import gguf_path
from benchmarks.harness import device_name, git_commit


def median_ms(step, repetitions: int = 20) -> float:
    step()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main(out: str) -> None:
    torch.set_num_threads(2)
    path = gguf_path()
    bundle = attn.load_model(path, "cpu")
    model = bundle.model
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    ids = bundle.tokenizer.encode(bundle.render_chat([{"role": "user", "content": "What is the capital of France?"}]))
    result = {
        "command": "python benchmarks/probes/decode-floor.py " + out, "commit": git_commit(),
        "device": device_name(torch.device("cpu")), "torch": torch.__version__,
        "transformers": transformers.__version__, "threads": torch.get_num_threads(),
    }
    with torch.inference_mode():
        weights = [p for p in model.parameters() if p.dim() == 2]
        result["weight_megabytes"] = sum(w.numel() for w in weights) * 4 / 1e6
        result["read_all_weights_ms"] = median_ms(lambda: [w.sum() for w in weights])
        for batch in (1, 8):
            result[f"batch_{batch}"] = _steps(model, hf, weights, ids, batch)
        del model, hf, bundle
        for scheme in ("int8", "int8-dynamic", "int4"):
            result[f"batch_1_{scheme}"] = _quantized(quantize(attn.load_model(path, "cpu").model, scheme), ids)
    Path(out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


def _decode_step(model: torch.nn.Module, ids: list[int], batch: int):
    """attn's decode step of one token per row after `batch` rows of the prompt `ids`, repeatable."""
    cache = model.new_cache(batch, len(ids) + 64)
    model.decode_step(torch.tensor([ids] * batch), cache)
    one = torch.full((batch, 1), 5)

    def step() -> None:
        cache.start = cache.length = len(ids)
        model.decode_step(one, cache)

    return step


def _quantized(model: torch.nn.Module, ids: list[int]) -> dict[str, float]:
    """One row's products with every quantized layer, each through its own kernel, and the model's decode step."""
    layers = [m for m in model.modules() if isinstance(m, (QuantizedLinear, Int4Linear))]
    inputs = {m.in_features: torch.randn(1, m.in_features) for m in layers}
    return {"layers": len(layers), "products_ms": median_ms(lambda: [m(inputs[m.in_features]) for m in layers]),
            "attn_decode_step_ms": median_ms(_decode_step(model, ids, 1))}


def _steps(model: torch.nn.Module, hf: torch.nn.Module, weights: list[torch.Tensor], ids: list[int],
           batch: int) -> dict[str, float]:
    """The products with every weight and both models' decode steps, `batch` rows of the same prompt."""
    inputs = {w.shape[1]: torch.randn(batch, w.shape[1]) for w in weights}
    prompt, one = torch.tensor([ids] * batch), torch.full((batch, 1), 5)
    past = hf(prompt, use_cache=True).past_key_values
    position = [len(ids)]

    def theirs() -> None:
        hf(one, past_key_values=past, use_cache=True, cache_position=torch.tensor(position))
        past.crop(-1)  # back to the prompt, as attn's step above

    return {
        "mkl_matmul_floor_ms": median_ms(lambda: [F.linear(inputs[w.shape[1]], w) for w in weights]),
        "onednn_matmul_floor_ms": median_ms(lambda: [linear(inputs[w.shape[1]], w, None) for w in weights]),
        "attn_decode_step_ms": median_ms(_decode_step(model, ids, batch)), "hf_forward_step_ms": median_ms(theirs),
    }


if __name__ == "__main__":
    main(sys.argv[1])
