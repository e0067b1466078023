"""Pre-flight checks (run directory, free disk space) and checkpoint writes that fail half-way."""

import collections
import errno

import pytest
import torch
from training_helpers import quick_config, reversal_builder

from attn.app.cli import main
from attn.artifacts import checkpoint as ckpt
from attn.artifacts.checkpoint import CheckpointWriteError
from attn.data import files
from attn.core.errors import CheckpointError, TrainingError
from attn.models import build_model
from attn.core.presets import preset
from attn.training import preflight, retention, run_training

MiB = 2**20
DiskUsage = collections.namedtuple("DiskUsage", "total used free")


def never_called(*args):
    raise AssertionError("the run built its task (tokenizer, data) before the pre-flight checks failed")


def test_the_checkpoint_size_estimate():
    # 1M parameters: 4 MB of weights, 8 MB of Adam moments, 16 MiB of margin.
    assert preflight.checkpoint_bytes(1_000_000) == 12_000_000 + 16 * MiB
    assert preflight.required_disk_bytes(1_000_000) == 2 * (12_000_000 + 16 * MiB) + 64 * MiB
    assert preflight.parameter_count(preset("paper-base")) == 63_082_496
    assert preflight.required_disk_bytes(63_082_496) == 1_614_643_200  # about 1.5 GiB for the paper's base model


def test_the_estimate_bounds_a_real_checkpoint(tmp_path):
    config = quick_config(tmp_path / "run", "train.max_steps=1")
    checkpoint = run_training(config, task_builder=reversal_builder()).checkpoint
    n_params = preflight.parameter_count(preset("paper-base-tiny"))
    size = sum(file.stat().st_size for file in checkpoint.iterdir())
    assert 12 * n_params < size < preflight.checkpoint_bytes(n_params)


def test_a_run_dir_that_is_a_file_fails_before_anything_is_built(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.write_text("not a directory")
    with pytest.raises(TrainingError, match=rf"run_dir {run_dir} is a file, not a directory; set run_dir"):
        run_training(quick_config(run_dir), task_builder=never_called)


def test_a_run_dir_under_a_file_names_the_path(tmp_path):
    (tmp_path / "file").write_text("")
    run_dir = tmp_path / "file" / "run"
    with pytest.raises(TrainingError, match=rf"run_dir {run_dir} cannot be created .*Not a directory"):
        run_training(quick_config(run_dir), task_builder=never_called)


def test_an_unwritable_parent_names_the_path_and_the_fix(tmp_path, monkeypatch):
    parent = tmp_path / "readonly"

    def refuse(self, *args, **kwargs):  # the tests may run as root, whom permissions do not stop
        raise PermissionError(errno.EACCES, "Permission denied", str(parent))

    monkeypatch.setattr(type(parent), "mkdir", refuse)
    message = rf"\(Permission denied: {parent}\); choose a run_dir .* or fix the permissions of {parent}$"
    with pytest.raises(TrainingError, match=message):
        preflight.check_run_dir(parent / "run")


def test_a_full_disk_fails_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: DiskUsage(100 * MiB, 90 * MiB, 10 * MiB))
    n_params = preflight.parameter_count(preset("paper-base-tiny"))
    needed = preflight.required_disk_bytes(n_params) / MiB
    message = rf"has 10 MiB free, the run needs about {needed:.0f} MiB \(two checkpoints of {n_params:,} parameters"
    with pytest.raises(TrainingError, match=message):
        run_training(quick_config(tmp_path / "run"), task_builder=never_called)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: DiskUsage(100 * MiB, 0, round(needed * MiB)))
    assert run_training(quick_config(tmp_path / "run", "train.max_steps=1"), task_builder=reversal_builder()).step == 1


def test_the_cli_prints_a_preflight_error_on_one_line(tmp_path, capsys):
    (tmp_path / "run").write_text("")
    config = tmp_path / "run.toml"
    config.write_text(f'run_dir = "{tmp_path / "run"}"\n[model]\npreset = "paper-base-tiny"\n')
    assert main(["train", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"attn: error: run_dir {tmp_path / 'run'} is a file") and err.count("\n") == 1


# -- a checkpoint write that fails half-way -------------------------------------------------------


def tiny(seed):
    torch.manual_seed(seed)
    return build_model(preset("paper-base-tiny"))


def save(run_dir, step, model):
    contents = ckpt.Checkpoint(model, preset("paper-base-tiny"), state={"step": step})
    return retention.save_checkpoint(run_dir, step, contents)


def assert_previous_checkpoint_intact(run_dir, model):
    folder = run_dir / ckpt.CHECKPOINTS
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["step-00000001"]
    assert (folder / ckpt.LATEST).read_text().strip() == "step-00000001"
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]
    loaded = ckpt.load_checkpoint(run_dir, with_state=True)
    assert loaded.state == {"step": 1}
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name


def test_a_full_disk_while_writing_the_weights_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = tiny(0)
    save(tmp_path, 1, model)

    def torn_save(model, file, **options):
        with open(file, "wb") as handle:
            handle.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt.safetensors.torch, "save_model", torn_save)
    target = tmp_path / ckpt.CHECKPOINTS / "step-00000002"
    message = rf"{target}: cannot write the checkpoint \(\[Errno 28\] No space left on device\); the previous"
    with pytest.raises(CheckpointError, match=message) as caught:
        save(tmp_path, 2, tiny(1))
    assert isinstance(caught.value, OSError) and isinstance(caught.value.__cause__, OSError)
    assert_previous_checkpoint_intact(tmp_path, model)


def failing_rename_of_staging(real_replace):
    def replace(source, target):
        if str(source).rpartition("/")[2].startswith(".tmp-"):
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(source, target)

    return replace


def test_a_failed_rename_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = tiny(0)
    save(tmp_path, 1, model)
    monkeypatch.setattr(files.os, "replace", failing_rename_of_staging(files.os.replace))
    with pytest.raises(CheckpointWriteError, match="Input/output error"):
        save(tmp_path, 2, tiny(1))
    assert_previous_checkpoint_intact(tmp_path, model)


def test_a_failed_rename_onto_a_checkpoint_of_the_same_name_puts_the_old_one_back(tmp_path, monkeypatch):
    model = tiny(0)
    save(tmp_path, 1, model)
    monkeypatch.setattr(files.os, "replace", failing_rename_of_staging(files.os.replace))
    with pytest.raises(CheckpointWriteError):
        save(tmp_path, 1, tiny(1))  # the old step-00000001 is moved aside before the rename fails
    assert_previous_checkpoint_intact(tmp_path, model)


def test_training_stops_with_a_checkpoint_error_when_the_disk_fills(tmp_path, monkeypatch):
    real_save = ckpt.safetensors.torch.save_model
    calls = []

    def fills_up(model, file, **options):
        calls.append(file)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(model, file)

    monkeypatch.setattr(ckpt.safetensors.torch, "save_model", fills_up)
    config = quick_config(tmp_path, "train.checkpoint_interval=1", "train.max_steps=3")
    with pytest.raises(CheckpointError, match="step-00000002: cannot write the checkpoint"):
        run_training(config, task_builder=reversal_builder())
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000001"]
    assert ckpt.load_checkpoint(tmp_path, with_state=True).state["step"] == 1
