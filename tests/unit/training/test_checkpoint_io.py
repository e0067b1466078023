"""Checkpoint directories: round trips, clear errors, atomic writes, pruning, averaging, RNG state."""

import json
import random

import numpy as np
import pytest
import safetensors.torch
import torch

from attn.artifacts import checkpoint as ckpt
from attn.data.tokenizers import Tokenizer
from attn.core.errors import CheckpointError
from attn.models import build_model
from attn.core.presets import preset
from attn.training import finetune, retention, rng
from attn.training.runconfig import RunConfig

ARCHITECTURES = ["paper-base-tiny", "gpt2-tiny", "bert-base-tiny"]


def tiny(name="paper-base-tiny", seed=0):
    torch.manual_seed(seed)
    config = preset(name)
    return build_model(config), config


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_round_trip_keeps_weights_configs_tokenizer_and_ties(tmp_path, name):
    model, config = tiny(name)
    run = RunConfig().override("task=lm", "train.max_steps=7")
    tokenizer = Tokenizer.train_chars(["to be or not to be"])
    path = ckpt.write_checkpoint(tmp_path / "c", model, config, run.to_dict(), {"step": 7}, tokenizer, {"task": "lm"})
    loaded = ckpt.load_checkpoint(path, with_state=True)
    assert_same_weights(loaded.model, model)
    assert loaded.model_config == config and RunConfig.from_dict(loaded.run_config) == run
    assert loaded.state == {"step": 7}
    assert loaded.task_info == {"task": "lm"}
    assert loaded.tokenizer.encode("not to be") == tokenizer.encode("not to be")
    out = loaded.model.lm_head if name == "gpt2-tiny" else None
    if out is not None:  # the tied output projection is still the embedding matrix
        assert out.weight is loaded.model.embeddings.tokens.weight


def test_missing_files_are_named(tmp_path):
    model, config = tiny()
    path = ckpt.write_checkpoint(tmp_path / "c", model, config)
    with pytest.raises(CheckpointError, match="trainer_state.pt: no such file"):
        ckpt.load_checkpoint(path, with_state=True)
    (path / ckpt.MODEL_FILE).unlink()
    with pytest.raises(CheckpointError, match="model.safetensors: no such file"):
        ckpt.load_checkpoint(path)
    (path / ckpt.MODEL_CONFIG_FILE).unlink()
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        ckpt.load_checkpoint(path)


def test_weights_of_another_model_name_the_keys(tmp_path):
    model, config = tiny()
    path = ckpt.write_checkpoint(tmp_path / "c", model, config)
    other = config.replace(encoder_layers=1).to_dict()
    (path / ckpt.MODEL_CONFIG_FILE).write_text(json.dumps(other))
    with pytest.raises(CheckpointError, match=r"unexpected keys \['encoder.blocks.1"):
        ckpt.load_checkpoint(path)
    (path / ckpt.MODEL_CONFIG_FILE).write_text(json.dumps(config.replace(d_ff=48).to_dict()))
    with pytest.raises(CheckpointError, match="size mismatch"):
        ckpt.load_checkpoint(path)
    (path / ckpt.MODEL_CONFIG_FILE).write_text(json.dumps({**config.to_dict(), "colour": "blue"}))
    with pytest.raises(CheckpointError, match="model_config.json: colour"):
        ckpt.load_checkpoint(path)


def save(run_dir, step, model, config, **kwargs):
    return retention.save_checkpoint(run_dir, step, ckpt.Checkpoint(model, config, state={"step": step}), **kwargs)


def test_a_failure_while_writing_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    model, config = tiny()
    save(tmp_path, 1, model, config)
    changed, _ = tiny(seed=1)

    def torn_save(obj, file):
        with open(file, "wb") as handle:
            handle.write(b"\x80\x02partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", torn_save)
    with pytest.raises(OSError, match="No space"):
        save(tmp_path, 2, changed, config)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000001"]
    assert not [p for p in (tmp_path / ckpt.CHECKPOINTS).iterdir() if p.name.startswith(".")]
    loaded = ckpt.load_checkpoint(tmp_path, with_state=True)
    assert loaded.path.name == "step-00000001" and loaded.state == {"step": 1}
    assert_same_weights(loaded.model, model)


def test_a_crash_between_rename_and_pointer_leaves_two_loadable_checkpoints(tmp_path, monkeypatch):
    model, config = tiny()
    save(tmp_path, 1, model, config)
    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(retention, "_write_pointer", killed)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 2, tiny(seed=1)[0], config)
    assert ckpt.load_checkpoint(tmp_path).path.name == "step-00000001"  # the pointer was not moved
    assert ckpt.load_checkpoint(tmp_path / ckpt.CHECKPOINTS / "step-00000002").model_config == config


def test_leftovers_of_a_killed_write_are_ignored_then_removed(tmp_path):
    model, config = tiny()
    save(tmp_path, 1, model, config)
    leftover = tmp_path / ckpt.CHECKPOINTS / ".tmp-step-00000002-dead"
    leftover.mkdir()
    (leftover / ckpt.MODEL_FILE).write_bytes(b"torn")
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000001"]
    save(tmp_path, 2, model, config)
    assert not leftover.exists()


def test_keeps_the_last_k_and_the_best(tmp_path):
    model, config = tiny()
    for step in range(1, 7):
        save(tmp_path, step, model, config, keep_last=2, is_best=step == 2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000005", "step-00000006"]
    assert ckpt.best_checkpoint(tmp_path).name == "step-00000002"
    assert ckpt.latest_checkpoint(tmp_path).name == "step-00000006"
    assert [p.name for p in retention.last_checkpoints(tmp_path, 2)] == ["step-00000005", "step-00000006"]
    with pytest.raises(CheckpointError, match="the run has 3"):
        retention.last_checkpoints(tmp_path, 5)


def test_refuses_to_write_nan_weights(tmp_path):
    model, config = tiny()
    with torch.no_grad():
        model.blocks[0].ffn.w1.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"blocks\.0\.ffn\.w1\.weight.*NaN"):
        save(tmp_path, 1, model, config)
    assert ckpt.list_checkpoints(tmp_path) == []


def test_average_of_checkpoints_is_the_elementwise_mean(tmp_path):
    (first, config), (second, _), (third, _) = tiny(seed=0), tiny(seed=1), tiny(seed=2)
    models = (first, second, third)
    paths = [ckpt.write_checkpoint(tmp_path / f"c{i}", m, config) for i, m in enumerate(models)]
    averaged = retention.average_checkpoints(paths)
    for key, tensor in first.state_dict().items():
        expected = (tensor.double() + second.state_dict()[key].double() + third.state_dict()[key].double()) / 3
        torch.testing.assert_close(averaged[key], expected.float(), rtol=0, atol=1e-5)
    out = retention.write_averaged_checkpoint(paths, tmp_path / "averaged")
    loaded = ckpt.load_checkpoint(out)
    torch.testing.assert_close(loaded.model.state_dict(), averaged)
    assert loaded.model.lm_head.weight is loaded.model.embeddings.tokens.weight
    assert not (out / ckpt.STATE_FILE).exists()


@pytest.mark.parametrize("name, fields, old", [
    ("paper-base-tiny", {"tying": "none", "output_bias": True}, "generator."),
    ("paper-base-tiny", {}, "generator."),
    ("bert-base-tiny", {}, "mlm.output."),
    ("bert-base-tiny", {"tying": "none"}, "mlm.output."),
])
def test_a_checkpoint_with_the_old_names_of_the_vocabulary_projection_loads(tmp_path, name, fields, old):
    torch.manual_seed(0)
    config = preset(name).replace(**fields)
    model = build_model(config)
    path = ckpt.write_checkpoint(tmp_path / "c", model, config)
    stored = safetensors.torch.load_file(path / ckpt.MODEL_FILE)
    renamed = {key.replace("lm_head.", old): tensor for key, tensor in stored.items()}
    safetensors.torch.save_file(renamed, path / ckpt.MODEL_FILE)
    assert_same_weights(ckpt.load_checkpoint(path).model, model)


def test_averaging_different_models_is_refused(tmp_path):
    model, config = tiny()
    other, other_config = tiny("gpt2-tiny")
    paths = [
        ckpt.write_checkpoint(tmp_path / "a", model, config),
        ckpt.write_checkpoint(tmp_path / "b", other, other_config),
    ]
    with pytest.raises(CheckpointError, match="differs .* in 'architecture'"):
        retention.average_checkpoints(paths)
    with pytest.raises(CheckpointError, match="no checkpoints"):
        retention.average_checkpoints([])


def test_rng_state_survives_a_weights_only_round_trip(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    torch.save(rng.capture_rng(), tmp_path / "rng.pt")
    first = (random.random(), np.random.rand(), torch.rand(1).item(), np.random.randn())
    rng.restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1).item(), np.random.randn()) == first


def test_fine_tuning_without_the_pooler_leaves_its_weights_behind():
    config = preset("bert-base-tiny").replace(num_labels=0)
    pretrained = build_model(config)
    target = build_model(config.replace(pooler=False, pooling="mean", num_labels=2))
    fresh = finetune.copy_pretrained(ckpt.Checkpoint(pretrained, config, None, None, None, {}), target)
    assert fresh == ["classifier.bias", "classifier.weight"]
    source = pretrained.state_dict()
    for name, tensor in target.state_dict().items():
        if not name.startswith("classifier."):
            assert torch.equal(tensor, source[name]), name


def test_fine_tuning_into_other_sizes_is_refused():
    pretrained, config = tiny("bert-base-tiny")
    target = build_model(config.replace(d_ff=48))
    with pytest.raises(CheckpointError, match="does not fit the model"):
        finetune.copy_pretrained(ckpt.Checkpoint(pretrained, config, None, None, None, {}), target)
