"""Batch translation through `attn.app.inference.translate`."""

from pathlib import Path

import torch

from attn.app.inference import translate
from attn.artifacts import Bundle
from attn.config import preset
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig
from attn.models import build_model

TEXTS = ["In the beginning", "God created the heavens and the earth", "Light",
         "and God saw the light, that it was good", "He divided the light from the darkness"]


def test_length_sorted_batches_give_each_text_its_own_translation_in_input_order():
    tokenizer = Tokenizer.train_chars(TEXTS)
    torch.manual_seed(0)
    config = preset("paper-base-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0)
    model = build_model(config).eval()
    loaded = Bundle(model, tokenizer, "translation", config, Path("."), start_id=2, eos_id=3, pad_id=0)
    decoding = GenerationConfig(beam_size=2, max_new_tokens=12)
    alone = [translate(loaded, [text], decoding)[0] for text in TEXTS]
    assert translate(loaded, TEXTS, decoding, batch_size=2) == alone
    assert len(set(alone)) > 1  # the texts do not all translate alike, so an order mix-up would show
