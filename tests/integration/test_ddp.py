"""Several processes on the CPU (gloo): the same global batch gives the same losses as one process.

Two ranks each take half of every global batch; DistributedDataParallel (and FSDP2) average
their gradients, and the trainer's normalisation by the update's total target count makes the
result that of one process seeing the whole batch. Resuming with the same number of ranks is
exact too. One DDP run trains LoRA adapters over a pretrained base (and resumes), against one process
doing the same. A second test launches through torchrun, whose environment variables run_training() reads. A
third compares the gradients of one update, before any optimizer step, with those of one process.
"""

import faulthandler
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from attn.artifacts.checkpoint import write_checkpoint
from attn.core.presets import preset
from attn.data.batches import IndexedBatches
from attn.data.collate import collate_translation
from attn.data.samplers import TokenBudgetSampler
from attn.models import build_model
from attn.training import run_training
from attn.training.runconfig import RunConfig
from attn.training.task_data import TaskData, translation_batch

STEPS = 4
RUNS = [  # (name, strategy, first stop, LoRA adapters over a pretrained base) in the two-process job
    ("ddp", "ddp", STEPS, False),
    ("ddp-lora-resumed", "ddp", STEPS // 2, True),
    ("fsdp", "fsdp", STEPS, False),
    ("fsdp-resumed", "fsdp", STEPS // 2, False),
]


def reversal_task(config, model_config, ctx):
    rng = random.Random(0)
    sources = [[rng.randrange(7, 97) for _ in range(rng.randint(2, 9))] for _ in range(48)]
    pairs = [(src, src[::-1]) for src in sources]
    sampler = TokenBudgetSampler([len(s) for s, _ in pairs], [len(t) + 1 for _, t in pairs], 60, 64, seed=0)

    def make(indices, epoch):
        return translation_batch(collate_translation([pairs[i] for i in indices], 0, 2, 3))

    batches = IndexedBatches(sampler, make, ctx.rank, ctx.world_size)
    return TaskData(model_config.replace(dropout=0.0), "forward", 0, batches, None)


def run_config(run_dir, *overrides):
    return RunConfig().override(
        f"run_dir={run_dir}", "model.preset=paper-base-tiny", "optim.schedule=noam", "optim.warmup_steps=2",
        "optim.clip=1.0", "batch.grad_accum=2", "train.quiet=true", "train.eval_interval=0", "train.log_interval=1",
        "train.checkpoint_interval=0", "train.device=cpu", "train.precision=fp32", f"train.max_steps={STEPS}",
        *overrides,
    )


def lora_overrides(root):
    """Rank-4 adapters on every layer over the model that `write_base` saved in `root`."""
    return (f"model.init_from={root}/base", "lora.rank=4",
            'lora.targets=["q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "down_proj"]', "optim.schedule=constant",
            "optim.lr=1e-2")


def write_base(root):
    torch.manual_seed(0)
    config = preset("paper-base-tiny")
    write_checkpoint(Path(root) / "base", build_model(config), config)


def worker(rank, world_size, root):
    faulthandler.dump_traceback_later(100, exit=True)  # a hung rank shows where it waits, then exits
    torch.set_num_threads(1)
    # One process group for all the runs, as under torchrun; run_training() finds it and keeps it. A file
    # rendezvous, because creating and destroying TCP stores in quick succession can hang.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=world_size)
    losses = {}
    for name, strategy, first_stop, lora in RUNS:
        config = run_config(f"{root}/{name}", f"train.strategy={strategy}", *(lora_overrides(root) if lora else ()))
        for stop in sorted({first_stop, STEPS}):
            run = run_training(config.override(f"train.max_steps={stop}"), task_builder=reversal_task)
            losses.setdefault(name, []).extend(run.losses)
    dist.destroy_process_group()
    if rank == 0:
        with open(f"{root}/losses.json", "w") as handle:
            json.dump(losses, handle)


def run_two_ranks(target, root):
    """Runs target(rank, 2, root) on two spawned processes; fails the test if they take over 120 s."""
    job = mp.start_processes(target, args=(2, str(root)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    while not job.join(timeout=5):
        if time.monotonic() > deadline:
            for process in job.processes:
                process.kill()
            pytest.fail("the two-process run did not finish within 120 s")


def test_two_ranks_match_one_process_and_resume_exactly(tmp_path):
    single = run_training(run_config(tmp_path / "single"), task_builder=reversal_task).losses
    write_base(tmp_path)
    single_lora = run_training(run_config(tmp_path / "single-lora", *lora_overrides(tmp_path)),
                               task_builder=reversal_task).losses
    run_two_ranks(worker, tmp_path)
    losses = json.loads((tmp_path / "losses.json").read_text())
    assert len(single) == STEPS and len(set(single)) == STEPS and len(set(single_lora)) == STEPS
    for name, _, _, lora in RUNS:
        assert losses[name] == pytest.approx(single_lora if lora else single, rel=1e-5, abs=1e-5), name
    assert losses["fsdp-resumed"] == losses["fsdp"]


LAUNCHED = """
import faulthandler, json, sys
faulthandler.dump_traceback_later(90, exit=True)  # a hung rank prints where it waits (seen once under CI load)
sys.path.insert(0, {here!r})
from test_ddp import reversal_task, run_config
import gc
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from attn.training import run_training
destroy = dist.destroy_process_group
def checked_destroy(*args, **kwargs):
    # The group must not outlive itself in a DDP wrapper: its destructor would then run later with the GIL held.
    alive = sum(isinstance(item, DistributedDataParallel) for item in gc.get_objects())
    print(f"DDP-AT-DESTROY {{alive}}", flush=True)  # one string: the ranks share stdout and may interleave
    destroy(*args, **kwargs)
dist.destroy_process_group = checked_destroy
result = run_training(run_config({run_dir!r}, "train.max_steps=2"), task_builder=reversal_task)
if result.checkpoint is not None:  # rank 0 only
    with open({losses!r}, "w") as handle:
        json.dump(result.losses, handle)
"""


def test_torchrun_launch_rendezvous_from_the_environment(tmp_path):
    """The way users run it: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT; run_training() joins and leaves."""
    script = tmp_path / "launched.py"
    losses = tmp_path / "losses.json"
    script.write_text(LAUNCHED.format(here=str(Path(__file__).parent), run_dir=str(tmp_path / "run"), losses=str(losses)))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("DDP-AT-DESTROY 0") == 2, done.stdout
    launched = json.loads(losses.read_text())
    single = run_training(run_config(tmp_path / "single", "train.max_steps=2"), task_builder=reversal_task).losses
    assert launched == pytest.approx(single, rel=1e-5, abs=1e-5)


# -- gradients of one update, before any optimizer step ------------------------------------------
# Adam divides by the gradient's running RMS, so the losses above hardly move when every gradient is
# off by a constant factor (a wrong world_size). This compares the gradients themselves. The ranks
# hold different numbers of scored targets (4 + 10 against 8 + 2, with padding in every batch):
# averaging each rank's own mean, or forgetting world_size, would weigh them wrongly.
RANK_PAIRS = [
    [  # rank 0: 4 and 10 scored targets (EOS included)
        [([11, 12, 13], [21]), ([14], [22])],
        [([15, 16, 17, 18], [23, 24, 25, 26, 27, 28, 29]), ([19, 20], [30])],
    ],
    [  # rank 1: 8 and 2
        [([31, 32], [41, 42, 43, 44, 45, 46]), ([33, 34, 35, 36, 37], [])],
        [([38], [47])],
    ],
]
STRATEGIES = ("ddp", "fsdp")


def micro_batches(rank_pairs):
    return [translation_batch(collate_translation(pairs, 0, 2, 3)) for pairs in rank_pairs]


def gradients_of_one_update(ctx, strategy):
    """The full gradients after one update's forward and backward passes on this rank's micro-batches."""
    from attn.models import build_model
    from attn.core.presets import preset
    from attn.training.config_sections import Strategy
    from attn.training.distributed import wrap_model
    from attn.training.update import Objective, TaskForward, accumulate_gradients

    torch.manual_seed(0)
    head = TaskForward(build_model(preset("paper-base-tiny").replace(dropout=0.0)), "forward")
    engine = wrap_model(head, ctx, Strategy(strategy)) if ctx is not None else head
    batches = micro_batches(RANK_PAIRS[ctx.rank]) if ctx is not None else micro_batches(sum(RANK_PAIRS, []))
    accumulate_gradients(engine, Objective(0, 0.1), batches, **({"ctx": ctx} if ctx is not None else {}))
    full = {}
    for name, p in head.named_parameters():
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # FSDP2: gather the shards
        full[name.replace("_fsdp_wrapped_module.", "")] = grad.detach().clone()
    return full


def gradient_worker(rank, world_size, root):
    from attn.training.distributed import DistContext

    faulthandler.dump_traceback_later(100, exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=world_size)
    ctx = DistContext(rank=rank, world_size=world_size, local_rank=rank)
    grads = {strategy: gradients_of_one_update(ctx, strategy) for strategy in STRATEGIES}
    dist.destroy_process_group()
    if rank == 0:
        torch.save(grads, f"{root}/grads.pt")


def test_two_ranks_give_the_gradient_of_one_process_before_the_first_step(tmp_path):
    sizes = [[b.n_targets for b in micro_batches(pairs)] for pairs in RANK_PAIRS]
    assert sizes == [[4, 10], [8, 2]]  # 14 against 10: uneven across ranks and micro-batches
    run_two_ranks(gradient_worker, tmp_path)
    expected = gradients_of_one_update(None, "ddp")
    scale = max(g.abs().max().item() for g in expected.values())
    assert scale > 1e-2
    for strategy, grads in torch.load(tmp_path / "grads.pt").items():
        assert grads.keys() == expected.keys(), strategy
        for name, grad in expected.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-6 * scale, rtol=1e-5, msg=f"{strategy} {name}")
