"""Case 8 and the quickstart profiles: the quickstart recipes' training steps, built as `attn train` builds them.

A recipe's `Trainer` comes from its TOML config through the same calls `attn.training.run_training` makes
(the task adapter with its tokenizer and batches, `build_model`, the pretrained weights of
`model.init_from`, `set_up_trainer`), in fp32 and without a time budget; its training batches are then
replaced by one fixed batch drawn from the recipe's own batch source, so every call of the step
does the same work: `Trainer.train_step` (forward, label-smoothed cross-entropy, backward,
gradient clipping, the optimizer step) exactly as training runs it.

    python -m benchmarks.quickstart                      # profile every recipe, print the shares
    python -m benchmarks.quickstart --recipes lm --rows 25 --trace /tmp/lm.json
    python -m benchmarks.quickstart --peers --threads 1 # case 8's shapes, peers too: how far a ratio can go
    python -m benchmarks.run --cases 7,8                  # case 8 against the peers, with MFU

The profiles keep freed memory for the next step, as `attn train` does (`train.keep_memory`): under
the C library's defaults every step faults its large tensors in afresh, and the profile charges
that to whichever operator touches the pages first (the translator's softmax over its logits took
16-21 ms a step instead of 6-8, benchmarks/results/bounds). `--system-malloc` profiles
under the defaults; case 8 runs every contender under them, and `benchmarks.allocator` compares
the two settings process by process.

Case 8 times each recipe's step at a fixed batch of its shape (translation 32 pairs x 36 + 36
tokens, char LM 16 x 128, MiniLM fine-tune 32 x 40 tokens) against the same model in its peers:
`torch.nn.Transformer` (pre-norm, like the recipe) and HF `MarianMTModel` (post-norm, the only
arrangement Marian has) for translation, HF `GPT2LMHeadModel` for the char LM, HF
`BertForSequenceClassification` holding the packaged MiniLM weights for the fine-tune. attn runs
`Trainer.train_step` itself (its loss, clipping and optimizer); a peer's step is its forward,
torch's `cross_entropy` with the recipe's label smoothing, backward, the recipe's clipping and the
same optimizers (`make_optimizers` over the peer's parameters: fused Adam/AdamW, decay on matrices).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attn.app.allocator import keep_freed_memory
from attn.app.runs import load_run_config
from attn.app.tasks import get_task
from attn.artifacts.checkpoint import Checkpoint
from attn.artifacts.loading import packaged_model_dir
from attn.core.config import ModelConfig, NormPlacement
from attn.data.batches import Batch
from attn.models import build_model
from attn.training.finetune import copy_pretrained, initial_model
from attn.training.run import seed_everything, set_up_trainer
from attn.training.runconfig import RunConfig
from attn.training.task_data import TaskContext, TaskData
from attn.training.trainer import Trainer
from attn.training.update import make_optimizers
from benchmarks.harness import CaseResult, Contender, Settings, compare, rows_for
from benchmarks.peak import run as peak_run
from benchmarks.peers import TorchTransformer
from benchmarks.training import BUILDERS, add_mfu

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# fp32, no time budget (the step must not decay the rate with the clock), nothing written but
# the metrics log of a throwaway run directory.
COMMON = ("train.precision=fp32", "train.max_minutes=0", "train.quiet=true", "train.device=cpu")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A quickstart config with the overrides that set its benchmark shape.

    Attributes:
        name: short name ("translation", "lm", "classification", "d256").
        config: the TOML file under configs/.
        overrides: `section.key=value` strings applied after the file.
        shape: (rows, source length, target length) of a random batch with nothing padded,
            instead of the recipe's own batch (target length 0 for the encoder-only and
            decoder-only tasks); None keeps the recipe's first training batch.
    """

    name: str
    config: str
    overrides: tuple[str, ...] = ()
    shape: tuple[int, int, int] | None = None


RECIPES = {
    "translation": Recipe("translation", "quickstart-translation.toml"),
    "lm": Recipe("lm", "quickstart-lm.toml"),
    "classification": Recipe("classification", "quickstart-classification.toml"),
    # A wider encoder-decoder than the recipe's: d256, 3+3 layers, 64 pairs x 32+32 tokens, no padding.
    "d256": Recipe("d256", "quickstart-translation.toml", ("model.d_model=256", "model.d_ff=1024"), (64, 32, 32)),
}
# Case 8's shapes: the recipes' batches without padding (translation: ~1,200 target tokens).
BENCHMARK_RECIPES = {
    "translation": Recipe("translation", "quickstart-translation.toml", shape=(32, 36, 36)),
    "lm": Recipe("lm", "quickstart-lm.toml", shape=(16, 128, 0)),
    "classification": Recipe("classification", "quickstart-classification.toml", shape=(32, 40, 0)),
    "d256": RECIPES["d256"],
}
WARMUP_STEPS = 3  # untimed steps before a profile: kept memory stops faulting in pages after the second
QUICK_SHAPE = (2, 16, 16)  # --quick: the same models at a tiny batch
TORCH = "torch.nn.Transformer"
PEERS = {
    "translation": (TORCH, "HF MarianMTModel"),
    "d256": (TORCH, "HF MarianMTModel"),
    "lm": ("HF GPT2LMHeadModel",),
    "classification": ("HF BertForSequenceClassification",),
}


class RepeatedBatch:
    """A batch source that deals the same batch forever (and has no position to save)."""

    def __init__(self, batch: Batch) -> None:
        self.batch = batch

    def next_batch(self) -> Batch:
        return self.batch

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def recipe_task(recipe: Recipe, run_dir: Path) -> tuple[RunConfig, TaskData, Checkpoint | None]:
    """The recipe's run config, task data (tokenizer, batches) and pretrained model, as `train` makes them."""
    config = load_run_config(CONFIGS / recipe.config, [*COMMON, f"run_dir={run_dir}", *recipe.overrides])
    model_config = config.model_config()
    initial = initial_model(config.model.init_from)
    if initial is not None:
        model_config = config.model.build(initial.model_config)
    seed_everything(config.train.seed)
    ctx = TaskContext(0, 1, initial and initial.tokenizer)
    return config, get_task(config.task).build(config, model_config, ctx), initial


def build_trainer(recipe: Recipe, run_dir: Path, repeat: bool = True) -> Trainer:
    """The recipe's trainer, built by the calls `attn.training.run_training` makes, dealing one fixed batch
    (`repeat`), or else the recipe's own batches, whose shapes vary as they do in training."""
    config, task, initial = recipe_task(recipe, run_dir)
    model = build_model(task.model_config, config.train.attention)
    if initial is not None:
        copy_pretrained(initial, model)
    if repeat:
        shape = recipe.shape
        batch = task.train.next_batch() if shape is None else full_batch(config.task, shape, task.model_config)
        task = dataclasses.replace(task, train=RepeatedBatch(batch))
    return set_up_trainer(config, dataclasses.replace(task, valid=None), model.train())


def recipe_pad_share(recipe: Recipe, run_dir: Path, batches: int) -> float:
    """The padding share of the input positions of the recipe's first `batches` training batches."""
    _, task, _ = recipe_task(recipe, run_dir)
    drawn = [task.train.next_batch() for _ in range(batches)]
    masks = [t for batch in drawn for t in batch.inputs if t.dtype == torch.bool]
    if not masks:  # inputs without a padding mask (the LM's windows) are never padded
        return 0.0
    return 1.0 - sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)


def full_batch(task: str, shape: tuple[int, int, int], model_config: ModelConfig) -> Batch:
    """A random batch of the task's inputs at `shape` (rows, source, target), nothing padded."""
    rows, source, target = shape
    generator = torch.Generator().manual_seed(0)

    def ids(length: int, high: int) -> Tensor:
        return torch.randint(4, high, (rows, length), generator=generator)

    vocab = model_config.vocab_size
    if task == "translation":
        src, tgt, out = ids(source, vocab), ids(target, vocab), ids(target, vocab)
        masks = torch.ones_like(src, dtype=torch.bool), torch.ones_like(tgt, dtype=torch.bool)
        return Batch((src, tgt, *masks), out, rows * target, rows * (source + target))
    if task == "lm":
        return Batch((ids(source, vocab),), ids(source, vocab), rows * source, rows * source)
    tokens = ids(source, vocab)
    labels = torch.randint(0, model_config.num_labels, (rows,), generator=generator)
    return Batch((tokens, torch.ones_like(tokens, dtype=torch.bool)), labels, rows, rows * source)


MATMUL = "matmul"
# Operator or autograd-node name (lower case) -> category; the first match wins.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("optimizer (AdamW, zero_grad)", ("optimizer.",)),
    ("gradient clipping", ("clip_grad", "linalg_vector_norm", "_foreach_norm")),
    ("attention (SDPA)", ("scaled_dot_product", "flash_attention")),
    ("layernorm", ("layer_norm",)),
    ("softmax / loss", ("softmax", "nll_loss", "cross_entropy", "gather")),
    (MATMUL, ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul")),
    ("embedding", ("embedding",)),
    ("copies / reshapes", ("copy_", "clone", "contiguous", "aten::cat", "aten::stack", "_to_copy")),
)
GENERIC = "elementwise / reductions / other"
# Composite operators whose inner elementwise kernels belong to them.
OWNERS = {"optimizer (AdamW, zero_grad)", "gradient clipping", "attention (SDPA)", "layernorm", "softmax / loss"}


def category(name: str) -> str:
    """The profile category of an operator or autograd node name."""
    name = name.lower()
    return next((label for label, keys in CATEGORIES if any(key in name for key in keys)), GENERIC)


def event_category(event: Any) -> str:
    """An event's category: its own, or that of a composite operator it runs inside."""
    own = category(event.name)
    parent = event.cpu_parent
    while parent is not None:
        outer = category(parent.name)
        if outer in OWNERS and (own == GENERIC or outer.startswith("optimizer")):
            return outer
        parent = parent.cpu_parent
    return own


def profile_step(step: Callable[[], Any], steps: int) -> tuple[dict[str, float], float, Any]:
    """Milliseconds per step by category over `steps` calls, the wall time per step, the profile.

    Each aten operator's self time is counted once, in its category; the wall time no operator
    covers is "Python, autograd and dispatch".
    """
    import time

    from torch.profiler import ProfilerActivity, profile

    for _ in range(WARMUP_STEPS):  # the allocator's pages, the optimizer's state, lazy inits
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - start) * 1e3 / steps
    shares: dict[str, float] = {}
    for event in prof.events():
        if event.name.startswith("aten::"):
            label = event_category(event)
            shares[label] = shares.get(label, 0.0) + event.self_cpu_time_total / 1e3 / steps
    shares["Python, autograd and dispatch"] = max(0.0, wall - sum(shares.values()))
    return shares, wall, prof


def _peer(name: str, trainer: Trainer) -> tuple[nn.Module, Callable[..., Tensor]]:
    """A peer's model of the recipe's config and how to call it with the batch's inputs -> logits."""
    config = trainer.task.model_config
    if name == TORCH:
        module = TorchTransformer(config)
        return module, lambda src, tgt, src_mask, tgt_mask: module(src, tgt)
    if name == "HF BertForSequenceClassification":
        import transformers

        folder = packaged_model_dir(trainer.config.model.init_from)
        module = transformers.BertForSequenceClassification.from_pretrained(folder, num_labels=config.num_labels)
        return module, lambda tokens, mask: module(input_ids=tokens, attention_mask=mask).logits
    if name == "HF GPT2LMHeadModel":
        trainee = BUILDERS[name](config)
        return trainee.module, trainee.forward
    # Marian has only post-norm (and no final stack norms): the same dimensions and work otherwise.
    trainee = BUILDERS[name](config.replace(norm_placement=NormPlacement.POST, final_norm=False))
    return trainee.module, lambda src, tgt, src_mask, tgt_mask: trainee.forward(src, tgt)


def peer_step(name: str, trainer: Trainer) -> Callable[[], None]:
    """One step of the recipe in a peer: forward, torch's smoothed cross-entropy, backward, the
    recipe's clipping and the same optimizer as attn's."""
    module, forward = _peer(name, trainer)
    module.train()
    config, batch = trainer.config, trainer.task.train.next_batch()
    optimizers = make_optimizers(module, config.optim, torch.device("cpu"))
    ignore = -100 if trainer.task.ignore_id is None else trainer.task.ignore_id
    clip = config.optim.clip if config.optim.clip > 0 else math.inf
    smoothing = config.train.label_smoothing

    def step() -> None:
        logits = forward(*batch.inputs)
        loss = F.cross_entropy(logits.flatten(0, -2).float(), batch.targets.flatten(), ignore_index=ignore,
                               label_smoothing=smoothing, reduction="sum") / batch.n_targets
        loss.backward()
        nn.utils.clip_grad_norm_(module.parameters(), clip)
        for optimizer in optimizers:
            optimizer.step()
        module.zero_grad(set_to_none=True)

    return step


def step_flops(trainer: Trainer) -> float:
    """Matmul FLOPs of the forward and backward of attn's model on the trainer's batch.

    Counted on the CPU with real tensors, not on the meta device: the model reads its masks on the
    host (is any row left-padded or all padding?), which a meta tensor cannot answer.
    """
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(trainer.task.model_config)
    batch = trainer.task.train.next_batch()
    counter = FlopCounterMode(display=False)
    with counter:
        getattr(model, trainer.task.head)(*batch.inputs).sum().backward()
    return float(counter.get_total_flops())


def fp32_peak(settings: Settings) -> float:
    """Case 7's fp32 matmul peak (FLOP/s) alone: case 7 also times bf16, which takes many minutes on a
    CPU without bfloat16 units."""
    result = peak_run(dataclasses.replace(settings, dtype=torch.float32), dtypes=(torch.float32,))
    return float(result.summary["peak FLOP/s fp32"])


def run(settings: Settings, peak: float | None) -> CaseResult:
    """Case 8 on the CPU in fp32. `peak`: case 7's fp32 matmul peak, or None to measure it here."""
    title = "Quickstart training steps on the CPU (fp32)"
    if settings.device.type != "cpu" or settings.dtype != torch.float32 or settings.compile:
        return CaseResult(8, title, "> 1: attn is faster", [], {"skipped": "case 8 is the eager fp32 CPU regime"})
    peak = peak or fp32_peak(settings)
    rows = []
    for name, recipe in BENCHMARK_RECIPES.items():
        if settings.quick:
            recipe = dataclasses.replace(recipe, shape=QUICK_SHAPE)
        with tempfile.TemporaryDirectory() as folder:
            trainer = build_trainer(recipe, Path(folder) / "run")
            tokens = trainer.task.train.next_batch().n_tokens
            contenders = [Contender("attn", trainer.train_step, tokens)]
            contenders += [Contender(peer, peer_step(peer, trainer), tokens) for peer in PEERS[name]]
            shape = [tuple(t.shape) for t in trainer.task.train.next_batch().inputs[:2]]
            found = rows_for(f"{name} {shape}", "tokens/s", compare(contenders, settings))
            add_mfu(found, step_flops(trainer) / tokens, peak)
            rows += found
        del contenders, trainer
        gc.collect()
    summary = {
        "MFU": f"against the fp32 matmul peak, {peak / 1e9:.0f} GFLOP/s",
        "steps": "attn: Trainer.train_step; peers: forward, torch cross_entropy with the recipe's label smoothing, "
                 "backward, the recipe's clipping, the same fused optimizer",
    }
    return CaseResult(8, title, "> 1: attn is faster", rows, summary)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quickstart", description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated, from " + ", ".join(RECIPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="profiled steps per recipe (default 10)")
    parser.add_argument("--rows", type=int, default=0, help="also print the N most expensive operators")
    parser.add_argument("--trace", type=Path, help="write a Chrome trace (one recipe only)")
    parser.add_argument("--pad-batches", type=int, default=100,
                        help="batches of the recipe's own data whose padding share is reported (default 100)")
    parser.add_argument("--system-malloc", action="store_true",
                        help="profile under the C library's default malloc instead of keeping freed memory as "
                             "`attn train` does (train.keep_memory); it is the process's setting, so the peers share it")
    parser.add_argument("--peers", action="store_true",
                        help="at case 8's shapes, also profile the peers and print the ratio attn would reach if "
                             "everything in its step but the matmuls took no time")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kept = not args.system_malloc and keep_freed_memory()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{'freed memory kept' if kept else 'default malloc'}")
    for name in args.recipes.split(","):
        recipe = (BENCHMARK_RECIPES if args.peers else RECIPES)[name]
        with tempfile.TemporaryDirectory() as folder:
            trainer = build_trainer(recipe, Path(folder) / "run")
            batch = trainer.task.train.next_batch()
            shares, wall, prof = profile_step(trainer.train_step, args.steps)
            own = args.pad_batches and recipe.shape is None  # a fixed shape has no padding
            padding = recipe_pad_share(recipe, Path(folder) / "pad", args.pad_batches) if own else 0.0
            peers = {peer: profile_step(peer_step(peer, trainer), args.steps)[:2] for peer in PEERS[name]
                     if args.peers}
        total = sum(shares.values())
        print(f"\n## {name}: {wall:.1f} ms/step, {batch.n_tokens / wall * 1e3:,.0f} tokens/s, "
              f"input shapes {[tuple(t.shape) for t in batch.inputs]}; padding in the recipe's first "
              f"{args.pad_batches if own else 0} batches: {padding:.1%}")
        for label, ms in sorted(shares.items(), key=lambda item: -item[1]):
            print(f"  {label:32s} {ms:8.2f} ms  {100 * ms / total:5.1f} %")
        for peer, (peer_shares, peer_wall) in peers.items():
            print(f"  {peer}: {peer_wall:.1f} ms/step, matmul {peer_shares.get(MATMUL, 0.0):.1f} ms; attn / peer "
                  f"{peer_wall / wall:.2f}, and {peer_wall / shares[MATMUL]:.2f} if attn's step were its matmuls alone")
        if args.rows:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
        if args.trace:
            prof.export_chrome_trace(str(args.trace))
    return 0


if __name__ == "__main__":
    sys.exit(main())
