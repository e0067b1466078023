"""Loading never runs code from a file, and names read from disk never lead out of the run.

A pickle can run any function while it is read. The tests plant one that creates a marker file
in every place `attn` reads a PyTorch pickle (a checkpoint's `trainer_state.pt`, a Hugging Face
`pytorch_model.bin`) and check that every public entry point refuses it without creating the marker.
"""

import ast
import re
from pathlib import Path

import pytest
import torch

from attn.app.cli import main
from attn.artifacts import checkpoint as ckpt
from attn.artifacts import load_model
from attn.artifacts.pretrained import export_pretrained, load_pretrained
from attn.artifacts.torch_files import load_torch_file
from attn.core.errors import CheckpointError
from attn.models import build_model
from attn.core.presets import preset
from attn.training import retention, run_training
from attn.training.finetune import initial_model
from attn.training.runconfig import RunConfig

SRC = Path(__file__).resolve().parents[2] / "src"


class Payload:
    """Unpickling this calls open(marker, "w"): code from the file runs and leaves the marker behind."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def plant(file: Path, marker: Path) -> None:
    torch.save({"step": 1, "weight": torch.zeros(2), "payload": Payload(marker)}, file)
    # The payload is live: an unsafe load would run it.
    torch.load(file, weights_only=False)
    assert marker.exists()
    marker.unlink()


def never_called(*args):
    raise AssertionError("the run went on past its unreadable checkpoint")


@pytest.fixture
def poisoned_run(tmp_path):
    """(run config, marker) of a run whose only checkpoint has a malicious trainer_state.pt."""
    config = RunConfig().override(f"run_dir={tmp_path / 'run'}", "model.preset=paper-base-tiny", "train.quiet=true")
    model_config = config.model_config()
    contents = ckpt.Checkpoint(build_model(model_config), model_config, config.to_dict(), state={"step": 1})
    checkpoint = retention.save_checkpoint(config.run_dir, 1, contents)
    marker = tmp_path / "marker"
    plant(checkpoint / ckpt.STATE_FILE, marker)
    return config, marker


REFUSED = r"trainer_state.pt: refused: it holds a Python object \(io.open\) and reading one can run code"


def test_load_torch_file_refuses_objects_in_one_line(tmp_path):
    marker = tmp_path / "marker"
    plant(tmp_path / "state.pt", marker)
    with pytest.raises(CheckpointError) as caught:
        load_torch_file(tmp_path / "state.pt", "restore the file")
    assert str(caught.value) == (
        f"{tmp_path / 'state.pt'}: refused: it holds a Python object (io.open) and reading one can run code; attn "
        "reads only tensors, numbers, strings and containers: use a file that attn wrote, or model.safetensors "
        "from a source you trust"
    )
    (tmp_path / "torn.pt").write_bytes(b"PK\x03\x04torn")
    with pytest.raises(CheckpointError, match=r"torn.pt: not a readable PyTorch file \(.+\); restore the file$"):
        load_torch_file(tmp_path / "torn.pt", "restore the file")
    assert not marker.exists()


def test_a_pickle_in_trainer_state_is_refused_by_load_checkpoint(poisoned_run):
    config, marker = poisoned_run
    with pytest.raises(CheckpointError, match=REFUSED):
        ckpt.load_checkpoint(config.run_dir, with_state=True)
    assert not marker.exists()


def test_a_pickle_in_trainer_state_is_refused_on_resume(poisoned_run):
    config, marker = poisoned_run
    with pytest.raises(CheckpointError, match=REFUSED):
        run_training(config, task_builder=never_called)
    assert not marker.exists()


def test_a_pickle_in_trainer_state_is_refused_by_attn_train(poisoned_run, tmp_path, capsys):
    config, marker = poisoned_run
    toml = tmp_path / "resume.toml"
    toml.write_text(f'run_dir = "{config.run_dir}"\n[model]\npreset = "paper-base-tiny"\n')
    assert main(["train", "--config", str(toml)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("attn: error: ") and re.search(REFUSED, err) and err.count("\n") == 1
    assert not marker.exists()


@pytest.fixture
def poisoned_hf_dir(tmp_path):
    """(directory, marker) of a Hugging Face Marian directory whose pytorch_model.bin is malicious."""
    config = preset("marian-base-tiny")
    folder = export_pretrained(build_model(config), config, tmp_path / "hf", "marian")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "marker"
    plant(folder / "pytorch_model.bin", marker)
    return folder, marker


def test_a_pickle_in_pytorch_model_bin_is_refused_by_every_loader(poisoned_hf_dir, tmp_path, capsys):
    folder, marker = poisoned_hf_dir
    message = r"pytorch_model.bin: refused: it holds a Python object \(io.open\)"
    for load in (load_pretrained, initial_model, load_model):
        with pytest.raises(CheckpointError, match=message):
            load(folder)
    for command in (["translate", "--model", str(folder), "Hello."], ["convert", "--to", "attn", str(folder),
                                                                        str(tmp_path / "out")]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert err.startswith("attn: error: ") and "pytorch_model.bin: refused: it holds a Python object" in err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "out").exists()


# -- no code from files: a scan of the source ------------------------------------------------------


def unsafe_calls(source: str) -> list[str]:
    """The calls in `source` that can run code from data: eval, exec, pickle/marshal loads, and
    torch.load without weights_only=True."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        weights_only = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True for k in node.keywords)
        if name in {"eval", "exec", "pickle.load", "pickle.loads", "marshal.loads", "pickle.Unpickler"} or (
            name == "torch.load" and not weights_only
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_what_it_looks_for():
    source = "model.eval()\ntorch.load(f, weights_only=True)\neval('1')\ntorch.load(f)\npickle.loads(b)\n"
    assert unsafe_calls(source) == ["line 3: eval('1')", "line 4: torch.load(f)", "line 5: pickle.loads(b)"]


def test_no_source_file_loads_code_from_data():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 20
    found = {str(f.relative_to(SRC)): calls for f in files if (calls := unsafe_calls(f.read_text(encoding="utf-8")))}
    assert found == {}


# -- pointer files name a checkpoint of the run, nothing else -------------------------------------


@pytest.mark.parametrize("name", ["../../victim", "/tmp", "step-00000001/../../victim", "..", "step-1x"])
def test_a_pointer_that_leads_out_of_the_run_is_refused(tmp_path, name):
    model = build_model(preset("paper-base-tiny"))
    contents = ckpt.Checkpoint(model, preset("paper-base-tiny"), state={"step": 1})
    retention.save_checkpoint(tmp_path / "run", 1, contents)
    ckpt.write_checkpoint(tmp_path / "victim", model, preset("paper-base-tiny"))  # loadable, but not the run's
    (tmp_path / "run" / ckpt.CHECKPOINTS / ckpt.LATEST).write_text(name + "\n")
    with pytest.raises(CheckpointError, match=rf"latest: names '{name}', which is not a checkpoint of this run"):
        ckpt.load_checkpoint(tmp_path / "run")
    (tmp_path / "run" / ckpt.CHECKPOINTS / ckpt.LATEST).write_text("step-00000001\n")
    (tmp_path / "run" / ckpt.CHECKPOINTS / ckpt.BEST).write_text(name + "\n")
    with pytest.raises(CheckpointError, match="best: names"):
        retention.save_checkpoint(tmp_path / "run", 2, contents)
    assert ckpt.load_checkpoint(tmp_path / "victim").path == tmp_path / "victim"  # untouched
