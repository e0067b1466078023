"""The registry of pretrained families, and the conversions that go through it.

`FAMILIES` maps config.json's `model_type` to its `Family` (key table, config mapping, task, decoding rules).
`load_pretrained` reads a Hugging Face model directory, `load_gguf` a llama.cpp GGUF file, and
`export_pretrained` writes one of our models as a directory of a family.

A directory holds `config.json`, the weights as `model.safetensors` (or shards listed in
`model.safetensors.index.json`, or a `pytorch_model.bin` read with `torch.load(weights_only=True)`), and
optionally tokenizer files. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from attn.artifacts.checkpoint import CHAT_TEMPLATE_FILE
from attn.artifacts.pretrained import bert, gpt2, llama, marian
from attn.artifacts.pretrained.decoding import DecodingRules
from attn.artifacts.pretrained.gguf import GgufModel, read_gguf
from attn.artifacts.pretrained.gguf_weights import GgufTensor, load_quantized
from attn.artifacts.pretrained.hf_config import Family, SpecialIds, same_config
from attn.artifacts.pretrained.keymap import export_from, load_into
from attn.artifacts.torch_files import load_torch_file
from attn.core.config import ModelConfig
from attn.data.marian_tokenizer import is_marian_directory
from attn.data.tokenizer_kinds import MARIAN_KIND
from attn.data.tokenizers import Tokenizer
from attn.core.errors import AttnError, CheckpointError
from attn.models import Model, build_empty, build_model

FAMILIES: dict[str, Family] = {
    family.name: family for family in (gpt2.FAMILY, bert.FAMILY, marian.FAMILY, *llama.FAMILIES)
}

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"


@dataclasses.dataclass(frozen=True)
class PretrainedInfo:
    """What `load_pretrained` learnt besides the weights.

    Attributes:
        family: its config.json's model_type, a key of `FAMILIES`.
        ids: the special ids of config.json; a Marian decoder starts from `ids.decoder_start` (the pad id).
        unused: checkpoint keys knowingly left out (e.g. BERT's next-sentence head), each with the reason.
        decoding: the rules `generate` decodes this model under.
    """

    family: str
    config: ModelConfig
    ids: SpecialIds
    unused: Mapping[str, str]
    decoding: DecodingRules = DecodingRules()

    def task_info(self) -> dict[str, Any]:
        """What an imported checkpoint's task.json keeps: the decoding rules, when there are any."""
        return {} if self.decoding == DecodingRules() else {"decoding": self.decoding.to_json()}


def load_pretrained(directory: str | Path, attention: str = "fast") -> tuple[Model, Tokenizer | None, PretrainedInfo]:
    """Loads a local Hugging Face directory of a family in `FAMILIES` into an `attn` model.

    Returns:
        The model in eval mode, its tokenizer (None when there is no file `load_tokenizer` reads), and what else
        was learnt.

    Raises:
        CheckpointError: a missing or unreadable file, an unsupported model_type or option, or a key that is
            unknown, missing or mis-shaped.
    """
    folder = Path(directory)
    hf = read_hf_config(folder)
    family = family_of(hf, folder / CONFIG_FILE)  # an unsupported model is refused before its weights are read
    weights, source = read_weights(folder)
    model, info = convert(family, hf, weights, generation_settings(folder, hf), folder / CONFIG_FILE, source, attention)
    return model, load_tokenizer(folder), info


def load_gguf(path: str | Path, attention: str = "fast",
              dequantize: bool = False) -> tuple[Model, GgufModel, PretrainedInfo]:
    """Loads a llama.cpp GGUF file into an `attn` model, through the family its architecture names.

    Args:
        dequantize: every weight as float32 (to fine-tune or export it); by default quantized blocks stay quantized
            (`attn.artifacts.pretrained.gguf_weights`), read one tensor at a time.

    Returns:
        The model in eval mode, what the file holds besides its weights (tokenizer, chat template, ...), and
        `PretrainedInfo`.

    Raises:
        CheckpointError: the file is not a GGUF file attn reads, or its weights and metadata disagree.
    """
    found = read_gguf(path)
    source, hf = str(found.path), found.hf_config
    family = family_of(hf, found.path)
    model, info = convert(family, hf, found.weights, hf, found.path, source, attention, dequantize)
    return model, dataclasses.replace(found, weights={}), info


def convert(
    family: Family,
    hf: Mapping[str, Any],
    weights: Mapping[str, Tensor] | Mapping[str, GgufTensor],
    generation: Mapping[str, Any],
    config_path: Path,
    source: str,
    attention: str = "fast",
    dequantize: bool = False,
) -> tuple[Model, PretrainedInfo]:
    """An `attn` model holding a Hugging Face checkpoint's weights, and what else the import learnt.

    Args:
        hf: the config.json (or what a GGUF file's metadata says it would be).
        weights: tensors under the checkpoint's names, or a GGUF file's tensors, which stay quantized
            (`gguf_weights.load_quantized` fills a model built without weights, one tensor at a time).
        dequantize: a GGUF file's tensors all become float32 parameters, trainable.
        generation: where the decoding defaults are read (generation_config.json, else config.json).
        config_path, source: the config's and the weights' file, for messages.
    """
    config = _our_config(family, hf, weights, config_path)
    _check_size(config, weights, config_path)
    if any(isinstance(tensor, GgufTensor) for tensor in weights.values()):  # a GGUF file's blocks
        model, unused = build_empty(config, attention), {}
        load_quantized(model, family.key_table(config), weights, source, keep=not dequantize)
    else:
        model = build_model(config, attention)
        unused = load_into(model, family.key_table(config), weights, source)
    ids = SpecialIds.from_hf(hf)
    rules = family.decoding(generation, ids.decoder_start)
    return model.eval(), PretrainedInfo(family.name, config, ids, unused, rules)


def export_pretrained(
    model: Model,
    config: ModelConfig,
    directory: str | Path,
    family: str,
    tokenizer: Tokenizer | None = None,
    ids: SpecialIds | None = None,
    chat_template: str | None = None,
) -> Path:
    """Writes `model` as a Hugging Face directory that `transformers` loads with the same weights.

    Args:
        directory: the output folder (created if needed); returned.
        family: a key of `FAMILIES`; the config must be expressible in it.
        tokenizer: saved alongside when given, with a tokenizer_config.json that has `AutoTokenizer` load it as
            it is.
        ids: special ids for config.json; by default those of `tokenizer`, else none.
        chat_template: written as chat_template.jinja, where transformers and attn read it.

    Raises:
        CheckpointError: the family is unknown, or the config has an option it cannot express.
    """
    hf, tensors = hf_checkpoint(model, config, family, ids or _tokenizer_ids(tokenizer))
    from safetensors.torch import save_file

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / SAFETENSORS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save(folder)
        if tokenizer.kind != MARIAN_KIND:  # a SentencePiece tokenizer writes MarianTokenizer's own config
            _write_tokenizer_config(folder, tokenizer, config.max_positions)
    if chat_template is not None:
        (folder / CHAT_TEMPLATE_FILE).write_text(chat_template, encoding="utf-8")
    return folder


def hf_checkpoint(model: Model, config: ModelConfig, family: str,
                  ids: SpecialIds) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The config.json and the state dict of `model` as a checkpoint of `family`.

    Raises:
        CheckpointError: the family is unknown, or the config has an option it cannot express.
    """
    chosen = _family_named(family)
    hf = chosen.hf_config(config, ids)
    table, prefixed = chosen.key_table(config), chosen.prefixed(config)
    same_config(config, _read_back(chosen, hf, table.written_keys(prefixed)), chosen.name)
    return hf, export_from(model, table, prefixed)


def _read_back(family: Family, hf: dict[str, Any], keys: list[str]) -> ModelConfig:
    """Our config of the config.json an export would write; an option the family refuses is the model's fault."""
    try:
        return family.model_config(hf, keys)
    except CheckpointError as err:
        raise CheckpointError(f"the model cannot be expressed as a {family.name} checkpoint ({err}); export to "
                              "a family whose architecture matches the model's config") from err


def generation_settings(folder: Path, hf: dict[str, Any]) -> dict[str, Any]:
    """Where `generate` reads its defaults: generation_config.json when there is one, else config.json."""
    path = folder / GENERATION_FILE
    return _read_json(path) if path.is_file() else hf


def _write_tokenizer_config(folder: Path, tokenizer: Tokenizer, max_length: int) -> None:
    """Has `transformers.AutoTokenizer` read our tokenizer.json exactly as `attn` does.

    Without it, AutoTokenizer picks the family's own class, which rebuilds its own pipeline around our
    vocabulary (GPT-2's byte-level pre-tokenizer loses every space of a character vocabulary; Marian's wants
    SentencePiece files). `PreTrainedTokenizerFast` takes tokenizer.json whole. HF's clean-up of decoded text is
    switched off, since our decode does not do it.
    """
    settings: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    for role in ("bos", "eos", "unk", "pad", "cls", "sep", "mask"):
        token_id = getattr(tokenizer, f"{role}_id")
        if token_id is not None:
            settings[f"{role}_token"] = tokenizer.id_to_token(token_id)
    (folder / TOKENIZER_CONFIG_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def read_hf_config(folder: Path) -> dict[str, Any]:
    """The parsed config.json of a model directory."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; give the folder of a Hugging Face model (save_pretrained)")
    return _read_json(path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:  # Recursion: nested too deep
        raise CheckpointError(f"{path}: not readable JSON ({err}); restore the file") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def family_of(hf: Mapping[str, Any], path: Path) -> Family:
    """The family that config.json's `model_type` names."""
    model_type = hf.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise CheckpointError(
            f"{path}: model_type {model_type!r} is not supported; attn converts {', '.join(FAMILIES)}"
        )
    return FAMILIES[model_type]


def _family_named(name: str) -> Family:
    if name not in FAMILIES:
        raise CheckpointError(f"unknown family {name!r}; choose one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def _our_config(family: Family, hf: Mapping[str, Any], weights: Mapping[str, Tensor | GgufTensor],
                path: Path) -> ModelConfig:
    try:
        return family.model_config(hf, weights.keys())
    except AttnError as err:  # a value the family or our config rejects (e.g. heads not dividing d_model)
        detail = str(err).removeprefix(f"{path}: ").removeprefix(f"{path.name}: ")  # named once, with its folder
        raise CheckpointError(f"{path}: {detail}") from err


# Numbers a model may hold beyond its weights: its rotary or sinusoidal tables, a long context's.
SIZE_ALLOWANCE = 2**22


def _check_size(config: ModelConfig, weights: Mapping[str, Tensor | GgufTensor], path: Path) -> None:
    """Refuses a config whose model would take far more memory than its weights fill, before it is built.

    A config.json that lies (2**40 layers) would otherwise have `build_model` allocate that much. The bound counts
    what every model of the config holds at least.
    """
    head = config.head_size
    layers = config.encoder_layers + config.decoder_layers
    source = config.src_vocab_size if config.src_vocab_size != config.vocab_size else 0  # a vocabulary of its own
    least = ((config.vocab_size + source + config.type_vocab_size) * config.d_model
             + layers * config.d_model * (2 * config.d_ff + config.heads * head) + config.max_positions * head)
    held = sum(tensor.numel() for tensor in weights.values())
    if least > held + SIZE_ALLOWANCE:
        raise CheckpointError(
            f"{path}: describes a model of at least {least:,} numbers (vocab_size={config.vocab_size}, "
            f"d_model={config.d_model}, d_ff={config.d_ff}, {layers} layers, max_positions={config.max_positions}), "
            f"but the weights hold {held:,}; the config does not belong to these weights: restore it")


def read_weights(folder: Path) -> tuple[dict[str, Tensor], str]:
    """The state dict of a model directory and the file it came from (for messages)."""
    index = folder / SAFETENSORS_INDEX
    if (folder / SAFETENSORS_FILE).is_file():
        return _read_safetensors(folder / SAFETENSORS_FILE), str(folder / SAFETENSORS_FILE)
    if index.is_file():
        return {k: v for shard in _shards(index) for k, v in _read_safetensors(folder / shard).items()}, str(index)
    if (folder / TORCH_FILE).is_file():
        return _read_torch(folder / TORCH_FILE), str(folder / TORCH_FILE)
    raise CheckpointError(
        f"{folder}: no weights found; expected {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {TORCH_FILE}"
    )


def _shards(index: Path) -> list[str]:
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: has no 'weight_map' object; restore the file")
    shards = set(weight_map.values())
    # A shard name is a file beside the index: never a path that leads out of the model directory.
    for shard in shards:
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise CheckpointError(f"{index}: shard name {shard!r} is not a file name in the model directory; "
                                  "restore the index")
    return sorted(shards)


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; the shard index lists it")
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors reports every defect as its own SafetensorError
        raise CheckpointError(f"{path}: not a readable safetensors file ({err}); restore the file") from err


def _read_torch(path: Path) -> dict[str, Tensor]:
    state = load_torch_file(path, "restore the file")
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a mapping of names to tensors (a state dict)")
    return dict(state)


def load_tokenizer(folder: Path) -> Tokenizer | None:
    """The tokenizer of a model directory, or None when it has no file attn reads.

    Marian's SentencePiece files come first (even where a tokenizer.json was added beside them), then
    tokenizer.json, GPT-2's vocab.json + merges.txt, BERT's vocab.txt (lower-cased unless tokenizer_config.json
    says `do_lower_case: false`).

    Raises:
        CheckpointError: a file of the tokenizer it finds is missing or unreadable.
    """
    if is_marian_directory(folder):
        return Tokenizer.from_marian_files(folder)
    if (folder / "tokenizer.json").is_file():
        return Tokenizer.from_file(folder / "tokenizer.json")
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return Tokenizer.from_gpt2_files(folder / "vocab.json", folder / "merges.txt")
    if (folder / "vocab.txt").is_file():
        settings = folder / "tokenizer_config.json"
        lowercase = _read_json(settings).get("do_lower_case", True) if settings.is_file() else True
        return Tokenizer.from_bert_vocab(folder / "vocab.txt", lowercase=lowercase)
    return None


def _tokenizer_ids(tokenizer: Tokenizer | None) -> SpecialIds:
    if tokenizer is None:
        return SpecialIds()
    return SpecialIds(pad=tokenizer.pad_id, bos=tokenizer.bos_id, eos=tokenizer.eos_id)
