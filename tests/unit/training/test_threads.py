"""The training loop's CPU threads and row split: the chooser's decisions on made-up timings, and the loop that applies them."""

import threading

import pytest
import torch
from training_helpers import quick_config, reversal_builder

from attn.errors import ConfigError
from attn.training import train
from attn.training import trainer as trainer_module
from attn.training.logs import read_metrics
from attn.training.threads import Layout, ThreadChooser, candidate_layouts


def feed(chooser, seconds_per_token, updates, tokens=1000):
    """Reports `updates` updates, each at the seconds per token of the count it ran on; returns the choices."""
    choices = []
    for _ in range(updates):
        choice = chooser.observe(seconds_per_token[chooser.layout] * tokens, tokens)
        if choice is not None:
            choices.append(choice)
    return choices


def test_the_chooser_measures_each_count_in_turn_and_keeps_the_fastest():
    chooser = ThreadChooser((2, 1), probe_steps=3, revisit_s=60.0)
    ran = []
    for _ in range(6):
        ran.append(chooser.layout)
        choice = chooser.observe({2: 0.8, 1: 0.4}[chooser.layout], 1000)
    assert ran == [2, 1, 2, 1, 2, 1]
    assert choice.layout == chooser.layout == 1
    assert choice.tokens_per_s == {2: pytest.approx(1250.0), 1: pytest.approx(2500.0)}
    layouts = {Layout(2): 0.5, Layout(1, 2): 0.25, Layout(1): 0.4}
    (choice,) = feed(ThreadChooser(tuple(layouts)), layouts, 9, tokens=1)
    assert choice.record() == {"threads": 1, "workers": 2,
                               "threads_tokens_per_s": {"2": 2.0, "2x1": 4.0, "1": 2.5}}


def test_the_layouts_of_two_cores_are_both_cores_the_rows_split_between_them_and_one_core():
    assert candidate_layouts(2) == (Layout(2), Layout(1, 2), Layout(1))
    assert candidate_layouts(1) == (Layout(1),)


def test_on_an_idle_machine_it_goes_back_to_all_cores():
    chooser = ThreadChooser((2, 1))
    (choice,) = feed(chooser, {2: 2.7e-4, 1: 4.0e-4}, 6)
    assert choice.layout == chooser.layout == 2


def test_the_median_of_the_probe_ignores_one_descheduled_update():
    chooser = ThreadChooser((2, 1), probe_steps=3)
    for seconds in (0.27, 0.40, 5.0, 0.40, 0.27, 0.40):  # one 2-thread update was held up by another process
        choice = chooser.observe(seconds, 1000)
    assert choice.layout == 2


def test_taking_the_layouts_in_turn_spreads_a_slow_start_over_all_of_them():
    chooser = ThreadChooser((2, 1), probe_steps=3)
    speed = {2: 0.30, 1: 0.40}
    # The run's first two updates take twice as long (the optimizer's state, the first page faults).
    # Measured one layout after the other, 2 threads would get both and lose the round.
    for update in range(6):
        choice = chooser.observe(speed[chooser.layout] * (2 if update < 2 else 1), 1)
    assert choice.layout == 2
    assert choice.tokens_per_s == {2: pytest.approx(1 / 0.30), 1: pytest.approx(1 / 0.40)}


def test_it_measures_again_after_revisit_seconds_and_follows_the_load():
    chooser = ThreadChooser((2, 1), probe_steps=3, revisit_s=30.0)
    idle, busy = {2: 2.7e-4, 1: 4.0e-4}, {2: 8.0e-4, 1: 3.5e-4}
    assert [c.layout for c in feed(chooser, idle, 6)] == [2]
    assert feed(chooser, idle, 112) == [] and chooser.layout == 2  # the 112th 0.27 s update passes 30 s
    (choice,) = feed(chooser, busy, 6)  # then the machine gets busy: 3 + 3 probe updates
    assert choice.layout == chooser.layout == 1
    assert feed(chooser, busy, 80) == [] and chooser.layout == 1  # 28 s: not yet time to measure again


def test_a_probe_of_more_than_two_counts_ends_on_the_best_of_all():
    chooser = ThreadChooser((8, 4, 2, 1), probe_steps=2)
    (choice,) = feed(chooser, {8: 5.0, 4: 2.0, 2: 3.0, 1: 4.0}, 8)
    assert choice.layout == 4 and list(choice.tokens_per_s) == [8, 4, 2, 1]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def run_counting_layouts(monkeypatch, config, seconds_per_update):
    """Trains on a clock where an update takes `seconds_per_update[layout]` ("2", "2x1", "1"); returns
    (result, the layout of each update, torch's thread count in the loop's thread at each update)."""
    used, counts, now = [], [], [0.0]
    step = trainer_module.Trainer.train_step

    def counting_step(self, *args):
        counts.append(torch.get_num_threads())
        used.append(f"{self.split.workers}x{self.split.threads}" if self.split else str(counts[-1]))
        now[0] += seconds_per_update[used[-1]]
        return step(self, *args)

    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(trainer_module.Trainer, "train_step", counting_step)
    return train(config, task_builder=reversal_builder()), used, counts


def test_a_time_budgeted_cpu_run_trains_on_the_layout_it_measured_fastest(tmp_path, monkeypatch, two_threads):
    config = quick_config(tmp_path, "train.max_steps=1000", "train.max_minutes=0.5")
    result, used, _ = run_counting_layouts(monkeypatch, config, {"2": 3.0, "2x1": 2.0, "1": 1.0})
    assert used[:9] == ["2", "2x1", "1"] * 3 and set(used[9:]) == {"1"}
    assert result.step == len(used) == 9 + 12  # 9 + 6 + 3 s of probes, then 12 updates of 1 s to 30 s
    (record,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "threads" in r]
    assert record["step"] == 9 and (record["threads"], record["workers"]) == (1, 1)
    rates = record["threads_tokens_per_s"]
    assert rates["1"] > 1.5 * rates["2"]  # 3x the speed, on batches of somewhat different sizes
    assert torch.get_num_threads() == 2  # torch's count again after the loop


def test_when_the_split_is_fastest_the_run_trains_on_it_and_its_threads_end(tmp_path, monkeypatch, two_threads):
    config = quick_config(tmp_path, "train.max_steps=1000", "train.max_minutes=0.5")
    result, used, counts = run_counting_layouts(monkeypatch, config, {"2": 3.0, "2x1": 1.0, "1": 2.0})
    assert used[:9] == ["2", "2x1", "1"] * 3 and set(used[9:]) == {"2x1"}
    (record,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "threads" in r]
    assert (record["threads"], record["workers"]) == (1, 2)
    assert set(counts[9:]) == {2}  # the loop's own thread keeps both cores between the parts
    assert not [t for t in threading.enumerate() if t.name.startswith("attn-core")]


def test_a_run_without_a_budget_keeps_torchs_count(tmp_path, monkeypatch, two_threads):
    result, used, _ = run_counting_layouts(monkeypatch, quick_config(tmp_path, "train.max_steps=8"), {"2": 3.0, "1": 1.0})
    assert used == ["2"] * 8
    assert not [r for r in read_metrics(tmp_path / "metrics.jsonl") if "threads" in r]


def test_a_pinned_count_holds_for_the_loop_and_is_undone_after(tmp_path, monkeypatch, two_threads):
    config = quick_config(tmp_path, "train.max_steps=1000", "train.max_minutes=0.5", "train.threads=1")
    _, used, _ = run_counting_layouts(monkeypatch, config, {"2": 1.0, "1": 3.0})
    assert set(used) == {"1"} and torch.get_num_threads() == 2


def test_pinned_workers_split_every_update_with_or_without_a_budget(tmp_path, monkeypatch, two_threads):
    config = quick_config(tmp_path / "steps", "train.max_steps=5", "train.workers=2")
    _, used, _ = run_counting_layouts(monkeypatch, config, {"2x1": 1.0})
    assert used == ["2x1"] * 5
    config = quick_config(tmp_path / "budget", "train.max_steps=1000", "train.max_minutes=0.2", "train.workers=2")
    _, used, _ = run_counting_layouts(monkeypatch, config, {"2x1": 1.0})
    assert used == ["2x1"] * 12


def test_one_worker_keeps_the_whole_batch_and_still_measures_the_thread_count(tmp_path, monkeypatch, two_threads):
    config = quick_config(tmp_path, "train.max_steps=1000", "train.max_minutes=0.5", "train.workers=1")
    _, used, _ = run_counting_layouts(monkeypatch, config, {"2": 3.0, "1": 1.0})
    assert used[:6] == ["2", "1"] * 3 and set(used[6:]) == {"1"}


def test_a_negative_thread_count_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="threads"):
        quick_config(tmp_path, "train.threads=-1")
    with pytest.raises(ConfigError, match="workers"):
        quick_config(tmp_path, "train.workers=-1")


def test_after_a_slow_round_it_waits_ten_rounds_before_measuring_again():
    chooser = ThreadChooser((2, 1), probe_steps=3, revisit_s=10.0)
    slow = {2: 4.0e-3, 1: 1.0e-3}  # 4 s and 1 s updates: the round takes 15 s
    assert [c.layout for c in feed(chooser, slow, 6)] == [1]
    # 150 s of 1 s updates, then 3 measured ones; with revisit_s alone 2 threads would come back after 13
    assert feed(chooser, slow, 152) == [] and chooser.layout == 1
    assert feed(chooser, slow, 1) == [] and chooser.layout == 2
