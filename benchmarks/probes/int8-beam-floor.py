"""Case 10's beam search with int8 weights: where attn's time goes, and why no engine may share its process.

The translation workload of case 10 (`benchmarks.engines`: marian-base shape with an 8,000-word vocabulary,
seeded random weights, beam 4, 32 sources of 30 tokens, exactly 40 new tokens), 2 threads: attn `int8-dynamic`
(every linear layer's product is `torch._int_mm`, oneDNN with VNNI) timed whole and once under the profiler
(the time inside `aten::_int_mm` and in the rest), all before anything of CTranslate2 exists in the process.
Then a CTranslate2 int8 `Translator` on the same weights is loaded and timed, attn is timed again while the
translator lives (idle), and once more after it is deleted. Case 10 compares the engines each in its own
process; this shows what sharing one does.

    python benchmarks/probes/int8-beam-floor.py benchmarks/results/engines-cpu/int8-beam-floor.json
"""

from __future__ import annotations

import functools
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from attn.artifacts import load_model
from attn.core.quantized import quantize
from benchmarks.engines import (
    BEAMS,
    CT2_TYPES,
    TRANSLATION,
    VOCAB,
    _ct2_convert,
    _ct2_vocabulary,
    export_translation,
    translate_in_process,
)
from benchmarks.harness import device_name, git_commit

ROUNDS = 5
THREADS = 2


def median_s(run) -> float:
    run()
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(out: Path) -> None:
    import ctranslate2

    torch.set_num_threads(THREADS)
    new = TRANSLATION["new"]
    seconds = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        sources = export_translation(folder / "hf")
        _ct2_convert(folder / "hf", "int8")
        model = quantize(load_model(folder / "hf", "cpu").model, "int8-dynamic")
        attn_run = functools.partial(translate_in_process, model, sources)

        seconds["attn int8-dynamic, alone"] = median_s(attn_run)
        with torch.profiler.profile() as profile:
            attn_run()
        words = _ct2_vocabulary(folder / "ct2-int8")
        translator = ctranslate2.Translator(str(folder / "ct2-int8"), device="cpu", inter_threads=1,
                                            intra_threads=THREADS, compute_type=CT2_TYPES["int8"])
        batch = [[words[i] for i in source] for source in sources]
        ct2_run = functools.partial(translator.translate_batch, batch, beam_size=BEAMS, length_penalty=1.0,
                                    min_decoding_length=new, max_decoding_length=new)
        seconds["CTranslate2 int8, after attn"] = median_s(ct2_run)
        seconds["attn int8-dynamic, a CTranslate2 translator alive"] = median_s(attn_run)
        del translator, ct2_run
        gc.collect()
        seconds["attn int8-dynamic, the translator deleted"] = median_s(attn_run)
    events = {event.key: event.self_cpu_time_total / 1e6 for event in profile.key_averages()}
    profiled = sum(events.values())
    record = {
        "command": f"python benchmarks/probes/int8-beam-floor.py {out}",
        "commit": git_commit(),
        "machine": {"device": device_name(torch.device("cpu")), "threads": THREADS, "torch": torch.__version__,
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(), "ctranslate2": ctranslate2.__version__},
        "workload": {**TRANSLATION, "beam": BEAMS, "vocab": VOCAB, "model": "marian-base"},
        "median_s": {name: round(value, 3) for name, value in seconds.items()},
        "sentences_per_s": {name: round(len(sources) / value, 2) for name, value in seconds.items()},
        "profile_s": {"total": round(profiled, 3),
                      **{key: round(value, 3) for key, value in sorted(events.items(), key=lambda kv: -kv[1])[:12]}},
        "int8_products_share": round(events.get("aten::_int_mm", 0.0) / profiled, 3),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
