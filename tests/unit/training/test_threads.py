"""The training loop's CPU threads: the chooser's decisions on made-up timings, and the loop that applies them."""

import pytest
import torch
from training_helpers import quick_config, reversal_builder

from attn.errors import ConfigError
from attn.training import train
from attn.training import trainer as trainer_module
from attn.training.logs import read_metrics
from attn.training.threads import ThreadChooser


def feed(chooser, seconds_per_token, updates, tokens=1000):
    """Reports `updates` updates, each at the seconds per token of the count it ran on; returns the choices."""
    choices = []
    for _ in range(updates):
        choice = chooser.observe(seconds_per_token[chooser.threads] * tokens, tokens)
        if choice is not None:
            choices.append(choice)
    return choices


def test_the_chooser_measures_each_count_in_turn_and_keeps_the_fastest():
    chooser = ThreadChooser((2, 1), probe_steps=3, revisit_s=60.0)
    ran = []
    for _ in range(6):
        ran.append(chooser.threads)
        choice = chooser.observe({2: 0.8, 1: 0.4}[chooser.threads], 1000)
    assert ran == [2, 2, 2, 1, 1, 1]
    assert choice.threads == chooser.threads == 1
    assert choice.tokens_per_s == {2: pytest.approx(1250.0), 1: pytest.approx(2500.0)}
    assert choice.record() == {"threads": 1, "threads_tokens_per_s": {"2": 1250.0, "1": 2500.0}}


def test_on_an_idle_machine_it_goes_back_to_all_cores():
    chooser = ThreadChooser((2, 1))
    (choice,) = feed(chooser, {2: 2.7e-4, 1: 4.0e-4}, 6)
    assert choice.threads == chooser.threads == 2


def test_the_median_of_the_probe_ignores_one_descheduled_update():
    chooser = ThreadChooser((2, 1), probe_steps=3)
    for seconds in (0.27, 5.0, 0.27, 0.40, 0.40, 0.40):  # one 2-thread update was held up by another process
        choice = chooser.observe(seconds, 1000)
    assert choice.threads == 2


def test_it_measures_again_after_revisit_seconds_and_follows_the_load():
    chooser = ThreadChooser((2, 1), probe_steps=3, revisit_s=30.0)
    idle, busy = {2: 2.7e-4, 1: 4.0e-4}, {2: 8.0e-4, 1: 3.5e-4}
    assert [c.threads for c in feed(chooser, idle, 6)] == [2]
    assert feed(chooser, idle, 112) == [] and chooser.threads == 2  # the 112th 0.27 s update passes 30 s
    (choice,) = feed(chooser, busy, 6)  # then the machine gets busy: 3 + 3 probe updates
    assert choice.threads == chooser.threads == 1
    assert feed(chooser, busy, 80) == [] and chooser.threads == 1  # 28 s: not yet time to measure again


def test_a_probe_of_more_than_two_counts_ends_on_the_best_of_all():
    chooser = ThreadChooser((8, 4, 2, 1), probe_steps=2)
    (choice,) = feed(chooser, {8: 5.0, 4: 2.0, 2: 3.0, 1: 4.0}, 8)
    assert choice.threads == 4 and list(choice.tokens_per_s) == [8, 4, 2, 1]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def run_counting_threads(monkeypatch, config, seconds_per_update):
    """Trains on a clock where an update takes `seconds_per_update[threads]`; returns (result, threads per update)."""
    used, now = [], [0.0]
    step = trainer_module.Trainer.train_step

    def counting_step(self, *args):
        used.append(torch.get_num_threads())
        now[0] += seconds_per_update[used[-1]]
        return step(self, *args)

    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(trainer_module.Trainer, "train_step", counting_step)
    return train(config, task_builder=reversal_builder()), used


def test_a_time_budgeted_cpu_run_trains_on_the_count_it_measured_fastest(tmp_path, monkeypatch, two_threads):
    config = quick_config(tmp_path, "train.max_steps=1000", "train.max_minutes=0.5")
    result, used = run_counting_threads(monkeypatch, config, {2: 3.0, 1: 1.0})
    assert used[:6] == [2, 2, 2, 1, 1, 1] and set(used[6:]) == {1}
    assert result.step == len(used) == 6 + 18  # 9 s + 3 s of probes, then 18 updates of 1 s to 30 s
    (record,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "threads" in r]
    assert record["step"] == 6 and record["threads"] == 1
    rates = record["threads_tokens_per_s"]
    assert rates["1"] > 1.5 * rates["2"]  # 3x the speed, on batches of somewhat different sizes
    assert torch.get_num_threads() == 2  # torch's count again after the loop


def test_a_run_without_a_budget_keeps_torchs_count(tmp_path, monkeypatch, two_threads):
    result, used = run_counting_threads(monkeypatch, quick_config(tmp_path, "train.max_steps=8"), {2: 3.0, 1: 1.0})
    assert used == [2] * 8
    assert not [r for r in read_metrics(tmp_path / "metrics.jsonl") if "threads" in r]


def test_a_pinned_count_holds_for_the_loop_and_is_undone_after(tmp_path, monkeypatch, two_threads):
    config = quick_config(tmp_path, "train.max_steps=1000", "train.max_minutes=0.5", "train.threads=1")
    _, used = run_counting_threads(monkeypatch, config, {2: 1.0, 1: 3.0})
    assert set(used) == {1} and torch.get_num_threads() == 2


def test_a_negative_thread_count_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="threads"):
        quick_config(tmp_path, "train.threads=-1")


def test_after_a_slow_round_it_waits_ten_rounds_before_measuring_again():
    chooser = ThreadChooser((2, 1), probe_steps=3, revisit_s=10.0)
    slow = {2: 4.0e-3, 1: 1.0e-3}  # 4 s and 1 s updates: the round takes 15 s
    assert [c.threads for c in feed(chooser, slow, 6)] == [1]
    # 150 s of 1 s updates, then 3 measured ones; with revisit_s alone 2 threads would come back after 13
    assert feed(chooser, slow, 152) == [] and chooser.threads == 1
    assert feed(chooser, slow, 1) == [] and chooser.threads == 2
