"""Classifying and embedding texts with an encoder-only model: what `attn classify` and `attn embed` call."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from attn.inference.embeddings import embed_texts, encoder_batches
from attn.inference.inputs import checked_texts, expect_model
from attn.artifacts import Bundle
from attn.data.collate import pad_batch
from attn.data.framing import classifier_inputs
from attn.core.errors import AttnError
from attn.models import Encoder


@dataclasses.dataclass(frozen=True)
class Prediction:
    label: str
    probability: float
    probabilities: dict[str, float]


def classify(
    bundle: Bundle, texts: Sequence[str], batch_size: int = 64, pairs: Sequence[str] | None = None
) -> list[Prediction]:
    """The most probable label of each text (or text pair), with the class probabilities.

    A sentence-pair classifier (trained with a `text_pair_field`) takes `pairs`, the second text of each pair.

    Example (an untrained classifier: the probabilities are near uniform):
        >>> import torch
        >>> from attn import Bundle, Tokenizer, build_model, classify, preset
        >>> tokenizer = Tokenizer.train_wordpiece(["a fine day", "a bad day"], 60)
        >>> config = preset("bert-base-tiny").replace(vocab_size=tokenizer.vocab_size, num_labels=2)
        >>> _ = torch.manual_seed(0)
        >>> bundle = Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task="classification",
        ...                 model_config=config, path=".", pad_id=tokenizer.pad_id, label_names=["good", "bad"])
        >>> (prediction,) = classify(bundle, ["a fine day"])
        >>> prediction.label in {"good", "bad"}, round(sum(prediction.probabilities.values()), 5)
        (True, 1.0)
    """
    expect_model(bundle, Encoder, "classification")
    if not bundle.label_names:
        raise AttnError(f"{bundle.path} is not a trained classifier (no label names); "
                        "train one with task=classification")
    probs = class_probabilities(bundle, texts, batch_size, pairs)
    names = bundle.label_names
    return [
        Prediction(names[int(row.argmax())], float(row.max()), {n: float(p) for n, p in zip(names, row)})
        for row in probs
    ]


def class_probabilities(
    bundle: Bundle, texts: Sequence[str], batch_size: int = 64, pairs: Sequence[str] | None = None
) -> Tensor:
    """(N, num_labels) class probabilities of each text, or of each pair (texts[i], pairs[i])."""
    ids, segments = classifier_inputs(bundle.tokenizer, checked_texts(texts), _checked_pairs(bundle, texts, pairs),
                                      bundle.model.stack.max_positions)
    device = next(bundle.model.parameters()).device
    found = []
    with torch.inference_mode():
        for rows in encoder_batches([len(row) for row in ids], batch_size, device):
            tokens, mask = pad_batch([ids[i] for i in rows], bundle.pad_id)
            inputs = [tokens, mask]
            if segments is not None:
                inputs.append(pad_batch([segments[i] for i in rows], 0)[0])
            found.append((rows, bundle.model.classify(*(t.to(device) for t in inputs)).softmax(-1).cpu()))
    out = torch.empty(len(ids), found[0][1].size(-1), dtype=found[0][1].dtype)
    for rows, probabilities in found:
        out[rows] = probabilities
    return out


def _checked_pairs(bundle: Bundle, texts: Sequence[str], pairs: Sequence[str] | None) -> list[str] | None:
    """The second texts, checked against what the model was trained on."""
    pair_field, text_field = bundle.fields.text_pair_field, bundle.fields.text_field
    if pairs is None and pair_field:
        raise AttnError(f"{bundle.path} classifies sentence pairs ({text_field}, {pair_field}); give the second "
                        "text of each pair too (pairs=, or TEXT<TAB>PAIR lines on the command line)")
    if pairs is None:
        return None
    if not pair_field and bundle.imported is None:  # an imported model may have been trained on pairs
        raise AttnError(f"{bundle.path} classifies single texts ({text_field}); give no second texts")
    if len(pairs) != len(texts):
        raise AttnError(f"{len(texts)} texts but {len(pairs)} second texts; give one second text per text")
    return checked_texts(pairs)


def embed(bundle: Bundle, texts: Sequence[str], batch_size: int = 64) -> Tensor:
    """Mean-pooled, L2-normalised sentence embeddings (N, d_model), on the CPU.

    Example:
        >>> from attn import embed, load_model
        >>> minilm = load_model("all-MiniLM-L6-v2", "cpu")
        >>> vectors = embed(minilm, ["A man is eating food.", "A man eats a meal.", "The sky is blue."])
        >>> vectors.shape
        torch.Size([3, 384])
        >>> bool(vectors[0] @ vectors[1] > vectors[0] @ vectors[2])  # unit vectors: dot = cosine
        True
    """
    expect_model(bundle, Encoder, "embedding")
    return embed_texts(bundle.model, bundle.tokenizer, checked_texts(texts), batch_size).cpu()
