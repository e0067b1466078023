"""The `attn` checkpoint format: one directory, written atomically, read back with checks.

A checkpoint directory holds

    model.safetensors    the weights (tied matrices stored once)
    model_config.json    ModelConfig.to_dict()
    run_config.json      RunConfig.to_dict()                  (absent for imported models)
    tokenizer.json, attn_tokenizer.json                       (when trained with a tokenizer)
    task.json            what inference needs beyond the model, e.g. the label names
    chat_template.jinja  the Jinja template that writes a conversation as the model's prompt (chat models)
    trainer_state.pt     optimizer and gradient-scaler states, step, RNG states, data position, best metric
    lora.json            a LoRA run's adapter settings and base model; model.safetensors then holds the adapters
                         alone (`attn.artifacts.lora_runs`)

A run keeps its checkpoints in `run_dir/checkpoints/step-00001000/` with the text files `latest` and `best`
naming the newest and the best one (`attn.training.retention` writes them; a run directory loads as its latest
checkpoint). A pointer must name a step directory of the run; any other name is refused, never followed. Every
write goes to a temporary sibling directory, is flushed to disk and renamed into place, so a crash leaves either
the previous checkpoint or the new one, never a torn one.

`trainer_state.pt` is read with `torch.load(weights_only=True)` (`attn.artifacts.torch_files`), so it holds
only containers, numbers, strings and tensors.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch import nn

from attn.artifacts.lora_runs import LORA_FILE, LoRARun
from attn.artifacts.torch_files import load_torch_file
from attn.core.config import ModelConfig
from attn.data.files import write_directory
from attn.data.tokenizer_files import META_FILE
from attn.data.tokenizers import Tokenizer
from attn.core.errors import AttnError, CheckpointError
from attn.core.lora import load_lora_state_dict, lora_state_dict
from attn.models import build_model
from attn.core.quantized import Quantization, quantization_of, quantize

MODEL_FILE = "model.safetensors"
QUANTIZATION_KEY = "attn.quantization"  # in the metadata of MODEL_FILE: how its weights are quantized
MODEL_CONFIG_FILE = "model_config.json"
RUN_CONFIG_FILE = "run_config.json"
STATE_FILE = "trainer_state.pt"
TASK_FILE = "task.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the name transformers gives the file too
CHECKPOINTS = "checkpoints"
LATEST = "latest"
BEST = "best"
_STEP = "step-"


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (disk full, no permission, I/O error).

    Nothing was replaced and no temporary directory is left. It is an OSError too, so handlers of the operating
    system's errors still catch it.
    """


@dataclass
class Checkpoint:
    """The contents of a checkpoint directory, to write or as loaded.

    Attributes:
        model: unwrapped; loaded ones are built from `model_config`, on the CPU, in eval mode.
        run_config: as `RunConfig.to_dict()` wrote it, or None for an imported model.
        state: the trainer state, or None: weights-only checkpoints (averaged, imported) have none, and
            `load_checkpoint` reads it only when asked.
        task_info: the contents of `task.json` ({} when absent).
        path: the directory it was loaded from or saved to (None before saving).
        lora: a LoRA run's record: only the model's adapters are written.
    """

    model: nn.Module
    model_config: ModelConfig
    run_config: dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    tokenizer: Tokenizer | None = None
    task_info: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    chat_template: str | None = None
    lora: LoRARun | None = None


# -- writing ----------------------------------------------------------------------------------


def write_checkpoint(
    path: str | Path,
    model: nn.Module,
    model_config: ModelConfig,
    run_config: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    tokenizer: Tokenizer | None = None,
    task_info: dict[str, Any] | None = None,
    chat_template: str | None = None,
) -> Path:
    """Writes a checkpoint directory at `path` atomically (replacing one that is there) and returns `path`.

    Raises:
        CheckpointError: a weight is NaN or infinite (nothing is written).
        CheckpointWriteError: the disk is full or not writable (nothing is replaced).
    """
    return write_atomically(Path(path), Checkpoint(model, model_config, run_config, state, tokenizer, task_info or {},
                                                   chat_template=chat_template))


@contextlib.contextmanager
def reporting_write_errors(path: Path) -> Iterator[None]:
    """Turns the operating system's errors while writing `path` into a CheckpointWriteError."""
    try:
        yield
    except CheckpointError:
        raise
    except OSError as err:
        raise CheckpointWriteError(
            f"{path}: cannot write the checkpoint ({err}); the previous checkpoint is intact: free disk space "
            f"or fix the permissions of {path.parent}, then run again (a training run resumes from its last checkpoint)"
        ) from err


def write_atomically(path: Path, checkpoint: Checkpoint) -> Path:
    """Writes `checkpoint` at `path` through a temporary sibling directory (see the module's docstring)."""
    check_finite(checkpoint.model, path)
    with reporting_write_errors(path):
        write_directory(path, lambda folder: _write_files(folder, checkpoint), "checkpoint-write")
    checkpoint.path = path
    return path


def _write_files(folder: Path, checkpoint: Checkpoint) -> None:
    if checkpoint.lora is not None:
        safetensors.torch.save_file(lora_state_dict(checkpoint.model), str(folder / MODEL_FILE))
        _write_json(folder / LORA_FILE, checkpoint.lora.to_dict())
    else:
        scheme = quantization_of(checkpoint.model)
        metadata = {QUANTIZATION_KEY: scheme} if scheme else None
        safetensors.torch.save_model(checkpoint.model, str(folder / MODEL_FILE), metadata=metadata)
    _write_json(folder / MODEL_CONFIG_FILE, checkpoint.model_config.to_dict())
    if checkpoint.run_config is not None:
        _write_json(folder / RUN_CONFIG_FILE, checkpoint.run_config)
    if checkpoint.task_info:
        _write_json(folder / TASK_FILE, checkpoint.task_info)
    if checkpoint.tokenizer is not None:
        checkpoint.tokenizer.save(folder)
    if checkpoint.chat_template is not None:
        (folder / CHAT_TEMPLATE_FILE).write_text(checkpoint.chat_template, encoding="utf-8")
    if checkpoint.state is not None:
        torch.save(checkpoint.state, folder / STATE_FILE)


def step_name(step: int) -> str:
    """The directory name of the checkpoint of `step`."""
    return f"{_STEP}{step:08d}"


def check_finite(model: nn.Module, where: str | Path = "the checkpoint") -> None:
    """Raises a CheckpointError naming the first weight that holds NaN or infinity."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"refusing to write {where}: weight {name!r} holds NaN or infinite values; training diverged, "
                "so resume from an earlier checkpoint with a lower optim.lr or with optim.clip set"
            )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


# -- finding and reading ----------------------------------------------------------------------


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's checkpoint directories, oldest first."""
    return step_dirs(Path(run_dir) / CHECKPOINTS)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The run's newest checkpoint, or None when it has none."""
    folder = Path(run_dir) / CHECKPOINTS
    pointed = read_pointer(folder, LATEST)
    if pointed is not None:
        return pointed
    steps = step_dirs(folder)
    return steps[-1] if steps else None


def best_checkpoint(run_dir: str | Path) -> Path | None:
    """The run's checkpoint with the best validation metric, or None when none was evaluated."""
    return read_pointer(Path(run_dir) / CHECKPOINTS, BEST)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or a run directory (meaning its latest checkpoint) -> the checkpoint directory.

    Raises:
        CheckpointError: neither a checkpoint nor a run with checkpoints.
    """
    path = Path(path)
    if (path / MODEL_CONFIG_FILE).exists():
        return path
    latest = latest_checkpoint(path) if path.is_dir() else None
    if latest is None:
        pointer = path / CHECKPOINTS / LATEST
        dangling = f"; {pointer} names a checkpoint that no longer exists" if pointer.is_file() else ""
        raise CheckpointError(
            f"{path}: not a checkpoint (no {MODEL_CONFIG_FILE}) nor a run directory with checkpoints{dangling}; "
            f"give a checkpoint directory such as RUN_DIR/{CHECKPOINTS}/{step_name(1000)}"
        )
    return latest


def load_checkpoint(path: str | Path, attention: str = "fast", with_state: bool = False,
                    base: nn.Module | None = None) -> Checkpoint:
    """Loads a checkpoint (or the latest checkpoint of a run directory), its model on the CPU in eval mode.

    Args:
        attention: the attention implementation of the rebuilt model ("fast" or "reference").
        with_state: also read `trainer_state.pt` (needed to resume training), its tensors on the CPU.
        base: for a LoRA run's checkpoint (`read_lora_run`), the base model its record names, in float: its
            weights are checked against the record, then adapted as they were trained.

    Raises:
        CheckpointError: a file is missing or corrupt, a weight is missing, unexpected or mis-shaped, or a LoRA
            checkpoint's base is missing or changed.
    """
    folder = resolve_checkpoint(path)
    model_config = _read_model_config(folder / MODEL_CONFIG_FILE)
    model = build_model(model_config, attention)
    lora = read_lora_run(folder)
    if lora is not None:
        _load_adapted(model, lora, base, folder)
    else:
        scheme = _read_quantization(folder / MODEL_FILE)
        if scheme is not None:
            quantize(model, scheme, stored=_stored_keys(folder / MODEL_FILE))
        load_weights(model, folder / MODEL_FILE)
    run_file = folder / RUN_CONFIG_FILE
    run_config = read_json(run_file) if run_file.exists() else None
    state = _read_state(folder / STATE_FILE) if with_state else None
    tokenizer = Tokenizer.load(folder) if (folder / META_FILE).exists() else None
    task_file = folder / TASK_FILE
    task_info = read_json(task_file) if task_file.exists() else {}
    return Checkpoint(model.eval(), model_config, run_config, state, tokenizer, task_info, folder,
                      read_chat_template(folder), lora)


def read_lora_run(folder: Path) -> LoRARun | None:
    """A checkpoint directory's `lora.json`, or None for a checkpoint of whole weights.

    Raises:
        CheckpointError: the file is unreadable or holds bad settings.
    """
    file = folder / LORA_FILE
    return LoRARun.from_dict(read_json(file), file) if file.exists() else None


def _load_adapted(model: nn.Module, lora: LoRARun, base: nn.Module | None, folder: Path) -> None:
    """`model` given the weights of `base`, checked against the record, quantized and adapted as it says, and the
    adapters of `folder`'s model.safetensors."""
    if base is None:
        raise CheckpointError(f"{folder}: holds LoRA adapters over {lora.base}; load it with attn.load_model, "
                              "which reads the base model too")
    try:
        model.load_state_dict(base.state_dict())
    except RuntimeError as err:
        raise CheckpointError(f"{folder}: the base model {lora.base} does not fit the checkpoint's model "
                              f"({' '.join(str(err).split())[:200]}); restore the base the run started from") from None
    lora.check_base(model, folder)
    lora.adapt(model)
    try:
        adapters = safetensors.torch.load_file(str(folder / MODEL_FILE))
    except (OSError, safetensors.SafetensorError) as err:
        raise CheckpointError(f"{folder / MODEL_FILE}: not a readable safetensors file ({err}); it is truncated "
                              "or corrupt, use another checkpoint") from err
    load_lora_state_dict(model, adapters)


def read_chat_template(folder: Path) -> str | None:
    """The `chat_template.jinja` of a checkpoint or model directory, or None when it has none.

    Raises:
        CheckpointError: the file is not readable UTF-8 text.
    """
    file = folder / CHAT_TEMPLATE_FILE
    if not file.is_file():
        return None
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file}: not readable UTF-8 text ({err}); restore the chat template") from err


def load_weights(model: nn.Module, file: str | Path) -> None:
    """Loads `model.safetensors` into a model built from the same config, strictly.

    Raises:
        CheckpointError: the file is missing or corrupt, or keys are missing, unexpected or mis-shaped.
    """
    file = Path(file)
    if not file.is_file():
        raise CheckpointError(f"{file}: no such file; the checkpoint is incomplete, use another one")
    _check_shapes(model, file)
    renaming = model.register_load_state_dict_pre_hook(_rename_old_keys)
    try:
        missing, unexpected = safetensors.torch.load_model(model, str(file), strict=False)
    except (RuntimeError, OSError, safetensors.SafetensorError) as err:
        reason = " ".join(str(err).split())  # torch lists every mismatch on its own line
        raise CheckpointError(
            f"{file}: cannot be loaded into the model ({reason[:300]}); use another checkpoint"
        ) from err
    finally:
        renaming.remove()
    if missing or unexpected:
        raise CheckpointError(
            f"{file}: missing keys {sorted(missing)[:5]}, unexpected keys {sorted(unexpected)[:5]}; "
            f"the weights do not belong to the model described by {MODEL_CONFIG_FILE}"
        )


# Where checkpoints written by older versions of attn keep the vocabulary projection, now `lm_head`.
_OLD_PREFIXES = ("generator.", "mlm.output.")


def _rename_old_keys(module: nn.Module, state_dict: dict[str, torch.Tensor], *args: Any) -> None:
    for key in [key for key in state_dict if key.startswith(_OLD_PREFIXES)]:
        state_dict["lm_head." + key.split(".")[-1]] = state_dict.pop(key)


def _read_quantization(file: Path) -> str | None:
    """The quantization `model.safetensors` records in its metadata (None: float weights, or no file yet)."""
    try:
        with safetensors.safe_open(str(file), "pt") as weights:
            scheme = (weights.metadata() or {}).get(QUANTIZATION_KEY)
    except (OSError, safetensors.SafetensorError):
        return None  # load_weights names the problem
    if scheme is not None and scheme not in {q.value for q in Quantization}:
        raise CheckpointError(f"{file}: unknown quantization {scheme!r} in the metadata; this version of attn reads "
                              f"{[q.value for q in Quantization]}: upgrade attn or convert the model again")
    return scheme


def _stored_keys(file: Path) -> set[str]:
    """The weights' names in `model.safetensors` (none when it cannot be read: load_weights names the problem)."""
    try:
        with safetensors.safe_open(str(file), "pt") as weights:
            return set(weights.keys())
    except (OSError, safetensors.SafetensorError):
        return set()


def _check_shapes(model: nn.Module, file: Path) -> None:
    """Raises a CheckpointError naming the first weight whose shape in the file's header differs from the model's."""
    expected = model.state_dict()
    try:
        with safetensors.safe_open(str(file), "pt") as weights:
            shapes = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}
    except (OSError, safetensors.SafetensorError) as err:
        raise CheckpointError(
            f"{file}: not a readable safetensors file ({err}); it is truncated or corrupt, use another checkpoint"
        ) from err
    for key, shape in shapes.items():
        if any(size >= 2**63 for size in shape):  # torch holds sizes as int64; safetensors passes them on as given
            raise CheckpointError(f"{file}: weight {key!r} has shape {shape}, beyond what a tensor can hold; the file "
                                  "is corrupt, use another checkpoint")
        if key in expected and tuple(expected[key].shape) != shape:
            raise CheckpointError(
                f"{file}: size mismatch for weight {key!r}: {shape} in the file, {tuple(expected[key].shape)} in "
                f"the model described by {MODEL_CONFIG_FILE}; the weights belong to another model: use the "
                "checkpoint's own files"
            )


def read_pointer(folder: Path, name: str) -> Path | None:
    pointer = folder / name
    if not pointer.is_file():
        return None
    target = pointer.read_text(encoding="utf-8", errors="replace").strip()  # garbage is refused below
    # The name comes from a file anyone may have edited: only a sibling step directory is
    # followed, never a path that leads out of the run (`../..`, `/etc`).
    if not _is_step_name(target):
        raise CheckpointError(
            f"{pointer}: names {target[:80]!r}, which is not a checkpoint of this run (a name such as "
            f"{step_name(1000)}); delete {pointer} to use the newest checkpoint, or write the right name into it"
        )
    return folder / target if (folder / target).is_dir() else None


def _is_step_name(name: str) -> bool:
    return re.fullmatch(rf"{_STEP}[0-9]+", name) is not None


def step_dirs(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and _is_step_name(p.name)]
    return sorted(found, key=lambda p: int(p.name[len(_STEP):]))


def read_json(file: Path) -> dict[str, Any]:
    """The JSON object of a checkpoint's (or model directory's) file.

    Raises:
        CheckpointError: the file is missing, is not valid JSON, or holds something other than an object.
    """
    if not file.is_file():
        raise CheckpointError(f"{file}: no such file; the checkpoint is incomplete, use another one")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:  # RecursionError: nested too deep
        raise CheckpointError(f"{file}: not valid JSON ({err}); the checkpoint is corrupt, use another one") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(data).__name__}; the checkpoint is corrupt, "
                              "use another one")
    return data


def _read_model_config(file: Path) -> ModelConfig:
    try:
        return ModelConfig.from_dict(read_json(file))
    except CheckpointError:
        raise
    except AttnError as err:
        raise CheckpointError(f"{file}: {err}; the checkpoint was written by another version of attn") from err


def _read_state(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise CheckpointError(
            f"{file}: no such file; this checkpoint cannot resume training (averaged or imported checkpoints "
            "hold weights only): start a new run_dir, or resume from a checkpoint that train() wrote"
        )
    return load_torch_file(file, "the checkpoint is corrupt, use another one")


