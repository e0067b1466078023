"""The training engine: each architecture learns, non-finite losses, early stopping, metrics, resume checks."""

import itertools
import json
import math

import pytest
import torch
from training_helpers import (
    PAD,
    RepeatBatch,
    collate,
    quick_config,
    reversal_builder,
    reversal_pairs,
)

from attn.artifacts import checkpoint as ckpt
from attn.core.errors import CheckpointError, ConfigError, TrainingError
from attn.core.presets import preset
from attn.data.batches import Batch, lm_batch
from attn.training import machine as machine_module
from attn.training import precision as precision_module
from attn.training import run_training
from attn.training import trainer as trainer_module
from attn.training import update as update_module
from attn.training.distributed import init_distributed
from attn.training.logs import FlopCounter, model_flops, read_metrics
from attn.training.precision import Precision
from attn.training.task_data import TaskData


def one_batch(name):
    """(head, batch, ignore id) of one fixed batch for an architecture's task."""
    torch.manual_seed(0)
    tokens = torch.randint(7, 97, (4, 12))
    mask = torch.ones(4, 12, dtype=torch.bool)
    if name == "translation":
        return "forward", collate(reversal_pairs(4)), PAD
    if name == "lm":
        return "forward", lm_batch(tokens[:2, :-1], tokens[:2, 1:]), None
    if name == "classification":
        return "classify", Batch((tokens, mask), torch.tensor([0, 1, 2, 1]), 4, 48), None
    targets = torch.full_like(tokens, PAD)
    targets[:, [3, 7]] = tokens[:, [3, 7]]
    masked = tokens.clone()
    masked[:, [3, 7]] = 6
    return "mlm_logits", Batch((masked, mask), targets, 8, 48), PAD


# (preset, updates) per task: each of the three architectures, and the encoder on both its heads.
SETTINGS = {
    "translation": ("paper-base-tiny", 60),
    "lm": ("gpt2-tiny", 80),
    "classification": ("bert-base-tiny", 40),
    "mlm": ("bert-base-tiny", 60),
}


@pytest.mark.parametrize("task", list(SETTINGS))
def test_a_tiny_model_overfits_one_batch(tmp_path, task):
    head, batch, ignore = one_batch(task)
    name, steps = SETTINGS[task]

    def build(config, model_config, ctx):
        return TaskData(preset(name).replace(dropout=0.0), head, ignore, RepeatBatch(batch), None)

    config = quick_config(tmp_path, f"train.max_steps={steps}", "train.label_smoothing=0.0", "optim.lr=1e-2")
    result = run_training(config, task_builder=build)
    assert result.losses[0] > 1.0
    assert result.losses[-1] < 0.05


def test_compiled_training_compiles_the_loss_with_the_model_and_matches_eager(tmp_path, monkeypatch):
    head, batch, ignore = one_batch("lm")

    def build(config, model_config, ctx):
        model = preset("gpt2-tiny").replace(dropout=0.0, attention_dropout=0.0)
        return TaskData(model, head, ignore, RepeatBatch(batch), None)

    # A cache of its own: torch's shared cache in /tmp served a kernel compiled in another CPU mode (the
    # suite run plainly, then under ATEN_CPU_CAPABILITY=avx2) that failed with an index out of bounds.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    compiled, real_compile = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or real_compile(fn, **kw))
    losses = {}
    for flag in ("false", "true"):
        config = quick_config(tmp_path / flag, "train.max_steps=3", f"train.compile={flag}")
        losses[flag] = run_training(config, task_builder=build).losses
    assert update_module.batch_loss in compiled  # forward and loss in one graph, not the module alone
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-4)
    assert losses["true"][-1] < losses["true"][0]


def test_the_optimizer_is_fused_on_cpu_and_gpu_only():
    model, optim = torch.nn.Linear(3, 3), quick_config("run").optim
    assert update_module.make_optimizers(model, optim, torch.device("cuda"))[0].defaults["fused"] is True
    assert update_module.make_optimizers(model, optim, torch.device("cpu"))[0].defaults["fused"] is True
    assert not update_module.make_optimizers(model, optim, torch.device("meta"))[0].defaults["fused"]
    assert not update_module.make_optimizers(model, optim)[0].defaults["fused"]


class _Blocks(torch.nn.Module):
    """Named as attn's models are: matrices inside `blocks`, an embedding and a head outside."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 4)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 6), torch.nn.Linear(6, 4)])
        self.head = torch.nn.Linear(4, 5)


def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Muon's quintic iteration towards the orthogonal factor of g (Jordan et al., 2024), in float64."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.T if g.size(0) > g.size(1) else g
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if g.size(0) > g.size(1) else x


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = _Blocks()
    optim = quick_config("run", "optim.optimizer=muon", "optim.weight_decay=0.1").optim
    adamw, muon = update_module.make_optimizers(model, optim, torch.device("cpu"))
    names = {id(p): name for name, p in model.named_parameters()}
    assert [names[id(p)] for p in muon.param_groups[0]["params"]] == ["blocks.0.weight", "blocks.1.weight"]
    decayed, plain = ([names[id(p)] for p in group["params"]] for group in adamw.param_groups)
    assert (decayed, plain) == (["embed.weight", "head.weight"], ["blocks.0.bias", "blocks.1.bias", "head.bias"])
    assert isinstance(adamw, torch.optim.AdamW) and isinstance(muon, update_module.Muon)
    with pytest.raises(ConfigError, match="FSDP"):
        quick_config("run", "optim.optimizer=muon", "train.strategy=fsdp")


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 0.05)])
def test_muon_by_hand_at_its_rate_ratio(dtype, tolerance):
    """Two updates against Muon written out in float64: Nesterov momentum 0.95, Newton-Schulz, the update
    scaled to AdamW's RMS (0.2 sqrt(max side)) at muon_lr_ratio x the rate, decoupled decay; the
    iteration in float32 within 1e-5 of a step, in bfloat16 within 5 %."""
    torch.manual_seed(0)
    model = _Blocks()
    optim = quick_config("run", "optim.optimizer=muon", "optim.weight_decay=0.1", "optim.lr=0.01",
                         "optim.muon_lr_ratio=4").optim
    optimizers = update_module.make_optimizers(model, optim, torch.device("cpu"))
    update_module.match_precision(optimizers, Precision.BF16 if dtype == torch.bfloat16 else Precision.FP32)
    p = model.blocks[0].weight
    start = p.detach().double().clone()
    w, buf = start, torch.zeros(p.shape, dtype=torch.float64)
    for _ in range(2):
        g = torch.randn(p.shape, dtype=torch.float64)
        model.zero_grad(set_to_none=True)
        p.grad = g.float()
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = optim.lr * update_module.lr_ratio(optimizer, optim)
            optimizer.step()
        lr = optim.lr * 4
        buf = 0.95 * buf + 0.05 * g
        w = w * (1 - lr * 0.1) - lr * 0.2 * math.sqrt(6) * newton_schulz(0.05 * g + 0.95 * buf)
    torch.testing.assert_close(p.detach().double(), w, atol=lr * tolerance, rtol=0.0)
    assert (w - start).abs().max() > lr * 0.5  # the tolerance is small against what the updates moved


def test_muon_in_bfloat16_is_torchs_muon():
    """With the iteration in bfloat16, attn's Muon makes torch.optim.Muon's updates bit for bit."""
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(12, 7, bias=False), torch.nn.Linear(12, 7, bias=False)
    theirs.load_state_dict(ours.state_dict())
    mine = update_module.Muon(list(ours.parameters()), lr=0.02, weight_decay=0.1, ns_dtype=torch.bfloat16)
    reference = torch.optim.Muon(theirs.parameters(), lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        g = torch.randn(7, 12)
        ours.weight.grad, theirs.weight.grad = g.clone(), g.clone()
        mine.step()
        reference.step()
    assert torch.equal(ours.weight, theirs.weight)


def test_muon_iterates_in_the_precision_the_run_computes_in(tmp_path, monkeypatch):
    seen = {}
    for precision in ("fp32", "bf16"):
        monkeypatch.setattr(update_module.Muon, "orthogonalise",
                            lambda self, g, steps, p=precision: seen.setdefault(p, self.ns_dtype) and g)
        config = quick_config(tmp_path / precision, "train.max_steps=1", "optim.optimizer=muon",
                              f"train.precision={precision}", "optim.warmup_steps=0", "optim.schedule=constant")
        run_training(config, task_builder=reversal_builder())
    assert seen == {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_the_fused_cpu_update_is_adam_by_hand(kind):
    """Two steps of the optimizer on the CPU against Adam/AdamW written out (Kingma & Ba, Loshchilov & Hutter)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optim = quick_config("run", f"optim.optimizer={kind}", "optim.weight_decay=0.1", "optim.lr=0.01").optim
    (optimizer,) = update_module.make_optimizers(model, optim, torch.device("cpu"))
    start = {name: p.detach().double().clone() for name, p in model.named_parameters()}
    grads = [{name: torch.randn(p.shape, dtype=torch.float64) for name, p in model.named_parameters()}
             for _ in range(2)]
    for step_grads in grads:
        for name, p in model.named_parameters():
            p.grad = step_grads[name].float()
        optimizer.step()
    lr, (b1, b2), eps = optim.lr, (optim.beta1, optim.beta2), optim.eps
    for name, p in model.named_parameters():
        decay = optim.weight_decay if p.dim() >= 2 else 0.0  # matrices only
        w, m, v = start[name], 0.0, 0.0
        for t, step_grads in enumerate(grads, start=1):
            g = step_grads[name] + (decay * w if kind == "adam" else 0.0)  # Adam: L2 in the gradient
            w = w * (1 - lr * decay) if kind == "adamw" else w  # AdamW: decoupled decay
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            w = w - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        torch.testing.assert_close(p.detach().double(), w, atol=1e-5, rtol=1e-5)


def nan_on_call(monkeypatch, bad_call):
    """Makes the loss of the `bad_call`-th micro-batch NaN."""
    calls = {"n": 0}
    real = update_module.label_smoothed_cross_entropy

    def patched(logits, targets, smoothing, ignore_id):
        calls["n"] += 1
        sums = real(logits, targets, smoothing, ignore_id)
        return sums._replace(loss=sums.loss * math.nan) if calls["n"] == bad_call else sums

    monkeypatch.setattr(update_module, "label_smoothed_cross_entropy", patched)


def test_a_nan_loss_stops_with_the_step_and_no_nan_checkpoint(tmp_path, monkeypatch):
    nan_on_call(monkeypatch, bad_call=3)
    config = quick_config(tmp_path, "train.max_steps=5", "train.checkpoint_interval=1")
    with pytest.raises(TrainingError, match=r"step 3: the training loss is nan; lower optim.lr, set optim.clip"):
        run_training(config, task_builder=reversal_builder())
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000001", "step-00000002"]


def test_a_nan_loss_can_skip_the_update(tmp_path, monkeypatch):
    nan_on_call(monkeypatch, bad_call=3)
    config = quick_config(
        tmp_path, "train.max_steps=4", "train.checkpoint_interval=1", "train.keep_last=10", "train.on_nonfinite=skip"
    )
    result = run_training(config, task_builder=reversal_builder())
    assert math.isnan(result.losses[2]) and all(math.isfinite(x) for x in result.losses[:2] + result.losses[3:])
    weights = [ckpt.load_checkpoint(p).model.state_dict() for p in ckpt.list_checkpoints(tmp_path)]
    assert len(weights) == 4 and all(torch.isfinite(t).all() for w in weights for t in w.values())
    for key in weights[1]:  # the skipped update left the weights as they were
        assert torch.equal(weights[1][key], weights[2][key])
    assert {"step": 3, "skipped": "loss"} in read_metrics(tmp_path / "metrics.jsonl")


def test_early_stopping_when_the_metric_stops_improving(tmp_path):
    # lr = 0: the validation loss never improves after the first evaluation.
    config = quick_config(tmp_path, "optim.lr=0.0", "train.eval_interval=1", "train.patience=2", "train.max_steps=10")
    result = run_training(config, task_builder=reversal_builder())
    assert result.stopped_early and result.step == 3 and result.best_step == 1
    assert ckpt.best_checkpoint(tmp_path).name == "step-00000001"
    assert result.metrics["val_loss"] == pytest.approx(result.best_metric)
    summary = result.summary()
    assert summary.startswith("stopped early at step 3 (3 updates in this run at ") and "best at step 1 (" in summary
    assert "tokens/s, fp32 on cpu); val_loss " in summary
    assert summary.endswith(f"checkpoint {tmp_path / 'checkpoints' / 'step-00000003'}")


def test_metrics_file_records_training_and_validation(tmp_path):
    config = quick_config(
        tmp_path, "train.max_steps=4", "train.eval_interval=2", "train.log_interval=2", "optim.schedule=noam",
        "optim.warmup_steps=4", "optim.lr=2.0",
    )
    result = run_training(config, task_builder=reversal_builder())
    records = read_metrics(tmp_path / "metrics.jsonl")
    training = [r for r in records if "loss" in r]
    validation = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in training] == [2, 4] and [r["step"] for r in validation] == [2, 4]
    assert training[0]["lr"] == pytest.approx(2.0 * 32**-0.5 * 2 * 4**-1.5)  # the rate of update 2
    assert training[1]["loss"] == pytest.approx((result.losses[2] + result.losses[3]) / 2)
    assert all(r["tokens_per_s"] > 0 and r["elapsed"] > 0 and "mfu" not in r for r in training)
    assert validation[-1]["val_ppl"] == pytest.approx(math.exp(validation[-1]["val_loss"]))
    assert 0.0 <= validation[-1]["val_accuracy"] <= 1.0
    stored = json.loads((ckpt.latest_checkpoint(tmp_path) / ckpt.RUN_CONFIG_FILE).read_text())
    assert stored["train"]["max_steps"] == 4


def test_resuming_needs_the_same_model_and_refuses_to_overwrite(tmp_path):
    run_training(quick_config(tmp_path, "train.max_steps=1"), task_builder=reversal_builder())
    with pytest.raises(CheckpointError, match="differs from this run's in 'd_ff'"):
        run_training(quick_config(tmp_path, "train.max_steps=2", "model.d_ff=48"), task_builder=reversal_builder())
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        run_training(quick_config(tmp_path, "train.max_steps=2", "train.resume=false"), task_builder=reversal_builder())
    with pytest.raises(CheckpointError, match="optimizer state is Adam, this config builds AdamW \\+ Muon"):
        run_training(quick_config(tmp_path, "train.max_steps=2", "optim.optimizer=muon"), task_builder=reversal_builder())


def test_an_unknown_metric_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="train.metric: unknown metric 'bleu'"):
        run_training(quick_config(tmp_path, "train.metric=bleu"), task_builder=reversal_builder())


def test_model_flops_and_utilisation():
    # 6 N per token for the weights, 12 L d T per token for the attention scores.
    assert model_flops(n_params=1000, n_layers=2, d_model=8, context=10, tokens=5) == (6000 + 1920) * 5
    counter = FlopCounter(n_params=1000, n_layers=2, d_model=8, peak_flops=1e4)
    counter.add(context=10.2, tokens=5)
    counter.add(context=10, tokens=5)
    assert counter.utilisation(seconds=2.0) == pytest.approx(2 * 39600 / 2e4)
    assert counter.flops == 0.0 and FlopCounter(1, 1, 1, 0.0).utilisation(1.0) is None


def test_device_choice(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed("cpu").device == torch.device("cpu") and not init_distributed("cpu").distributed
    with pytest.raises(ConfigError, match="train.device: unknown device 'gpu0'"):
        init_distributed("gpu0")
    if not torch.cuda.is_available():
        assert init_distributed("auto").device == torch.device("cpu")
        with pytest.raises(ConfigError, match="no GPU is available"):
            init_distributed("cuda")


def test_plain_cuda_names_the_current_gpu_which_set_device_needs(monkeypatch):
    """`torch.cuda.set_device(torch.device("cuda"))` raises: the one-process run must pass an index."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert init_distributed("cuda").device == torch.device("cuda", 1)
    assert init_distributed("cuda:0").device == torch.device("cuda", 0)
    assert chosen == [torch.device("cuda", 1), torch.device("cuda", 0)]
    with pytest.raises(ConfigError, match="'cuda:2': this machine has 2 GPU"):
        init_distributed("cuda:2")


def test_a_time_budgeted_cosine_run_decays_with_the_clock_and_stops_when_it_runs_out(tmp_path, monkeypatch, capsys):
    clock = itertools.count(0, 15)  # every step takes 15 s: a quarter of a one-minute budget
    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: next(clock))
    config = quick_config(
        tmp_path / "run", "optim.schedule=cosine", "train.max_steps=1000", "train.max_minutes=1", "train.quiet=false"
    )
    result = run_training(config, task_builder=reversal_builder())
    bar = capsys.readouterr().err.split("\r")
    assert "100%" in bar[-1] and "60/60 s" in bar[-1] and "step=4" in bar[-1]  # the budget's bar, not 1000 steps'
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "lr" in r]
    spent = [0.0, 0.25, 0.5, 0.75]  # budget used before each update; the step count barely moves the cosine
    assert result.step == 4
    progress = [max(used, (step + 1) / 1000) for step, used in enumerate(spent)]
    assert lrs == pytest.approx([3e-3 * 0.5 * (1 + math.cos(math.pi * p)) for p in progress])


def test_an_overshooting_last_update_ends_the_bar_at_the_budget_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    clock = itertools.count(0, 25)  # 25 s per step: the third update ends at 75 s of a 60 s budget
    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: next(clock))
    config = quick_config(tmp_path / "run", "train.max_steps=1000", "train.max_minutes=1", "train.quiet=false")
    result = run_training(config, task_builder=reversal_builder())
    assert result.step == 3 and result.checkpoint is not None
    assert "100%" in capsys.readouterr().err.split("\r")[-1]
    resumed = run_training(config.override("train.resume=true"), task_builder=reversal_builder())  # budget already spent
    assert resumed.step == 3 and "100%" in capsys.readouterr().err.split("\r")[-1]


def test_a_run_five_times_slower_than_its_recipe_still_leaves_warmup_and_decays_to_the_floor(tmp_path, monkeypatch):
    # The recipe warms up over 50 updates and was tuned where ~100 fit the one-minute budget; this machine
    # makes 20 (3 s each). Warmup ends at 10 % of the budget (update 3), and the cosine reaches its floor.
    clock = itertools.count(0, 3)
    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: next(clock))
    config = quick_config(
        tmp_path / "run", "optim.schedule=cosine", "optim.warmup_steps=50", "optim.min_lr_ratio=0.1",
        "train.max_steps=100000", "train.max_minutes=1",
    )
    result = run_training(config, task_builder=reversal_builder())
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "lr" in r]

    def cosine(progress):
        return 3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    assert result.step == len(lrs) == 20
    assert lrs[0] == pytest.approx(cosine(0.0) * 1 / 50)  # update 1: the step count leads the ramp
    assert lrs[1] == pytest.approx(cosine(0.05) * 0.5)  # update 2: 5 % of the budget, half of its warmup share
    assert lrs[2] == pytest.approx(cosine(0.1))  # update 3: warmup over by the clock (50 steps never came)
    assert lrs[-1] == pytest.approx(cosine(0.95))  # the last update starts with 95 % spent
    assert lrs[-1] < 0.11 * 3e-3


def test_the_precision_choice_and_the_probe_figures_go_to_the_log_and_metrics(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(precision_module.AUTO_ENV, raising=False)  # the probe decides here
    monkeypatch.setattr(precision_module, "_probe", lambda device, shape: (1e-3, 0.1))  # bf16 100x slower
    result = run_training(quick_config(tmp_path, "train.precision=auto", "train.quiet=false"), task_builder=reversal_builder())
    assert result.precision == "fp32"
    record = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert record == {"step": 0, "precision": "fp32", "precision_requested": "auto",
                      "precision_reason": "a bf16 matmul runs at 0.01x the speed of fp32 on this CPU",
                      "probe_fp32_ms": 1.0, "probe_bf16_ms": 100.0, "bf16_speedup": 0.01}
    assert "attn: precision fp32 (requested auto: a bf16 matmul runs at 0.01x" in capsys.readouterr().err
    forced = run_training(quick_config(tmp_path / "bf16", "train.precision=bf16"), task_builder=reversal_builder())
    assert forced.precision == "bf16"  # obeyed, but the quiet run still warns, with the measured ratio
    assert "warning: train.precision = bf16, but a bf16 matmul runs at 0.01x the speed" in capsys.readouterr().err


BUDGET = ("train.max_minutes=60", "train.threads=1")  # the passes are timed in time-budgeted runs; threads pinned


def timed_by_precision(monkeypatch, seconds, probe=(1e-3, 2.5e-4)):
    """Every forward and backward pass takes `seconds["fp32" or "bf16"]` on a fake clock, by the precision of
    the objective it runs, and the matmul probe measures `probe` (fp32 s, bf16 s; default bf16 4x faster);
    returns the precisions of the passes run, in order."""
    ran, now, accumulate = [], [0.0], trainer_module.accumulate_gradients

    def timed(module, objective, *args, **kwargs):
        with objective.autocast():
            ran.append("bf16" if torch.is_autocast_enabled("cpu") else "fp32")
        now[0] += seconds[ran[-1]]
        return accumulate(module, objective, *args, **kwargs)

    monkeypatch.delenv(precision_module.AUTO_ENV, raising=False)
    monkeypatch.setattr(precision_module, "_probe", lambda device, shape: probe)
    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(trainer_module, "accumulate_gradients", timed)
    monkeypatch.setattr(machine_module, "accumulate_gradients", timed)
    return ran


@pytest.mark.parametrize(("probe", "matmul"), [((1e-3, 2.5e-4), "4x"), ((1e-3, 0.95e-3), "1.1x")])
@pytest.mark.parametrize(("seconds", "expected"), [({"fp32": 0.27, "bf16": 0.40}, "fp32"),
                                                   ({"fp32": 0.40, "bf16": 0.27}, "bf16")])
def test_auto_trains_in_bf16_only_where_a_training_pass_is_faster(tmp_path, monkeypatch, seconds, expected, probe,
                                                                   matmul):
    """A bf16 matmul 4x faster than fp32 is not yet a faster update (autocast casts every weight at every
    pass), and a sub-millisecond product timed at 1.05x may hide a faster one: before its first update an auto
    run times passes of its first batch in both precisions, and they decide."""
    ran = timed_by_precision(monkeypatch, seconds, probe)
    result = run_training(quick_config(tmp_path, "train.precision=auto", *BUDGET), task_builder=reversal_builder())
    assert result.precision == expected
    assert ran == ["fp32", "bf16"] * 4 + [expected] * 4  # an untimed pass each, 3 in rotation, then the updates
    record = read_metrics(tmp_path / "metrics.jsonl")[0]
    ratio = seconds["fp32"] / seconds["bf16"]
    assert record["precision"] == expected and record["bf16_speedup"] == probe[0] / probe[1]
    assert (record["pass_fp32_ms"], record["pass_bf16_ms"]) == (1e3 * seconds["fp32"], 1e3 * seconds["bf16"])
    assert record["precision_reason"] == f"a bf16 training pass runs at {ratio:.2g}x the speed of fp32 on this CPU, a matmul at {matmul}"


def test_the_precision_passes_leave_the_run_as_it_was(tmp_path, monkeypatch):
    """The passes draw dropout masks, take a batch and leave gradients: a run that times them and chooses
    fp32 makes the updates of a run configured fp32."""
    timed_by_precision(monkeypatch, {"fp32": 0.27, "bf16": 0.40})
    builder = reversal_builder(dropout=0.1)
    probed = run_training(quick_config(tmp_path / "auto", "train.precision=auto", *BUDGET), task_builder=builder)
    assert probed.precision == "fp32"
    assert run_training(quick_config(tmp_path / "fp32", *BUDGET), task_builder=builder).losses == probed.losses


def test_no_passes_where_bf16_is_emulated_explicit_or_the_run_has_no_budget(tmp_path, monkeypatch):
    """A run without a time budget keeps the matmul probe's choice: the same numbers every time."""
    ran = timed_by_precision(monkeypatch, {"fp32": 0.27, "bf16": 0.40})
    explicit = quick_config(tmp_path / "bf16", "train.precision=bf16", *BUDGET)
    assert run_training(explicit, task_builder=reversal_builder()).step == 4
    assert run_training(quick_config(tmp_path / "steps", "train.precision=auto"), task_builder=reversal_builder()).step == 4
    assert ran == ["bf16"] * 8
    monkeypatch.setattr(precision_module, "_probe", lambda device, shape: (1e-3, 0.1))
    emulated = quick_config(tmp_path / "auto", "train.precision=auto", *BUDGET)
    assert run_training(emulated, task_builder=reversal_builder()).step == 4
    assert ran == ["bf16"] * 8 + ["fp32"] * 4


def test_a_resumed_auto_run_keeps_the_precision_it_started_in(tmp_path, monkeypatch):
    """A probe that decides otherwise when the run resumes (a busier or another machine) does not switch
    precision mid-run: 2 + 2 updates give the losses of 4 in bf16, and an explicit precision is obeyed."""
    monkeypatch.setenv(precision_module.AUTO_ENV, "bf16")
    whole = run_training(quick_config(tmp_path / "whole", "train.precision=auto"), task_builder=reversal_builder())
    config = quick_config(tmp_path / "parts", "train.precision=auto", "train.max_steps=2")
    first = run_training(config, task_builder=reversal_builder())
    monkeypatch.setenv(precision_module.AUTO_ENV, "fp32")
    rest = run_training(config.override("train.max_steps=4", "train.resume=true"), task_builder=reversal_builder())
    assert whole.precision == first.precision == rest.precision == "bf16"
    assert first.losses + rest.losses == pytest.approx(whole.losses, rel=1e-6)
    records = [r for r in read_metrics(tmp_path / "parts" / "metrics.jsonl") if "precision" in r]
    assert [(r["precision"], r["precision_reason"]) for r in records] == [
        ("bf16", "ATTN_AUTO_PRECISION=bf16"), ("bf16", "chosen when the run started; a resumed run keeps it")]
    explicit = run_training(config.override("train.max_steps=5", "train.resume=true", "train.precision=fp32"),
                     task_builder=reversal_builder())
    assert explicit.precision == "fp32"
