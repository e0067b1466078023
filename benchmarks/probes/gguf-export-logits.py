"""Where llama.cpp's next-token scores part from attn's: SmolLM2's own Q4_1 file, attn's Q8_0 and f32 exports of it.

For the first three chat questions of `benchmarks.chat_model`, the largest difference between llama.cpp's scores
(`llama-cpp-python`, all logits kept) and attn's (float32 from the file's blocks) after the prompt, both argmaxes
and attn's margin between its two best tokens. llama.cpp multiplies quantized blocks by activations it quantizes
too; in float32 it computes as attn does.

    PYTHONPATH=. /work/bench-venv/bin/python benchmarks/probes/gguf-export-logits.py \
        benchmarks/results/gguf-export/logits.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from llama_cpp import Llama

from attn import load_model
from attn.artifacts.pretrained.gguf_export import export_gguf
from benchmarks.chat_model import QUESTIONS, gguf_path


def main(out: Path) -> None:
    source = load_model(gguf_path(), "cpu", dequantize=True)
    prompts = [source.tokenizer.encode(source.render_chat([{"role": "user", "content": q}])) for q in QUESTIONS[:3]]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        files = {"SmolLM2 Q4_1 (its own file)": gguf_path()}
        for kind in ("q8_0", "f32"):
            files[f"attn's {kind} export"] = export_gguf(
                source.model, source.model_config, Path(scratch) / f"{kind}.gguf", source.tokenizer, quantize=kind,
                chat_template=source.chat_template, family=source.imported.family)
        for name, path in files.items():
            ours = load_model(path, "cpu", dequantize=True).model
            llm = Llama(model_path=str(path), n_ctx=512, n_threads=2, logits_all=True, verbose=False)
            for question, prompt in zip(QUESTIONS, prompts):
                llm.reset()
                llm.eval(prompt)
                theirs = np.array(llm.scores[llm.n_tokens - 1])
                with torch.no_grad():
                    mine = ours(torch.tensor([prompt]))[0, -1].numpy()
                best = np.sort(mine)[-2:]
                rows.append({"file": name, "question": question, "max |difference|": float(np.abs(theirs - mine).max()),
                             "llama.cpp argmax": int(theirs.argmax()), "attn argmax": int(mine.argmax()),
                             "attn margin": float(best[1] - best[0])})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out.write_text(json.dumps({"command": " ".join(sys.argv), "commit": commit, "rows": rows}, indent=1) + "\n")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
