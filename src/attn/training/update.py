"""One update's work: the loss of a micro-batch and its gradients, summed over micro-batches and ranks.

An update's loss is the sum of the label-smoothed losses of all its micro-batches (on all ranks) divided by their
total number of scored targets, so every target weighs the same however the update was cut. `Objective` computes
a micro-batch's loss alike for training and evaluation; `accumulate_gradients` runs the backward passes of one
update; `make_optimizers` builds the optimizers that apply them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attn.core.errors import TrainingError
from attn.data.batches import Batch
from attn.models import Model
from attn.training.config_sections import OptimConfig, Optimizer
from attn.training.distributed import DistContext, all_reduce_sum, gradient_sync
from attn.training.losses import LossSums, label_smoothed_cross_entropy
from attn.training.precision import Precision


class TaskForward(nn.Module):
    """The model with the task's method as its `forward` ("forward", "classify" or "mlm_logits").

    DDP and FSDP hook only a module's `forward`: training wraps this module, not the model, so that
    calling the task's method goes through their gradient synchronisation.
    """

    def __init__(self, model: Model, method: str) -> None:
        super().__init__()
        self.model = model
        self.method = method

    def forward(self, *inputs: Tensor) -> Tensor:
        """The logits of the task's method, e.g. (B, T, vocab) or (B, num_labels)."""
        return getattr(self.model, self.method)(*inputs)


class BatchLoss(NamedTuple):
    """What `batch_loss` gives for one micro-batch: its summed losses and its logits, e.g. (B, T, vocab)."""

    sums: LossSums
    logits: Tensor


def batch_loss(
    module: nn.Module,
    inputs: tuple[Tensor, ...],
    targets: Tensor,
    smoothing: float,
    ignore_id: int | None,
    autocast: Callable[[], contextlib.AbstractContextManager],
) -> BatchLoss:
    """The forward pass of one micro-batch under `autocast`, then its float32 label-smoothed loss sums.
    `train.compile` compiles this function whole, so the (B, T, vocab) logits and their softmax
    fuse with the model instead of running as separate kernels."""
    with autocast():
        logits = module(*inputs)
    return BatchLoss(label_smoothed_cross_entropy(logits, targets, smoothing, ignore_id), logits)


@dataclasses.dataclass(frozen=True)
class Objective:
    """How training and evaluation compute a micro-batch's loss: `loss_fn` (`batch_loss` or its compiled form)
    over the module they call, its forward pass in the context `autocast` makes (mixed precision)."""

    ignore_id: int | None
    smoothing: float = 0.0
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    loss_fn: Callable[..., BatchLoss] = batch_loss

    def __call__(self, module: nn.Module, batch: Batch) -> BatchLoss:
        """The loss sums and logits of `module` (the distributed wrapper when there is one) on a
        micro-batch already on its device."""
        return self.loss_fn(module, batch.inputs, batch.targets, self.smoothing, self.ignore_id, self.autocast)

    def in_precision(self, device: torch.device, precision: Precision) -> Objective:
        """This objective with its forward pass in `precision` on `device` (see `autocast_factory`)."""
        return dataclasses.replace(self, autocast=autocast_factory(device, precision))


def accumulate_gradients(
    module: nn.Module,
    objective: Objective,
    batches: Sequence[Batch],
    ctx: DistContext = DistContext(),
    scale: Callable[[Tensor], Tensor] = lambda loss: loss,
) -> tuple[LossSums, int]:
    """Forward and backward over the micro-batches of one update, leaving the gradients in `.grad`.

    The gradient is that of (Σ smoothed losses of all micro-batches on all ranks) / (their total scored targets):
    each rank scales its sums by world_size / total because DDP and FSDP average gradients over ranks. Only the last
    micro-batch's backward pass all-reduces them.

    Args:
        module: the module training calls: the distributed wrapper when there is one.
        batches: this rank's micro-batches of the update.
        scale: the gradient scaler's `scale` for float16 training.

    Returns:
        The sums over all ranks (loss, nll, scored targets) and the number of input tokens on all ranks.

    Raises:
        TrainingError: the update has no scored target at all.
    """
    local = torch.tensor([sum(b.n_targets for b in batches)], dtype=torch.float64, device=ctx.device)
    total = int(all_reduce_sum(local, ctx).item())
    if total == 0:
        raise TrainingError("an update has no scored target; check the data (empty targets?) and batch sizes")
    factor = ctx.world_size / total
    sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss, nll, input tokens
    for i, batch in enumerate(batches):
        batch = batch.to(ctx.device)
        with gradient_sync(module, enabled=i == len(batches) - 1):
            loss, nll, _ = objective(module, batch).sums
            loss, nll = loss * batch.weight, nll * batch.weight
            scale(loss * factor).backward()
        sums += torch.stack([loss.detach(), nll.detach(), loss.new_tensor(batch.n_tokens)]).double()
    sums = all_reduce_sum(sums, ctx)
    return LossSums(sums[0], sums[1], torch.tensor(total)), int(sums[2].item())


def autocast_factory(device: torch.device, precision: Precision) -> Callable[[], contextlib.AbstractContextManager]:
    """The forward pass's mixed-precision context for a resolved precision (see `attn.training.precision`).

    bf16 autocast works on a GPU and on a CPU (faster only on processors with bf16 matrix units);
    fp16 needs a GPU's gradient scaler and is a no-op on the CPU.
    """
    if precision in (Precision.FP32, Precision.AUTO) or (precision == Precision.FP16 and device.type != "cuda"):
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == Precision.BF16 else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al., 2024) for matrices, computed as torch.optim.Muon computes it: Nesterov momentum, the
    update orthogonalised by five quintic Newton-Schulz steps, scaled to AdamW's size (0.2 x the square root of the
    larger side: `adjust_lr_fn="match_rms_adamw"`), and decoupled weight decay of lr x decay.

    The one difference is `ns_dtype`, the dtype of the iteration: torch's is always bfloat16, which a CPU without
    bf16 units emulates, many times slower than float32. The trainer sets it to the precision the run computes in.
    """

    COEFFICIENTS = (3.4445, -4.7750, 2.0315)

    def __init__(self, params: Sequence[nn.Parameter], lr: float, weight_decay: float, momentum: float = 0.95,
                 steps: int = 5, ns_dtype: torch.dtype = torch.float32) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "steps": steps})
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buffer = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buffer.lerp_(p.grad, 1 - momentum)
                update = self.orthogonalise(p.grad.lerp(buffer, momentum), group["steps"])
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-lr * 0.2 * math.sqrt(max(p.shape)))

    def orthogonalise(self, g: Tensor, steps: int) -> Tensor:
        """Newton-Schulz steps towards U V^T of g = U S V^T, in `ns_dtype` (singular values end near 1, not at 1)."""
        a, b, c = self.COEFFICIENTS
        x = g.to(self.ns_dtype)
        wide = x.size(0) <= x.size(1)
        x = x if wide else x.T
        x = x / x.norm().clamp(min=1e-7)
        for _ in range(steps):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        return x if wide else x.T


def make_optimizers(
    model: nn.Module, config: OptimConfig, device: torch.device | None = None
) -> tuple[torch.optim.Optimizer, ...]:
    """The optimizers over the model's parameters: Adam or AdamW alone, or Muon and AdamW.

    Weight decay applies to matrices only. Adam and AdamW use torch's fused kernel on a GPU and on the CPU (one pass
    over each parameter, the same update to float32 rounding). "muon" gives the matrices of the Transformer blocks
    (parameters named `...blocks.<i>...`) to `Muon` and the rest, embeddings and heads included, to AdamW.
    """
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    muon = config.optimizer == Optimizer.MUON
    in_blocks = {name for name, p in params if muon and p.dim() == 2 and "blocks" in name.split(".")}
    hidden = [p for name, p in params if name in in_blocks]
    rest = [p for name, p in params if name not in in_blocks]
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    kind = torch.optim.Adam if config.optimizer == Optimizer.ADAM else torch.optim.AdamW
    fused = device is not None and device.type in ("cuda", "cpu")
    optimizers = [kind(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps, fused=fused or None)]
    if hidden:
        optimizers.append(Muon(hidden, lr=config.lr * config.muon_lr_ratio, weight_decay=config.weight_decay))
    return tuple(optimizers)


def lr_ratio(optimizer: torch.optim.Optimizer, config: OptimConfig) -> float:
    """The multiple of the scheduled learning rate that `optimizer` (one of `make_optimizers`') follows, taken
    from the config, not the parameter groups, so that a resumed run follows its current config."""
    return config.muon_lr_ratio if isinstance(optimizer, Muon) else 1.0


def match_precision(optimizers: Sequence[torch.optim.Optimizer], precision: Precision) -> None:
    """Runs `Muon`'s iteration in bfloat16 where the run computes in bfloat16 (chosen where it is fast), else in float32."""
    for optimizer in optimizers:
        if isinstance(optimizer, Muon):
            optimizer.ns_dtype = torch.bfloat16 if precision == Precision.BF16 else torch.float32
