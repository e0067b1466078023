"""The weight-reading floor of one batch-1 decode step of SmolLM2-135M-Instruct, beside the whole steps.

Times (median of 20, 2 threads): the matrix-vector products of every weight matrix of the model (what
reading the fp32 weights once costs), attn's `decode_step` of one token after a chat prompt, and
transformers' forward of one token with its KV cache, both on the same GGUF file. Writes the JSON to
the path given (with the commit and machine).

    python benchmarks/probes/decode-floor.py benchmarks/results/chat-model-cpu/decode-floor.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

import attn
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
    prompt, one = torch.tensor([ids]), torch.tensor([[5]])
    with torch.inference_mode():
        weights = [p for p in model.parameters() if p.dim() == 2]
        inputs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
        floor = median_ms(lambda: [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights])
        cache = model.new_cache(1, len(ids) + 64)
        model.decode_step(prompt, cache)

        def ours() -> None:
            cache.start = cache.length = len(ids)
            model.decode_step(one, cache)

        past = hf(prompt, use_cache=True).past_key_values
        position = [len(ids)]

        def theirs() -> None:
            hf(one, past_key_values=past, use_cache=True, cache_position=torch.tensor(position))
            past.crop(-1)  # back to the prompt, as attn's step above

        result = {
            "command": "python benchmarks/probes/decode-floor.py " + out, "commit": git_commit(),
            "device": device_name(torch.device("cpu")), "torch": torch.__version__,
            "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "weight_megabytes": sum(w.numel() for w in weights) * 4 / 1e6,
            "matvec_floor_ms": floor, "attn_decode_step_ms": median_ms(ours), "hf_forward_step_ms": median_ms(theirs),
        }
    Path(out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
