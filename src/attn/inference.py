"""Using a trained or imported model on text: what `attn translate/generate/classify/embed` call.

`load_for_inference(path)` accepts an `attn` checkpoint, a run directory (its latest checkpoint)
or a local Hugging Face directory (GPT-2, BERT, Marian), and returns the model with the tokenizer
and the facts needed to use it (task, special ids, label names).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from attn.beam_search import beam_search_seq2seq
from attn.config import ModelConfig
from attn.data import pad_batch
from attn.errors import AttnError, CheckpointError, GenerationError
from attn.generation import GenerationConfig, generate_seq2seq, stream
from attn.models import Decoder, Encoder, EncoderDecoder, Model
from attn.pretrained.decoding import DecodingRules
from attn.tokenizers import Tokenizer

# What an imported Hugging Face family is used for.
_FAMILY_TASKS = {"gpt2": "lm", "marian": "translation", "bert": "embedding"}
_KIND_NAMES = {EncoderDecoder: "an encoder-decoder", Decoder: "a decoder-only", Encoder: "an encoder-only"}
DEFAULT_NEW_TOKENS = 200  # what `generate_stream` writes when the config sets no limit


@dataclasses.dataclass
class Loaded:
    """A model ready for inference.

    Attributes:
        model: in eval mode, on the CPU.
        tokenizer: the model's tokenizer.
        task: "translation", "lm", "classification", "mlm" or "embedding".
        start_id: the token a decoder starts from (bos; Marian's pad).
        eos_id: the end-of-sequence id, or None.
        pad_id: the padding id used for batches.
        label_names: the classes of a classifier, by id.
        path: where it was loaded from.
        rules: what every translation applies besides the decoding options (Marian: sources end
            with `</s>`, the pad id is never generated, EOS is forced at the length limit).
    """

    model: Model
    tokenizer: Tokenizer
    task: str
    start_id: int | None
    eos_id: int | None
    pad_id: int
    label_names: list[str]
    path: Path
    rules: DecodingRules = dataclasses.field(default_factory=DecodingRules)


def load_for_inference(path: str | Path, device: str = "auto") -> Loaded:
    """Loads an `attn` checkpoint, a run directory or a Hugging Face model directory onto `device`.

    Args:
        path: the checkpoint or directory.
        device: "auto" (the GPU when there is one, else the CPU), "cpu", "cuda" or "cuda:N".

    Raises:
        CheckpointError: nothing loadable at `path`, or a model without a tokenizer.
        ConfigError: an unknown or unavailable device.
    """
    from attn.training.distributed import resolve_device

    chosen = resolve_device(device, field="--device")
    loaded = _load(Path(path))
    loaded.model.to(chosen)
    return loaded


def _load(path: Path) -> Loaded:
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or model directory; check the path")
    if (path / "config.json").exists() and not (path / "model_config.json").exists():
        return _load_huggingface(path)
    from attn.training.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(path)
    tokenizer = _require_tokenizer(checkpoint.tokenizer, checkpoint.path, checkpoint.model_config)
    task = checkpoint.task_info.get("task") or _default_task(checkpoint.model)
    rules = DecodingRules.from_json(checkpoint.task_info.get("decoding"))  # kept by `attn convert --to attn`
    start = tokenizer.bos_id if rules.start_id is None else rules.start_id
    return Loaded(
        checkpoint.model, tokenizer, task, start, tokenizer.eos_id, tokenizer.pad_id or 0,
        list(checkpoint.task_info.get("label_names", [])), checkpoint.path, rules,
    )


def _load_huggingface(path: Path) -> Loaded:
    from attn.pretrained import load_pretrained

    model, tokenizer, info = load_pretrained(path)
    tokenizer = _require_tokenizer(tokenizer, path, info.config)
    start = tokenizer.bos_id if info.decoding.start_id is None else info.decoding.start_id
    pad = info.ids.pad if info.ids.pad is not None else (tokenizer.pad_id or 0)
    eos = info.ids.eos if info.ids.eos is not None else tokenizer.eos_id
    return Loaded(model, tokenizer, _FAMILY_TASKS[info.family], start, eos, pad, [], path, info.decoding)


def _require_tokenizer(tokenizer: Tokenizer | None, path: Path, config: ModelConfig) -> Tokenizer:
    """The model's tokenizer, checked to give only ids that the model's embeddings have."""
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
    return tokenizer


def _default_task(model: Model) -> str:
    if isinstance(model, EncoderDecoder):
        return "translation"
    return "lm" if isinstance(model, Decoder) else "embedding"


def _expect(loaded: Loaded, kind: type, what: str) -> None:
    if not isinstance(loaded.model, kind):
        raise AttnError(f"{loaded.path} holds {_KIND_NAMES[type(loaded.model)]} model ({loaded.task}); "
                        f"{what} needs {_KIND_NAMES[kind]} model: give a checkpoint trained for it")


def _checked(texts: Sequence[str]) -> list[str]:
    texts = [t.strip() for t in texts]
    if not texts or not all(texts):
        raise GenerationError("empty input text: give at least one non-blank line per input")
    return texts


def _texts_to_ids(loaded: Loaded, texts: Sequence[str], add_special: bool) -> list[list[int]]:
    return loaded.tokenizer.encode_batch(_checked(texts), add_special=add_special)


def translate(loaded: Loaded, texts: Sequence[str], config: GenerationConfig | None = None,
              batch_size: int = 32) -> list[str]:
    """Translates each text with the encoder-decoder (the paper's beam 4, alpha 0.6 by default).

    Texts are decoded in batches of similar source length (a batch runs until its longest
    translation ends), and returned in their input order. The model's `loaded.rules` apply on top
    of `config`, so an imported Marian model translates as `transformers`' `generate` does.
    """
    _expect(loaded, EncoderDecoder, "translation")
    config = loaded.rules.applied_to(config or GenerationConfig.paper())
    sources = _texts_to_ids(loaded, texts, add_special=loaded.rules.frame_sources)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[list[int]] = [[] for _ in sources]
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            decoded = generate_seq2seq(loaded.model, [sources[i] for i in chunk], loaded.start_id, loaded.eos_id,
                                       loaded.pad_id, config)
            for i, tokens in zip(chunk, decoded, strict=True):
                outputs[i] = tokens
    return loaded.tokenizer.decode_batch(outputs)


def translate_n_best(loaded: Loaded, text: str, config: GenerationConfig) -> list[tuple[str, float]]:
    """The n best translations of one text with their scores (under `loaded.rules`, as `translate`)."""
    _expect(loaded, EncoderDecoder, "translation")
    source = _texts_to_ids(loaded, [text], add_special=loaded.rules.frame_sources)
    with torch.inference_mode():
        (hypotheses,) = beam_search_seq2seq(
            loaded.model, source, loaded.start_id, loaded.eos_id, loaded.pad_id, loaded.rules.applied_to(config)
        )
    return [(loaded.tokenizer.decode(h.tokens), h.score) for h in hypotheses]


def generate_stream(loaded: Loaded, prompt: str, config: GenerationConfig) -> Iterator[str]:
    """Continues a prompt with the decoder-only model, yielding text pieces as tokens arrive.

    The prompt is checked and prefilled when this is called, so its errors come before any text.
    Without `config.max_new_tokens`, at most `DEFAULT_NEW_TOKENS` tokens are written, fewer when the
    model's positions run out first.

    Raises:
        GenerationError: the prompt is too long for the model, or the config asks for more tokens than fit.
    """
    _expect(loaded, Decoder, "text generation")
    ids = loaded.tokenizer.encode(prompt) if prompt else []
    if not ids:
        if loaded.start_id is None:
            raise GenerationError("empty prompt and the tokenizer has no start token: give a prompt")
        ids = [loaded.start_id]
    if config.max_new_tokens is None:
        room = loaded.model.max_positions - len(ids) + 1  # as in generation: the last token is never fed back
        config = dataclasses.replace(config, max_new_tokens=max(1, min(DEFAULT_NEW_TOKENS, room)))
    decode = loaded.tokenizer.decode
    tokens = stream(loaded.model, ids, config, eos_id=loaded.eos_id, decode=decode)
    return _text_pieces(tokens, decode)


def _text_pieces(tokens: Iterator[int], decode: Callable[[list[int]], str]) -> Iterator[str]:
    """The new text of each token: decoding the whole output each time keeps multi-byte characters whole."""
    produced: list[int] = []
    shown = ""
    for token in tokens:  # `stream` decodes under inference mode
        produced.append(token)
        text = decode(produced)
        yield text[len(shown):]
        shown = text


@dataclasses.dataclass(frozen=True)
class Prediction:
    label: str
    probability: float
    probabilities: dict[str, float]


def classify(loaded: Loaded, texts: Sequence[str], batch_size: int = 64) -> list[Prediction]:
    """The most probable label of each text, with the class probabilities."""
    _expect(loaded, Encoder, "classification")
    if not loaded.label_names:
        raise AttnError(f"{loaded.path} is not a trained classifier (no label names); train one with task=classification")
    probs = class_probabilities(loaded, texts, batch_size)
    names = loaded.label_names
    return [
        Prediction(names[int(row.argmax())], float(row.max()), {n: float(p) for n, p in zip(names, row)})
        for row in probs
    ]


def class_probabilities(loaded: Loaded, texts: Sequence[str], batch_size: int = 64) -> Tensor:
    """(N, num_labels) class probabilities of each text."""
    limit = loaded.model.stack.max_positions
    ids = [seq[:limit] for seq in _texts_to_ids(loaded, texts, add_special=True)]
    device = next(loaded.model.parameters()).device
    rows = []
    with torch.inference_mode():
        for start in range(0, len(ids), batch_size):
            tokens, mask = pad_batch(ids[start : start + batch_size], loaded.pad_id)
            rows.append(loaded.model.classify(tokens.to(device), mask.to(device)).softmax(-1).cpu())
    return torch.cat(rows)


def embed(loaded: Loaded, texts: Sequence[str], batch_size: int = 64) -> Tensor:
    """Mean-pooled, L2-normalised sentence embeddings (N, d_model), on the CPU."""
    from attn.pretrained import embed_texts

    _expect(loaded, Encoder, "embedding")
    return embed_texts(loaded.model, loaded.tokenizer, _checked(texts), batch_size).cpu()
