"""LoRA adapters in PEFT's format: `save_adapter`, `load_adapter`, and `with_adapter` for a loaded `Bundle`.

A PEFT LoRA adapter is a directory of `adapter_config.json` (peft_type "LORA", r, lora_alpha, lora_dropout,
target_modules, ...) and `adapter_model.safetensors`, whose keys are `base_model.model.<module>.lora_A.weight`
(r, in) and `lora_B.weight` (rows, r) for each adapted Hugging Face module. The module names come from the family's
key table (`attn.artifacts.pretrained`): the rule of our fused `blocks.N.attn.qkv` names q_proj, k_proj and v_proj
and how its rows split among them, so each of `attn.core.lora`'s per-part adapters is one PEFT module; a row
permutation a table applies to a weight applies to lora_B's rows. GPT-2's Conv1D stores its weight transposed, but
PEFT keeps its adapters in `nn.Linear`'s layout, so only `fan_in_fan_out` says so.

`with_adapter` gives a bundle whose model shares every weight and linear layer of the base's model (nothing of the
base is copied) and adds the adapter's layers: one base in memory serves it and each of its adapters.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attn.artifacts.checkpoint import read_json
from attn.artifacts.loading import Bundle
from attn.artifacts.pretrained.families import FAMILIES
from attn.artifacts.pretrained.hf_config import SpecialIds, same_config
from attn.artifacts.pretrained.keymap import TRANSPOSE, Rule
from attn.artifacts.torch_files import load_torch_file
from attn.core.config import ModelConfig
from attn.core.errors import AttnError, CheckpointError
from attn.core.linear import Linear
from attn.core.lora import LoRAConfig, LoRALinear, add_lora
from attn.core.quantized import QuantizedLinear
from attn.data.files import write_directory
from attn.models import Model

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_TORCH_WEIGHTS = "adapter_model.bin"
PEFT_PREFIX = "base_model.model."
# adapter_config.json's options and the values attn implements: anything else is refused by name.
DEFAULT_OPTIONS: dict[str, tuple[Any, ...]] = {
    "bias": ("none",), "use_dora": (False, None), "use_rslora": (False,), "lora_bias": (False, None),
    "modules_to_save": (None, []), "layers_to_transform": (None, []), "layers_pattern": (None, [], ""),
    "rank_pattern": ({}, None), "alpha_pattern": ({}, None), "layer_replication": (None,),
    "exclude_modules": (None, [], ""), "target_parameters": (None, []), "trainable_token_indices": (None,),
    "use_qalora": (False, None), "alora_invocation_tokens": (None,), "use_bdlora": (None, False),
    "megatron_config": (None,), "task_type": ("CAUSAL_LM", None),
}


@dataclasses.dataclass(frozen=True)
class Place:
    """Where one adapter of ours lives in PEFT's format.

    Attributes:
        module: the Hugging Face module path (`model.layers.0.self_attn.q_proj`).
        rows: for each of the module's output rows, our row of the adapter's B (a family's row permutation).
        conv1d: the module is GPT-2's Conv1D (`fan_in_fan_out`).
    """

    module: str
    rows: Tensor
    conv1d: bool


def save_adapter(model: Model, config: ModelConfig, directory: str | Path, family: str,
                 base: str | None = None) -> Path:
    """Writes the LoRA adapters of `model` (`attn.core.lora.add_lora`) as a PEFT adapter directory, atomically.

    Args:
        config: the model's config, which gives the family's key table.
        family: a key of `FAMILIES` (the family the base is exported to or was imported from; see
            `adapter_family`).
        base: `base_model_name_or_path` of adapter_config.json: the base model's path or Hub name.

    Returns:
        The directory, holding adapter_config.json and adapter_model.safetensors.

    Raises:
        CheckpointError: the model has no adapters, or one that the family has no module for.
    """
    from safetensors.torch import save

    layers = dict(_lora_layers(model))
    if not layers:
        raise CheckpointError("the model has no LoRA adapters to save; add them with attn.core.lora.add_lora")
    places = _places(layers, config, family)
    tensors: dict[str, Tensor] = {}
    for (path, target), place in places.items():
        adapter = layers[path].lora[target]
        key = PEFT_PREFIX + place.module
        tensors[f"{key}.lora_A.weight"] = adapter.A.detach().float().contiguous().cpu()
        tensors[f"{key}.lora_B.weight"] = adapter.B.detach()[place.rows].float().contiguous().cpu()
    first = next(iter(layers.values()))
    body = json.dumps(_peft_config(first, places, base), indent=2) + "\n"
    data = save(tensors, metadata={"format": "pt"})

    def write(folder: Path) -> None:
        (folder / ADAPTER_CONFIG).write_text(body, encoding="utf-8")
        (folder / ADAPTER_WEIGHTS).write_bytes(data)

    return write_directory(Path(directory), write, "")


def load_adapter(model: Model, config: ModelConfig, directory: str | Path, family: str) -> Model:
    """Adds a PEFT LoRA adapter (one attn or PEFT wrote) to `model` with `add_lora`, in place; returns the model.

    Args:
        config: the model's config, which gives the family's key table.
        family: the key of `FAMILIES` whose module names the adapter uses.

    Raises:
        CheckpointError: naming the file and key, for a missing or unreadable file, an option attn does not
            implement (DoRA, rsLoRA, per-layer ranks, ...), a target or key the model has no place for, a missing
            key, or a shape that is not the model's (an adapter of another base); the model may then hold
            adapters partly filled.
    """
    folder = Path(directory)
    settings = _read_peft_config(folder / ADAPTER_CONFIG)
    tensors, source = _read_adapter_weights(folder)
    targets = settings["target_modules"]
    if isinstance(targets, str):  # a regular expression over module paths: the weights say which modules matched
        targets = sorted({key.removesuffix(".lora_A.weight").rsplit(".", 1)[-1] for key in tensors
                          if key.endswith(".lora_A.weight")})
    try:
        lora = LoRAConfig(rank=settings["r"], alpha=settings.get("lora_alpha", 8),
                          dropout=settings.get("lora_dropout", 0.0), targets=tuple(targets))
        add_lora(model, lora)
    except AttnError as err:
        raise CheckpointError(f"{folder / ADAPTER_CONFIG}: {err}") from err
    places = _places(dict(_lora_layers(model)), config, family)
    _fill(model, places, tensors, source)
    return model


def with_adapter(bundle: Bundle, directory: str | Path) -> Bundle:
    """`bundle` with a PEFT LoRA adapter on a model that shares every weight of `bundle.model` (none is copied, and
    `add_lora` freezes them for both models).

    Raises:
        CheckpointError: as `load_adapter`, or the bundle's model has no family to read the adapter's names by.
    """
    model = shared_copy(bundle.model)
    load_adapter(model, bundle.model_config, directory, adapter_family(bundle))
    return dataclasses.replace(bundle, model=model.eval())


def shared_copy(model: Model) -> Model:
    """A copy of `model`'s modules that holds the same parameters, buffers and linear layers (a layer's oneDNN
    weight, packed while a model answers, is then packed once for both)."""
    shared: dict[int, Any] = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    shared.update({id(m): m for m in model.modules() if isinstance(m, (Linear, QuantizedLinear))})
    return copy.deepcopy(model, shared)


def adapter_family(bundle: Bundle) -> str:
    """The family whose module names a bundle's adapters use: the imported one, else the first language-model
    family that expresses the model's config (as `attn convert --to FAMILY` would export it).

    Raises:
        CheckpointError: no family expresses the config.
    """
    if bundle.imported is not None:
        return bundle.imported.family
    config = bundle.model_config
    for name, family in FAMILIES.items():
        if family.task != "lm":
            continue
        try:
            hf = family.hf_config(config, SpecialIds())
            same_config(config, family.model_config(hf, family.key_table(config).written_keys(True)), name)
        except AttnError:
            continue
        return name
    raise CheckpointError(f"{bundle.path}: no Hugging Face family expresses this model, so it has no module names "
                          "for a PEFT adapter; adapters apply to Llama-style and GPT-2 language models")


def _lora_layers(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    return ((path, m) for path, m in model.named_modules() if isinstance(m, LoRALinear))


def _places(layers: Mapping[str, LoRALinear], config: ModelConfig, family: str) -> dict[tuple[str, str], Place]:
    """(our layer's path, target) -> its PEFT module, for every adapter of `layers`."""
    if family not in FAMILIES:
        raise CheckpointError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    chosen = FAMILIES[family]
    rules = {r.ours: r for r in chosen.key_table(config).expanded(chosen.prefixed(config))}
    places = {}
    for path, layer in layers.items():
        rule = rules.get(f"{path}.weight")
        if rule is None:
            raise CheckpointError(f"the family {family} has no module for our {path}; it cannot hold its adapter")
        parts = _part_rows(rule, layer.out_features)
        for target, (start, end) in layer.rows.items():
            found = [(name, rows) for name, rows in parts if name.rsplit(".", 1)[-1] == target
                     and sorted(rows.tolist()) == list(range(start, end))]
            if not found:
                raise CheckpointError(f"the {family} family has no {target} module whose rows are those of our "
                                      f"{path}'s {target} adapter; adapt the modules the family has")
            name, rows = found[0]
            places[path, target] = Place(name, rows - start, rule.transform is TRANSPOSE)
    return places


def _part_rows(rule: Rule, rows: int) -> list[tuple[str, Tensor]]:
    """Each Hugging Face module of `rule` and which of our output rows it holds, in its own row order."""
    modules = [key.removesuffix(".weight") for key in rule.theirs]
    if rule.transform is TRANSPOSE:
        return [(modules[0], torch.arange(rows))]
    index = torch.arange(rows, dtype=torch.float64)[:, None]  # our row numbers, sent through the table's transform
    return [(name, part[:, 0].long()) for name, part in zip(modules, rule.transform.to_theirs(index, len(modules)))]


def _peft_config(layer: LoRALinear, places: Mapping[tuple[str, str], Place], base: str | None) -> dict[str, Any]:
    alpha = layer.scaling * layer.rank
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": layer.rank, "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
        "lora_dropout": layer.dropout.p, "target_modules": sorted({target for _, target in places}),
        "fan_in_fan_out": any(place.conv1d for place in places.values()), "bias": "none",
        "use_dora": False, "use_rslora": False, "modules_to_save": None, "init_lora_weights": True,
        "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
        "inference_mode": True,
    }


def _read_peft_config(path: Path) -> dict[str, Any]:
    if not path.parent.is_dir():
        raise CheckpointError(f"{path.parent}: no such adapter directory; give the folder PEFT's save_pretrained "
                              "or attn's save_adapter wrote")
    settings = read_json(path)
    if settings.get("peft_type") != "LORA":
        raise CheckpointError(f"{path}: peft_type is {settings.get('peft_type')!r}; attn reads LoRA adapters "
                              "(peft_type \"LORA\") only")
    for field, supported in DEFAULT_OPTIONS.items():
        if settings.get(field, supported[0]) not in supported:
            raise CheckpointError(f"{path}: {field}={settings[field]!r} is an option attn does not implement "
                                  f"(it reads {supported[0]!r}); merge the adapter into its base with PEFT "
                                  "(merge_and_unload) and load the merged model instead")
    for field in ("r", "target_modules"):
        if field not in settings:
            raise CheckpointError(f"{path}: has no {field!r}; it is not a complete PEFT LoRA config")
    return settings


def _read_adapter_weights(folder: Path) -> tuple[dict[str, Tensor], str]:
    from safetensors.torch import load_file

    path = folder / ADAPTER_WEIGHTS
    if path.is_file():
        try:
            return load_file(str(path)), str(path)
        except Exception as err:  # safetensors reports every defect as its own SafetensorError
            raise CheckpointError(f"{path}: not a readable safetensors file ({err}); restore the file") from err
    path = folder / ADAPTER_TORCH_WEIGHTS
    if path.is_file():
        state = load_torch_file(path, "restore the file")
        if isinstance(state, Mapping) and all(isinstance(v, Tensor) for v in state.values()):
            return dict(state), str(path)
        raise CheckpointError(f"{path}: expected a mapping of names to tensors; restore the file")
    raise CheckpointError(f"{folder}: no adapter weights; expected {ADAPTER_WEIGHTS} or {ADAPTER_TORCH_WEIGHTS}")


def _fill(model: nn.Module, places: Mapping[tuple[str, str], Place], tensors: Mapping[str, Tensor],
          source: str) -> None:
    """Copies each adapter's lora_A and lora_B from `tensors` (PEFT's keys), strictly."""
    remaining = set(tensors)
    with torch.no_grad():
        for (path, target), place in places.items():
            adapter = model.get_submodule(path).lora[target]
            key = PEFT_PREFIX + place.module
            a = _take(tensors, f"{key}.lora_A.weight", tuple(adapter.A.shape), source)
            b = _take(tensors, f"{key}.lora_B.weight", tuple(adapter.B.shape), source)
            adapter.A.copy_(a)
            adapter.B[place.rows] = b.to(adapter.B.dtype)
            remaining -= {f"{key}.lora_A.weight", f"{key}.lora_B.weight"}
    if remaining:
        raise CheckpointError(f"{source}: unknown key {sorted(remaining)[0]!r} ({len(remaining)} unknown in all); "
                              "the adapter adapts modules this model has no place for: use an adapter made for "
                              "this base model")


def _take(tensors: Mapping[str, Tensor], key: str, shape: tuple[int, ...], source: str) -> Tensor:
    if key not in tensors:
        raise CheckpointError(f"{source}: missing key {key!r}; the adapter is incomplete or made for another model")
    if tuple(tensors[key].shape) != shape:
        raise CheckpointError(f"{source}: key {key!r} has shape {tuple(tensors[key].shape)}, but this model's "
                              f"adapter needs {shape}; the adapter was made for another base model: use its base")
    return tensors[key]
