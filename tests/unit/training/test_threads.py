"""The training loop's CPU threads: the probe's choice on made-up timings, and the loop that applies it."""

import time

import pytest
import torch
from training_helpers import quick_config, reversal_builder

from attn.core.errors import ConfigError
from attn.training import machine as machine_module
from attn.training import run_training
from attn.training import trainer as trainer_module
from attn.training.logs import read_metrics
from attn.training.threads import ThreadChoice, probe_threads


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def fake_pass(seconds_at, now, ran):
    """A pass that advances the clock `now` by `seconds_at[count][i]` on its i-th run at the current count."""

    def run_pass():
        count = torch.get_num_threads()
        ran.append(count)
        now[0] += seconds_at[count][sum(1 for c in ran if c == count) - 1]

    return run_pass


def test_the_probe_takes_the_counts_in_turn_and_keeps_the_shortest_median(monkeypatch, two_threads):
    now, ran = [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    seconds = {2: [8.0, 0.75, 0.75, 0.75], 1: [6.0, 0.5, 0.5, 4.0]}  # slow first passes; one descheduled pass at 1
    choice = probe_threads(fake_pass(seconds, now, ran), (2, 1), passes=3)
    assert ran == [2, 1, 2, 1, 2, 1, 2, 1]  # one untimed pass at each count, then the counts in rotation
    assert choice == ThreadChoice(1, {2: 0.75, 1: 0.5})
    assert choice.record() == {"threads": 1, "threads_probe_ms": {"2": 750.0, "1": 500.0}}
    assert torch.get_num_threads() == 2  # restored after the probe


def test_on_an_idle_machine_the_probe_keeps_all_threads(monkeypatch, two_threads):
    now, ran = [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    seconds = {2: [0.3] * 4, 1: [0.4] * 4}
    assert probe_threads(fake_pass(seconds, now, ran), (2, 1)).threads == 2


def run_counting_threads(monkeypatch, config, seconds_at):
    """Trains with every forward and backward pass taking `seconds_at[threads]` on a fake clock; returns
    (result, torch's thread count at each update)."""
    counts, now = [], [0.0]
    accumulate, step = trainer_module.accumulate_gradients, trainer_module.Trainer.train_step

    def timed_accumulate(*args, **kwargs):
        now[0] += seconds_at[torch.get_num_threads()]
        return accumulate(*args, **kwargs)

    def counting_step(self, *args):
        counts.append(torch.get_num_threads())
        return step(self, *args)

    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(trainer_module, "accumulate_gradients", timed_accumulate)
    monkeypatch.setattr(machine_module, "accumulate_gradients", timed_accumulate)
    monkeypatch.setattr(trainer_module.Trainer, "train_step", counting_step)
    return run_training(config, task_builder=reversal_builder()), counts


def test_a_time_budgeted_cpu_run_probes_once_and_trains_on_the_fastest_count(tmp_path, monkeypatch, two_threads):
    config = quick_config(tmp_path, "train.max_steps=1000", "train.max_minutes=0.5")
    result, counts = run_counting_threads(monkeypatch, config, {2: 3.0, 1: 1.0})
    assert set(counts) == {1} and result.step == len(counts) == 30  # the probe's passes are not training time
    (record,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "threads" in r]
    assert record == {"step": 0, "threads": 1, "threads_probe_ms": {"2": 3000.0, "1": 1000.0}}
    assert torch.get_num_threads() == 2  # torch's count again after the loop


def test_the_probe_leaves_the_run_as_it_was(tmp_path, two_threads):
    """The probe's passes draw dropout masks, take a batch and leave gradients: a budgeted run that probes
    and one pinned to the count it chose make the same updates."""
    builder, budget = reversal_builder(dropout=0.1), ("train.max_steps=3", "train.max_minutes=60")
    probed = run_training(quick_config(tmp_path / "probed", *budget), task_builder=builder).losses
    (record,) = [r for r in read_metrics(tmp_path / "probed" / "metrics.jsonl") if "threads" in r]
    pinned = quick_config(tmp_path / "pinned", *budget, f"train.threads={record['threads']}")
    assert run_training(pinned, task_builder=builder).losses == probed


def test_a_run_without_a_budget_keeps_torchs_count(tmp_path, monkeypatch, two_threads):
    _, counts = run_counting_threads(monkeypatch, quick_config(tmp_path, "train.max_steps=8"), {2: 3.0, 1: 1.0})
    assert counts == [2] * 8
    assert not [r for r in read_metrics(tmp_path / "metrics.jsonl") if "threads" in r]


def test_a_pinned_count_holds_for_the_loop_and_is_undone_after(tmp_path, monkeypatch, two_threads):
    config = quick_config(tmp_path, "train.max_steps=1000", "train.max_minutes=0.5", "train.threads=1")
    _, counts = run_counting_threads(monkeypatch, config, {2: 1.0, 1: 3.0})
    assert set(counts) == {1} and torch.get_num_threads() == 2


def test_a_negative_thread_count_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="threads"):
        quick_config(tmp_path, "train.threads=-1")
