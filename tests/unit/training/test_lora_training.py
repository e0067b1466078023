"""LoRA and QLoRA runs ([lora]): only the adapters train and are saved, the base is named and fingerprinted, resume
is exact, and load_model gives the base with the trained adapters."""

from pathlib import Path

import pytest
import safetensors.torch
import torch

from attn.app.cli import main
from attn.app.tasks import get_task
from attn.artifacts import load_model
from attn.artifacts.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    write_checkpoint,
)
from attn.artifacts.lora_runs import LORA_FILE, fingerprint
from attn.core.errors import CheckpointError, ConfigError
from attn.core.lora import LoRALinear, lora_state_dict
from attn.core.presets import preset
from attn.core.quantized import Int8Linear
from attn.data.tokenizers import Tokenizer
from attn.models import build_model
from attn.training import run_training
from attn.training.runconfig import RunConfig

DATA = Path(__file__).parents[3] / "data" / "shakespeare" / "valid.txt"
TARGETS = '["q_proj", "v_proj", "down_proj"]'


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny pretrained Llama-style model with a character tokenizer, and text to fine-tune it on."""
    folder = tmp_path_factory.mktemp("lora")
    text = DATA.read_text(encoding="utf-8")[:3000]
    (folder / "train.txt").write_text(text, encoding="utf-8")
    tokenizer = Tokenizer.train_chars([text])
    config = preset("smollm2-135m-tiny").replace(vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    write_checkpoint(folder / "base", build_model(config), config, tokenizer=tokenizer)
    return folder


def lora_config(base, run_dir, *overrides):
    return RunConfig().override(
        "task=lm", f"model.init_from={base / 'base'}", f"data.train={base / 'train.txt'}",
        f"data.valid={base / 'train.txt'}", f"run_dir={run_dir}", "batch.block_size=16", "batch.batch_size=4",
        "train.max_steps=4", "train.quiet=true", "train.device=cpu", "train.precision=fp32", "train.eval_interval=2",
        "train.eval_batches=1", "train.checkpoint_interval=0", "optim.optimizer=adamw", "optim.schedule=constant",
        "optim.lr=1e-2", "optim.warmup_steps=0", "lora.rank=4", "lora.alpha=8", "lora.dropout=0.1",
        f"lora.targets={TARGETS}", *overrides,
    )


def train(config):
    return run_training(config, task_builder=get_task("lm").build)


def test_only_the_adapters_train_and_are_saved(base, tmp_path):
    result = train(lora_config(base, tmp_path / "run"))
    assert result.losses[-1] < result.losses[0]
    saved = safetensors.torch.load_file(result.checkpoint / "model.safetensors")
    bundle = load_model(tmp_path / "run", "cpu")
    assert set(saved) == set(lora_state_dict(bundle.model)) and all(key.endswith((".A", ".B")) for key in saved)
    layers = 2 * preset("smollm2-135m-tiny").decoder_layers  # attn.qkv (q and v) and ffn.w2 of each block
    assert len([m for m in bundle.model.modules() if isinstance(m, LoRALinear)]) == layers
    pretrained = load_model(base / "base", "cpu").model.state_dict()
    tuned = bundle.model.state_dict()
    for key, value in pretrained.items():  # the base's weights came through training untouched
        assert torch.equal(tuned[key.replace("qkv.", "qkv.base.").replace("w2.", "w2.base.")], value), key
    assert any(not torch.equal(value, torch.zeros_like(value)) for key, value in saved.items() if key.endswith(".B"))
    base_size = (base / "base" / "model.safetensors").stat().st_size
    assert (result.checkpoint / "model.safetensors").stat().st_size < base_size / 10
    state = torch.load(result.checkpoint / "trainer_state.pt", weights_only=True)
    moments = {name.removeprefix("model.") for name in state["optimizer"]["state"]}
    assert moments == set(saved)  # AdamW's moments for the adapters alone


def test_load_model_gives_the_trained_adapters(base, tmp_path):
    train(lora_config(base, tmp_path / "run", "train.max_steps=2"))
    bundle = load_model(tmp_path / "run", "cpu")
    tokens = torch.tensor([bundle.tokenizer.encode("To be, or not")])
    checkpoint = load_checkpoint(tmp_path / "run", base=load_model(base / "base", "cpu").model)
    torch.testing.assert_close(bundle.model(tokens), checkpoint.model(tokens), atol=0, rtol=0)
    with pytest.raises(CheckpointError, match="load_model"):
        load_checkpoint(tmp_path / "run")


def test_resume_is_exact(base, tmp_path):
    config = lora_config(base, tmp_path / "straight")
    straight = train(config)
    split = config.override(f"run_dir={tmp_path / 'split'}")
    first = train(split.override("train.max_steps=2"))
    second = train(split)
    assert first.losses + second.losses == straight.losses
    a, b = (safetensors.torch.load_file(latest_checkpoint(tmp_path / name) / "model.safetensors")
            for name in ("straight", "split"))
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_a_changed_base_is_refused_on_resume_and_load(base, tmp_path):
    moved = tmp_path / "base"
    bundle = load_model(base / "base", "cpu")
    write_checkpoint(moved, bundle.model, bundle.model_config, tokenizer=bundle.tokenizer)
    config = lora_config(base, tmp_path / "run", f"model.init_from={moved}", "train.max_steps=2")
    train(config)
    with torch.no_grad():
        bundle.model.blocks[0].ffn.w2.weight[0, 0] += 1e-3
    write_checkpoint(moved, bundle.model, bundle.model_config, tokenizer=bundle.tokenizer)
    assert fingerprint(bundle.model) != fingerprint(load_model(base / "base", "cpu").model)
    with pytest.raises(CheckpointError, match="has changed since its LoRA adapters were trained"):
        load_model(tmp_path / "run", "cpu")
    with pytest.raises(CheckpointError, match="has changed"):
        train(config.override("train.max_steps=4"))


def test_resuming_with_other_lora_settings_is_refused(base, tmp_path):
    config = lora_config(base, tmp_path / "run", "train.max_steps=2")
    train(config)
    with pytest.raises(CheckpointError, match="resume with the run's \\[lora\\] settings"):
        train(config.override("train.max_steps=4", "lora.rank=8"))


def test_qlora_over_an_int8_base_trains_and_resumes(base, tmp_path):
    config = lora_config(base, tmp_path / "run", "lora.base=int8", "train.max_steps=2")
    first = train(config)
    second = train(config.override("train.max_steps=4"))
    assert second.losses[-1] < first.losses[0]
    bundle = load_model(tmp_path / "run", "cpu")
    assert isinstance(bundle.model.blocks[0].attn.qkv.base, Int8Linear)
    assert (latest_checkpoint(tmp_path / "run") / LORA_FILE).is_file()


@pytest.mark.parametrize(("overrides", "field"), [
    (["lora.rank=4"], "lora.rank"),
    (["lora.rank=4", "model.init_from=x", "train.strategy=fsdp"], "train.strategy"),
    (["lora.targets=[\"query\"]"], "lora.targets"),
    (["lora.base=int2"], "lora.base"),
    (["lora.rank=-1"], "lora.rank"),
])
def test_bad_lora_settings_name_the_key(overrides, field):
    with pytest.raises(ConfigError) as err:
        RunConfig().override(*overrides)
    assert err.value.field == field


def test_convert_exports_a_lora_run_with_its_adapters_merged(base, tmp_path):
    train(lora_config(base, tmp_path / "run", "train.max_steps=2"))
    assert main(["convert", str(tmp_path / "run"), str(tmp_path / "hf"), "--to", "llama"]) == 0
    tuned, exported = load_model(tmp_path / "run", "cpu"), load_model(tmp_path / "hf", "cpu")
    tokens = torch.tensor([tuned.tokenizer.encode("To be, or not")])
    torch.testing.assert_close(exported.model(tokens), tuned.model(tokens), atol=1e-5, rtol=1e-5)
