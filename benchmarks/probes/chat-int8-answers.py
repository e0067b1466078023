"""What int8 costs SmolLM2-135M-Instruct's answers in attn and in CTranslate2, on the same prompts.

The 20 chat prompts of `benchmarks.chat_model`, greedy, at most 24 new tokens, stopping at the end of the turn
(as `benchmarks.quantized` asks): attn with float32, int8 (weight-only) and int8-dynamic (activations quantized
per token, as CTranslate2's int8 does) weights, and CTranslate2 float32 and int8 on attn's export of the same
model. Each answer is compared with attn float32's: identical or not, and the share of its tokens before the
first difference. 2 threads; needs `ctranslate2`.

    python benchmarks/probes/chat-int8-answers.py benchmarks/results/quantized-quality/chat-int8-answers.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from attn import GenerationConfig, generate, load_model
from attn.artifacts.pretrained import export_pretrained
from benchmarks import chat_model
from benchmarks.engines import CT2_TYPES, _ct2_convert, _ct2_vocabulary, agreement
from benchmarks.harness import device_name, git_commit

NEW_TOKENS = 24
THREADS = 2


def attn_answers(prompts: list[list[int]], scheme: str | None) -> list[list[int]]:
    bundle = load_model(chat_model.gguf_path(), "cpu", quantize=scheme)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    return [generate(bundle.model, [prompt], config, eos_id=bundle.eos_id)[0] for prompt in prompts]


def ct2_answers(folder: Path, prompts: list[list[int]], eos: int) -> list[list[int]]:
    import ctranslate2

    words = _ct2_vocabulary(folder)
    generator = ctranslate2.Generator(str(folder), device="cpu", inter_threads=1, intra_threads=THREADS,
                                      compute_type=CT2_TYPES[folder.name.removeprefix("ct2-")])
    results = generator.generate_batch([[words[i] for i in p] for p in prompts], max_length=NEW_TOKENS,
                                       include_prompt_in_result=False, sampling_topk=1, end_token=words[eos])
    return [[t for t in result.sequences_ids[0] if t != eos] for result in results]


def main(out: Path) -> None:
    import ctranslate2

    torch.set_num_threads(THREADS)
    bundle = load_model(chat_model.gguf_path(), "cpu")
    eos = bundle.eos_id
    prompts = [bundle.tokenizer.encode(bundle.render_chat([{"role": "user", "content": q}]))
               for q in chat_model.QUESTIONS]
    answers = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        export_pretrained(bundle.model, bundle.model_config, folder / "hf", "llama", tokenizer=bundle.tokenizer)
        for kind in CT2_TYPES:
            answers[f"CTranslate2 {kind}"] = ct2_answers(_ct2_convert(folder / "hf", kind), prompts, eos)
    for scheme in (None, "int8", "int8-dynamic"):
        answers[f"attn {scheme or 'fp32'}"] = attn_answers(prompts, scheme)
    reference = answers["attn fp32"]
    record = {
        "command": f"python benchmarks/probes/chat-int8-answers.py {out}",
        "commit": git_commit(),
        "machine": {"device": device_name(torch.device("cpu")), "threads": THREADS, "torch": torch.__version__,
                    "ctranslate2": ctranslate2.__version__},
        "prompts": len(prompts), "new_tokens": NEW_TOKENS,
        "against_attn_fp32": {name: agreement(reference, rows) for name, rows in answers.items()},
        "first_answer": {name: bundle.tokenizer.decode(rows[0]) for name, rows in answers.items()},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(record, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
