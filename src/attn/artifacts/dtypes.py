"""The dtype a loaded model's float weights are held in: float32, bfloat16, float16, or "auto", which measures.

`hold_in` casts the model's float parameters (embeddings, linear layers, norms); its buffers stay as they are
(positional tables are cast to the activations' dtype where they are used). A quantized model computes in float32
around its int8 and int4 kernels, so it keeps float32.

"auto" chooses as training's precision does (`attn.training.precision`), by measuring on this machine: bfloat16 (on
a GPU without it, float16) where a decode step of the model itself (one token after a short prompt, the median of
`STEPS`, the steps of a float32 model and of a copy in the candidate taken in turn) runs at least `MIN_SPEEDUP` times
as fast as in float32 and its next-token distributions over the prompt stay within `KL_BOUND` of float32's (the mean
KL divergence, in nats); else float32. On a CPU without bf16 units (AVX-512 BF16, AMX) bfloat16 is emulated and its
step is the slower one. Only a decoder-only model is measured; other models keep float32. `ATTN_AUTO_PRECISION`
(bf16 or fp32) makes "auto" choose that on a CPU without measuring, for training and loading alike, so that tests and
CI take either path on any CPU.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.core.errors import ConfigError
from attn.core.linear import inference
from attn.core.quantized import quantization_of
from attn.models import Decoder

AUTO_ENV = "ATTN_AUTO_PRECISION"  # "bf16" or "fp32": what "auto" chooses on a CPU instead of measuring
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHOICES = ("auto", *DTYPES)
MIN_SPEEDUP = 1.1  # "measurably faster", as training's BF16_MIN_SPEEDUP
KL_BOUND = 1e-2  # nats; SmolLM2-135M in bfloat16 stays well within it (`tests/unit/test_loading_dtypes.py`)
STEPS = 8
PROBE_TEXT = "The quick brown fox jumps over the lazy dog, and then it rests in the shade of an old tree."

# seconds of one decode step of each model after a prompt (1, T)
StepTimer = Callable[[Sequence[Decoder], Tensor], list[float]]


@dataclasses.dataclass(frozen=True)
class DtypeChoice:
    """The dtype of a model's float weights, and why: "as asked", or what "auto" found."""

    dtype: torch.dtype
    reason: str


def check_dtype(name: str) -> str:
    """`name` when it is one of `CHOICES`.

    Raises:
        ConfigError: (field "dtype") any other name, listing the choices.
    """
    if name not in CHOICES:
        raise ConfigError("dtype", f"{name!r} is not a dtype attn holds weights in; choose one of {', '.join(CHOICES)}")
    return name


def auto_precision() -> str | None:
    """What `ATTN_AUTO_PRECISION` makes "auto" choose on a CPU: "bf16", "fp32", or None to measure.

    Raises:
        ConfigError: the variable holds anything but bf16, fp32, probe or nothing.
    """
    value = os.environ.get(AUTO_ENV, "").strip().lower()
    if value in ("", "probe"):
        return None
    if value not in ("bf16", "fp32"):
        raise ConfigError(AUTO_ENV, f"{value!r} is not a choice; set it to bf16, fp32 or probe, or unset it")
    return value


def choose_dtype(model: nn.Module, requested: str, probe: Sequence[int], timer: StepTimer | None = None) -> DtypeChoice:
    """The dtype to hold `model`'s float weights in, on the device it is on.

    Args:
        requested: one of `CHOICES`.
        probe: token ids of a short text: "auto" times decode steps after them and compares the distributions.
        timer: times a decode step of float32's model and of the candidate's (tests pass a fake one); default
            `time_decode_steps`.

    Raises:
        ConfigError: an unknown dtype, or bfloat16 or float16 asked of a quantized model.
    """
    requested = check_dtype(requested)
    scheme = quantization_of(model)
    if scheme is not None and requested not in ("auto", "float32"):
        raise ConfigError("dtype", f"{requested} is for float weights, but the model holds {scheme} weights, which "
                                   "compute in float32 around their kernels; leave the dtype at float32 or auto, or load "
                                   "float weights: without quantize, or a GGUF file's blocks dequantized (`attn convert "
                                   "--to attn`, load_model(..., dequantize=True))")
    if scheme is not None:
        return DtypeChoice(torch.float32, f"{scheme} weights compute in float32 around their kernels")
    if requested != "auto":
        return DtypeChoice(DTYPES[requested], "as asked")
    device = next(model.parameters()).device
    if device.type == "cpu" and (forced := auto_precision()) is not None:
        return DtypeChoice(torch.bfloat16 if forced == "bf16" else torch.float32, f"{AUTO_ENV}={forced}")
    if not isinstance(model, Decoder):
        return DtypeChoice(torch.float32, "only a decoder-only model's decode step is measured")
    candidate = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    prompt = torch.tensor([list(probe)[: model.max_positions - STEPS]], device=device)
    return _measured(model, candidate, prompt, timer or time_decode_steps)


def hold_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Casts `model`'s float parameters to `dtype` in place; tied parameters stay one."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            parameter.data = parameter.data.to(dtype)


def time_decode_steps(models: Sequence[Decoder], prompt: Tensor) -> list[float]:
    """The median seconds of a decode step of each of `models` after `prompt` (1, T), greedy, over `STEPS` steps taken
    in rotation (A B A B ...), so that a changing load slows them alike."""
    times: list[list[float]] = [[] for _ in models]
    with contextlib.ExitStack() as scopes:
        for model in models:
            scopes.enter_context(inference(model))
        caches = [model.new_cache(1, prompt.size(1) + STEPS) for model in models]
        tokens = [model.decode_step(prompt, cache, last_only=True).argmax(-1)  # (1, 1); the kernels warmed up
                  for model, cache in zip(models, caches)]
        for _ in range(STEPS):
            for i, (model, cache) in enumerate(zip(models, caches)):
                started = time.perf_counter()
                logits = model.decode_step(tokens[i], cache)  # (1, 1, vocab)
                if prompt.is_cuda:
                    torch.cuda.synchronize(prompt.device)
                times[i].append(time.perf_counter() - started)
                tokens[i] = logits.argmax(-1)
    return [statistics.median(seconds) for seconds in times]


def next_token_divergence(reference: nn.Module, trial: nn.Module, prompt: Tensor) -> float:
    """The mean over `prompt`'s (1, T) positions of KL(reference || trial) of the next-token distributions, in nats."""
    with inference(reference), inference(trial):
        expected = reference(prompt).float().log_softmax(-1)  # (1, T, vocab)
        found = trial(prompt).float().log_softmax(-1)
    return F.kl_div(found, expected, log_target=True, reduction="none").sum(-1).mean().item()


def _measured(model: Decoder, candidate: torch.dtype, prompt: Tensor, timer: StepTimer) -> DtypeChoice:
    """`candidate` where a copy of `model` held in it passes the speed and the quality gates, else float32."""
    trial = copy.deepcopy(model)
    hold_in(trial, candidate)
    float32_s, candidate_s = timer([model, trial], prompt)
    speedup = float32_s / candidate_s
    divergence = next_token_divergence(model, trial, prompt)
    name = str(candidate).removeprefix("torch.")
    reason = (f"a decode step in {name} runs at {speedup:.2g}x the speed of float32, and its next-token "
              f"distributions are {divergence:.2g} nats from float32's")
    passed = speedup >= MIN_SPEEDUP and divergence <= KL_BOUND
    return DtypeChoice(candidate if passed else torch.float32, reason)
