"""Case 1: training throughput (forward + backward + AdamW step on random tokens), with each row's MFU.

`paper-base` is compared with `torch.nn.Transformer` and Hugging Face's `MarianMTModel` of the same
dimensions, `gpt2` (124M) with `GPT2LMHeadModel`. Throughput counts every input token of a step:
B x (S + T) for the encoder-decoder, B x T for the decoder-only model. Model FLOPs are the matmul
FLOPs of our model's forward and backward at the shape, counted by torch's `FlopCounterMode` on the
meta device (attention counted in full, causal or not, as is usual for MFU); peers are credited
with the same FLOPs, since they compute the same model.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.artifacts.pretrained import SpecialIds
from attn.core.config import ModelConfig, SinusoidalLayout
from attn.models import build_model
from attn.core.presets import preset
from benchmarks.harness import CaseResult, Contender, Row, Settings, compare, rows_for
from benchmarks.peers import TorchTransformer, twins

TORCH = "torch.nn.Transformer"
HF_MARIAN = "HF MarianMTModel"
HF_GPT2 = "HF GPT2LMHeadModel"
CONTENDERS = {"paper-base": ("attn", TORCH, HF_MARIAN), "gpt2": ("attn", HF_GPT2)}
TOKENS_PER_STEP = {"cpu": 1024, "cuda": 32768}
SEQUENCES = (128, 512)
GPU_SEQUENCES = {"gpt2": (1024,)}  # the GPU case: gpt2 training at sequence 1024
QUICK_SEQUENCES = (16, 32)
QUICK_BATCH = 2


@dataclasses.dataclass(frozen=True)
class Shape:
    """One training shape: the model preset, sequence length and batch size."""

    model: str
    seq: int
    batch: int

    @property
    def label(self) -> str:
        return f"{self.model} T={self.seq} B={self.batch}"

    @property
    def tokens(self) -> int:
        """Input tokens of one step: source and target for the encoder-decoder."""
        return self.batch * self.seq * (2 if self.model == "paper-base" else 1)


def shapes(settings: Settings) -> list[Shape]:
    """The training shapes: seq 128 and 512 (gpt2 also 1024 on a GPU), batch = a token budget / seq.

    Only the presets in `settings.models` when it names any.
    """
    models = [model for model in CONTENDERS if not settings.models or model in settings.models]
    if settings.quick:
        return [Shape(model, seq, QUICK_BATCH) for model in models for seq in QUICK_SEQUENCES]
    on_gpu = settings.device.type == "cuda"
    budget = TOKENS_PER_STEP["cuda" if on_gpu else "cpu"]
    extra = GPU_SEQUENCES if on_gpu else {}
    return [Shape(model, seq, max(1, budget // seq)) for model in models for seq in SEQUENCES + extra.get(model, ())]


def model_config(model: str, quick: bool) -> ModelConfig:
    """The preset (tiny when quick). paper-base gets equal dropout rates, which `nn.Transformer` needs."""
    config = preset(model)
    if model == "paper-base":
        config = config.replace(attention_dropout=config.dropout, activation_dropout=config.dropout)
    return config.tiny() if quick else config


@dataclasses.dataclass
class Trainee:
    """A model to train and how to call it: `forward(*inputs)` -> logits (B, T, vocab)."""

    module: nn.Module
    forward: Callable[..., Tensor]


def _ours(config: ModelConfig) -> Trainee:
    model = build_model(config)
    return Trainee(model, model)


def _torch(config: ModelConfig) -> Trainee:
    model = TorchTransformer(config)
    return Trainee(model, model)


def _hf_gpt2(config: ModelConfig) -> Trainee:
    _, hf = twins(config, "gpt2", "GPT2LMHeadModel", SpecialIds())
    return Trainee(hf, lambda tokens: hf(input_ids=tokens, use_cache=False).logits)


def _hf_marian(config: ModelConfig) -> Trainee:
    # Marian fixes the sinusoid layout and always has a logits bias: the same work as paper-base.
    marian = config.replace(sinusoidal_layout=SinusoidalLayout.CONCATENATED, output_bias=True)
    _, hf = twins(marian, "marian", "MarianMTModel", SpecialIds(pad=0, eos=1))
    return Trainee(hf, lambda src, tgt: hf(input_ids=src, decoder_input_ids=tgt, use_cache=False).logits)


BUILDERS: dict[str, Callable[[ModelConfig], Trainee]] = {
    "attn": _ours, TORCH: _torch, HF_MARIAN: _hf_marian, HF_GPT2: _hf_gpt2,
}


def random_batch(shape: Shape, vocab: int, device: torch.device | str) -> tuple[tuple[Tensor, ...], Tensor]:
    """Random token ids: the model inputs ((tokens,) or (src, tgt)) and the targets (B, T)."""
    generator = torch.Generator().manual_seed(0)
    draws = 3 if shape.model == "paper-base" else 2
    tensors = [torch.randint(0, vocab, (shape.batch, shape.seq), generator=generator) for _ in range(draws)]
    tensors = [t.to(device) for t in tensors]
    return tuple(tensors[:-1]), tensors[-1]


@dataclasses.dataclass
class TrainingStep:
    """One training step as a callable, with the model and the optimizer it updates."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    run: Callable[[], None]

    def __call__(self) -> None:
        self.run()

    def held_bytes(self) -> int:
        """Bytes of the weights, buffers and optimizer state, which outlive a step."""
        state = [t for values in self.optimizer.state.values() for t in values.values() if torch.is_tensor(t)]
        kept = [*self.module.parameters(), *self.module.buffers(), *state]
        return sum(t.numel() * t.element_size() for t in kept)


def train_step(trainee: Trainee, inputs: tuple[Tensor, ...], targets: Tensor, settings: Settings) -> TrainingStep:
    """Forward, cross-entropy, backward, AdamW step and zeroed gradients, on the run's device.

    With `settings.compile` the loss is compiled with the forward: left outside, gpt2's fp32 logits
    (B x T x 50257) cost a quarter of an H200 step in casts and softmax kernels. On a GPU every
    contender's AdamW is the fused kernel.
    """
    module = trainee.module.to(settings.device).train()

    def loss_of(*tensors: Tensor) -> Tensor:
        with settings.autocast():
            logits = trainee.forward(*tensors)  # (B, T, vocab)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    loss_fn = torch.compile(loss_of) if settings.compile else loss_of
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=settings.device.type == "cuda")

    def step() -> None:
        loss_fn(*inputs).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return TrainingStep(module, optimizer, step)


def prepared_step(shape: Shape, contender: str, settings: Settings) -> TrainingStep:
    """The training step of one contender at one shape, on the run's device."""
    config = model_config(shape.model, settings.quick)
    inputs, targets = random_batch(shape, config.vocab_size, settings.device)
    return train_step(BUILDERS[contender](config), inputs, targets, settings)


def model_flops(shape: Shape, quick: bool) -> float:
    """Matmul FLOPs of one forward + backward of our model at `shape`, counted without computing anything."""
    from torch.utils.flop_counter import FlopCounterMode

    config = model_config(shape.model, quick)
    with torch.device("meta"):
        model = build_model(config)
    inputs, _ = random_batch(shape, config.vocab_size, "meta")
    counter = FlopCounterMode(display=False)
    with counter:
        model(*inputs).sum().backward()
    return float(counter.get_total_flops())


def add_mfu(rows: list[Row], flops_per_token: float, peak: float | None) -> None:
    """Notes each throughput row's model FLOP/s and, given the matmul peak (FLOP/s), its MFU."""
    for row in rows:
        achieved = flops_per_token * row.median
        row.notes["model TFLOP/s"] = achieved / 1e12
        if peak:
            row.notes["MFU %"] = 100 * achieved / peak


def run(settings: Settings, peak: float | None) -> CaseResult:
    """Case 1. `peak` is the matmul peak of case 7 in the run's dtype (None: no MFU)."""
    rows: list[Row] = []
    for shape in shapes(settings):
        contenders = [
            Contender(name, prepared_step(shape, name, settings), shape.tokens) for name in CONTENDERS[shape.model]
        ]
        found = rows_for(shape.label, "tokens/s", compare(contenders, settings))
        add_mfu(found, model_flops(shape, settings.quick) / shape.tokens, peak)
        rows += found
        del contenders
        gc.collect()
    summary = {"MFU": "against case 7's matmul peak" if peak else "not computed: run case 7 in the same run"}
    return CaseResult(1, "Training throughput (forward + backward + AdamW step)", "> 1: attn is faster", rows,
                      summary)
