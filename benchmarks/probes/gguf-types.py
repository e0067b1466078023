"""What keeping each GGUF block type quantized costs against the same file dequantized to float32, on SmolLM2.

    python benchmarks/probes/gguf-types.py /tmp/gguf-types benchmarks/results/quantized-quality/gguf-types.json

SmolLM2-135M-Instruct's weights (its Q4_1 file, dequantized) are written again with every matrix in one block type
(by libgguf, GGUF's reference quantization; norms stay F32), and once in llama.cpp's Q4_K_M mix (Q6_K for the
token embedding, v and down projections, Q4_K elsewhere). K-quants need rows of a multiple of 256 values, which
SmolLM2's width of 576 is not: those matrices take llama.cpp's fallback (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0),
as its quantizer does. Each file is loaded twice, kept quantized (`load_model`'s default) and dequantized to
float32 (`dequantize=True`): greedy answers of 24 tokens to the 20 chat prompts of `benchmarks.chat_model`, the
answers of the kept model identical to the float32 one's, and the mean KL(float32 || kept) of the next-token
distributions along the float32 model's answers.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize
from libgguf import quantize_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from attn import GenerationConfig, generate, load_model  # noqa: E402
from benchmarks.chat_model import QUESTIONS, gguf_path  # noqa: E402
from benchmarks.harness import device_name, git_commit  # noqa: E402

NEW_TOKENS = 24
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}
SIX_BITS = ("token_embd", "attn_v", "ffn_down")


def q4_k_m(name: str) -> Q:
    return Q.Q6_K if any(part in name for part in SIX_BITS) else Q.Q4_K


KINDS = {kind.name: (lambda name, kind=kind: kind) for kind in (Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q5_1, Q.Q5_K,
                                                                 Q.Q6_K, Q.Q8_0, Q.F16)}
KINDS["Q4_K_M"] = q4_k_m


def rewrite(source: Path, target: Path, kind_of) -> None:
    """`source` with every matrix stored as `kind_of(name)` (or its fallback), the metadata as it was."""
    reader = GGUFReader(source)
    writer = GGUFWriter(str(target), str(reader.fields["general.architecture"].contents()))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed([int(n) for n in tensor.shape])))
        if values.ndim == 1:
            writer.add_tensor(tensor.name, values.astype(np.float32))
            continue
        kind = kind_of(tensor.name)
        kind = FALLBACK.get(kind, kind) if values.shape[1] % 256 and kind in FALLBACK else kind
        writer.add_tensor(tensor.name, quantize_rows(values.astype(np.float32), kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def compare(path: Path) -> dict:
    rows = {}
    for kept in (False, True):
        bundle = load_model(path, "cpu", dequantize=not kept)
        prompts = [bundle.tokenizer.encode(bundle.render_chat([{"role": "user", "content": q}])) for q in QUESTIONS]
        config = GenerationConfig(max_new_tokens=NEW_TOKENS)
        answers = [generate(bundle.model, [p], config, eos_id=bundle.eos_id)[0] for p in prompts]
        reference = rows.get(False, {}).get("answers", answers)
        with torch.no_grad():
            logs = [bundle.model(torch.tensor([p + a]))[0, len(p) - 1:].log_softmax(-1)
                    for p, a in zip(prompts, reference, strict=True)]
        rows[kept] = {"answers": answers, "logs": logs}
    floats, kept = rows[False], rows[True]
    kl = [float((f.exp() * (f - k)).sum(-1).mean()) for f, k in zip(floats["logs"], kept["logs"], strict=True)]
    same = sum(a == b for a, b in zip(floats["answers"], kept["answers"], strict=True))
    return {"identical_answers": same, "prompts": len(QUESTIONS), "mean_kl": sum(kl) / len(kl),
            "file_mb": path.stat().st_size / 2**20}


def main() -> None:
    scratch, out = Path(sys.argv[1]), Path(sys.argv[2])
    scratch.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    found = {}
    for name, kind_of in KINDS.items():
        path = scratch / f"smollm2-{name}.gguf"
        if not path.exists():
            rewrite(gguf_path(), path, kind_of)
        start = time.perf_counter()
        found[name] = compare(path)
        print(name, found[name], f"{time.perf_counter() - start:.0f} s", flush=True)
    out.write_text(json.dumps({"command": " ".join(["python benchmarks/probes/gguf-types.py", *sys.argv[1:]]),
                               "commit": git_commit(), "machine": device_name(torch.device("cpu")),
                               "new_tokens": NEW_TOKENS, "types": found}, indent=1) + "\n")


if __name__ == "__main__":
    main()
