"""The Llama family on a GPU: parity with transformers there, and greedy decoding speed beside `generate`.

For each preset named (default: smollm2-135m, qwen2.5-0.5b, llama-3.2-1b), a model with seeded random weights and
transformers' twin of it (`peers.twins`, the same weights through `export_pretrained`), on the device:
- parity in float32: the largest difference of the logits over 4 prompts of 48 tokens, and whether 32 greedy
  tokens of each are the same;
- speed in bfloat16 (both models' weights in bf16): greedy decoding of a 32-token random prompt, 128 new tokens
  (no EOS), batch 1 and 8, tokens/s, median of 5 after 2 warm-up rounds, the contenders alternated.
Writes the JSON (with the commit, machine and versions) to the path given.

    python benchmarks/probes/gpu-llama.py OUT.json [--device cuda] [--presets a,b] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import transformers

from attn.artifacts.pretrained import SpecialIds
from attn.decoding import GenerationConfig, generate
from attn.core.presets import preset
from benchmarks.harness import device_name, git_commit
from benchmarks.peers import quiet_transformers, twins

FAMILY = {"smollm2-135m": "llama", "llama-3.2-1b": "llama", "qwen2.5-0.5b": "qwen2"}
PROMPT, NEW, PARITY_NEW = 32, 128, 32


def timed(step, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def prompts(batch: int, length: int, vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(batch))


def hf_greedy(hf, ids: torch.Tensor, new: int) -> list[list[int]]:
    out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                      do_sample=False, num_beams=1, pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def parity(ours, hf, device: torch.device) -> dict:
    ids = prompts(4, 48, ours.lm_head.out_features).to(device)
    with torch.no_grad():
        difference = (ours(ids).float() - hf(input_ids=ids).logits.float()).abs().max().item()
    mine = generate(ours, ids.tolist(), GenerationConfig(max_new_tokens=PARITY_NEW))
    return {"max |logit difference| fp32": difference,
            "greedy tokens identical": mine == hf_greedy(hf, ids, PARITY_NEW)}


def speed(ours, hf, device: torch.device, batch: int, new: int, warmup: int, reps: int) -> dict:
    ids = prompts(batch, PROMPT, ours.lm_head.out_features)
    config = GenerationConfig(max_new_tokens=new)
    on_device = ids.to(device)
    steps = {"attn": lambda: generate(ours, ids.tolist(), config), "transformers": lambda: hf_greedy(hf, on_device, new)}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(warmup + reps):
        for name, step in steps.items():
            seconds = timed(step, device)
            if round_ >= warmup:
                times[name].append(seconds)
    rates = {name: batch * new / statistics.median(values) for name, values in times.items()}
    agree = generate(ours, ids.tolist(), config) == hf_greedy(hf, on_device, new)
    return {"tokens/s": rates, "ratio attn / transformers": rates["attn"] / rates["transformers"],
            "greedy tokens identical (bf16)": agree}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--presets", default=",".join(FAMILY))
    parser.add_argument("--quick", action="store_true", help="tiny variants: a smoke run")
    args = parser.parse_args()
    device = torch.device(args.device)
    quiet_transformers()
    new, warmup, reps = (8, 1, 2) if args.quick else (NEW, 2, 5)
    results = {"device": device_name(device), "commit": git_commit(), "torch": torch.__version__,
               "transformers": transformers.__version__, "prompt": PROMPT, "new tokens": new, "presets": {}}
    for name in args.presets.split(","):
        config = preset(name)
        if args.quick:
            config = config.replace(d_model=64, d_ff=128, heads=4, kv_heads=2, head_size=0, decoder_layers=2,
                                    vocab_size=256)
        torch.manual_seed(0)
        family = FAMILY[name]
        ours, hf = twins(config, family, f"{family.capitalize()}ForCausalLM", SpecialIds())
        entry = {"parameters": sum(p.numel() for p in ours.parameters())}
        ours, hf = ours.to(device), hf.to(device)
        entry["parity"] = parity(ours, hf, device)
        ours, hf = ours.to(torch.bfloat16), hf.to(torch.bfloat16)
        entry["bf16"] = {f"B={batch}": speed(ours, hf, device, batch, new, warmup, reps) for batch in (1, 8)}
        results["presets"][name] = entry
        print(name, json.dumps(entry), flush=True)
        del ours, hf
        if device.type == "cuda":
            torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
