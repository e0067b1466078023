"""Batched inference through `attn.inference.translation` and `attn.inference.classification`: translation,
classification and embeddings of texts of mixed lengths, each equal to the text alone, in input order."""

from pathlib import Path

import torch

from attn.inference.classification import class_probabilities, embed
from attn.inference.embeddings import CPU_BATCH_TOKENS, encoder_batches
from attn.inference.translation import translate
from attn.artifacts import Bundle
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig
from attn.models import build_model
from attn.core.presets import preset

TEXTS = ["In the beginning", "God created the heavens and the earth", "Light",
         "and God saw the light, that it was good", "He divided the light from the darkness"]


def test_length_sorted_batches_give_each_text_its_own_translation_in_input_order():
    tokenizer = Tokenizer.train_chars(TEXTS)
    torch.manual_seed(0)
    config = preset("paper-base-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0)
    model = build_model(config).eval()
    loaded = Bundle(model=model, tokenizer=tokenizer, task="translation", model_config=config, path=Path("."),
                    start_id=2, eos_id=3, pad_id=0)
    decoding = GenerationConfig(beam_size=2, max_new_tokens=12)
    alone = [translate(loaded, [text], decoding)[0] for text in TEXTS]
    longest = max(len(text) for text in TEXTS) + 1  # characters and the closing token
    assert translate(loaded, TEXTS, decoding, batch_tokens=2 * longest) == alone  # 3 batches, 2 of 2 texts
    assert len(set(alone)) > 1  # the texts do not all translate alike, so an order mix-up would show


def _encoder(task: str, **extra: int) -> Bundle:
    tokenizer = Tokenizer.train_chars(TEXTS)
    torch.manual_seed(1)
    config = preset("bert-base-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0, **extra)
    return Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task=task, model_config=config, path=Path("."),
                  pad_id=tokenizer.pad_id or 0)


def test_classification_and_embeddings_of_mixed_lengths_are_each_texts_alone_in_input_order():
    classifier, encoder = _encoder("classification", num_labels=3), _encoder("embedding")
    alone = torch.cat([class_probabilities(classifier, [text]) for text in TEXTS])
    torch.testing.assert_close(class_probabilities(classifier, TEXTS, batch_size=2), alone, atol=1e-5, rtol=1e-5)
    assert len({tuple(row.tolist()) for row in alone}) == len(TEXTS)
    vectors = torch.cat([embed(encoder, [text]) for text in TEXTS])
    torch.testing.assert_close(embed(encoder, TEXTS, batch_size=2), vectors, atol=1e-5, rtol=1e-5)


def test_encoder_batches_keep_a_cpu_pass_within_its_token_budget_and_a_gpu_pass_to_its_row_limit():
    lengths = [100, 7, 300, 9, 100, 100, 600, 100, 8, 100]
    on_cpu = encoder_batches(lengths, 64, torch.device("cpu"))
    assert sorted(i for batch in on_cpu for i in batch) == list(range(len(lengths)))
    for batch in on_cpu:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= CPU_BATCH_TOKENS
    assert on_cpu == [[1, 8, 3, 0, 4], [5, 7, 9], [2], [6]]  # shortest first; 600 tokens run alone
    assert encoder_batches(lengths, 4, torch.device("cuda")) == [[1, 8, 3, 0], [4, 5, 7, 9], [2, 6]]
