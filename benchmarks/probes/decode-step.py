"""Greedy decoding tokens/s of a randomly initialised gpt2 (124M) at batch 1 and 4, 48 new tokens after 16,
2 threads: the library of the tree on PYTHONPATH, the median of 5 timed calls, printed as JSON.

    PYTHONPATH=TREE/src python benchmarks/probes/decode-step.py
"""
import json
import statistics
import time

import torch

from attn import GenerationConfig, build_model, generate, preset

torch.set_num_threads(2)
out = {}
for batch in (1, 4):
    torch.manual_seed(0)
    model = build_model(preset("gpt2").replace(dropout=0.0)).eval()
    prompts = [list(range(100 + i, 116 + i)) for i in range(batch)]
    config = GenerationConfig(max_new_tokens=48)
    generate(model, prompts, config)
    times = []
    for _ in range(5):
        s = time.perf_counter(); generate(model, prompts, config); times.append(time.perf_counter() - s)
    out[f"gpt2 batch {batch}"] = 48 * batch / statistics.median(times)
print(json.dumps(out))
