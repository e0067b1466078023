"""BERT: tiny random `transformers` BERT models of every head layout, through `load_pretrained`.

Each head layout is compared on a right-padded batch with random segment ids: the MLM logits
(`BertForMaskedLM`, `BertForPreTraining`), the hidden states and pooled vector (`BertModel`), the
class logits (`BertForSequenceClassification`). Export goes back to the same class, and the
vocab.txt tokenizer encodes as `transformers`' BertTokenizer does.
"""

import json

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    BertTokenizer,
)

from attn.artifacts.pretrained import export_pretrained, load_pretrained
from attn.core.errors import CheckpointError
from attn.core.presets import preset

HF_CONFIG = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=64, num_labels=3)


def batch(tokens):
    """Four rows of 12 with random segments; rows 1 and 3 right-padded."""
    ids, segments = tokens(4, 12), tokens(4, 12, high=2, seed=1)
    mask = torch.ones(4, 12, dtype=torch.bool)
    mask[1, 7:] = False
    mask[3, 2:] = False
    return ids, mask, segments


def run_hf(hf, ids, mask, segments):
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments)


# (class, heads expected in our config, ours -> tensor, theirs -> tensor, tensor is per token)
LAYOUTS = {
    "masked-lm": (BertForMaskedLM, (True, False, 0), "mlm_logits", lambda out: out.logits, True),
    "pretraining": (BertForPreTraining, (True, True, 0), "mlm_logits", lambda out: out.prediction_logits, True),
    "base-hidden": (BertModel, (False, True, 0), "forward", lambda out: out.last_hidden_state, True),
    "base-pooled": (BertModel, (False, True, 0), "pooled", lambda out: out.pooler_output, False),
    "classifier": (BertForSequenceClassification, (False, True, 3), "classify", lambda out: out.logits, False),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_outputs_match_transformers(layout, randomised, saved, tokens):
    hf_class, heads, method, theirs, per_token = LAYOUTS[layout]
    hf = randomised(hf_class(HF_CONFIG))
    model, _, info = load_pretrained(saved(hf))
    assert (info.config.mlm_head, info.config.pooler, info.config.num_labels) == heads
    ids, mask, segments = batch(tokens)
    expected = theirs(run_hf(hf, ids, mask, segments))
    with torch.no_grad():
        ours = getattr(model, method)(ids, mask, segments)
    if per_token:
        ours, expected = ours[mask], expected[mask]
    assert expected.abs().mean() > 0.05  # far above the tolerance, so a misplaced weight shows
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_config_is_the_bert_preset_at_tiny_size(randomised, saved):
    _, _, info = load_pretrained(saved(randomised(BertForMaskedLM(HF_CONFIG))))
    expected = preset("bert-base").replace(
        d_model=32, heads=4, d_ff=64, encoder_layers=2, vocab_size=97, max_positions=64, pooler=False
    )
    assert info.family == "bert"
    assert info.config == expected
    assert info.ids.pad == 0


def test_next_sentence_head_is_reported_as_unused(randomised, saved):
    _, _, info = load_pretrained(saved(randomised(BertForPreTraining(HF_CONFIG))))
    assert sorted(info.unused) == ["cls.seq_relationship.bias", "cls.seq_relationship.weight"]
    assert "next-sentence" in info.unused["cls.seq_relationship.weight"]


@pytest.mark.parametrize("hf_class", [BertForMaskedLM, BertModel, BertForSequenceClassification])
def test_export_reloads_in_transformers_with_identical_tensors(hf_class, randomised, saved, tokens,
                                                              assert_exports_identically):
    hf = randomised(hf_class(HF_CONFIG))
    model, _, info = load_pretrained(saved(hf))
    folder = assert_exports_identically(model, info, hf, hf_class)
    assert json.loads((folder / "config.json").read_text())["architectures"] == [hf_class.__name__]


def test_export_refuses_heads_no_transformers_class_has(randomised, saved, tmp_path):
    model, _, info = load_pretrained(saved(randomised(BertForPreTraining(HF_CONFIG))))
    with pytest.raises(CheckpointError, match="no Hugging Face BERT class has exactly these heads"):
        export_pretrained(model, info.config, tmp_path / "out", "bert")


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "Cat", "é", "e"]


@pytest.mark.parametrize("lowercase", [True, False])
def test_vocab_txt_tokenizer_encodes_like_transformers(lowercase, randomised, saved):
    folder = saved(randomised(BertModel(HF_CONFIG)))
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lowercase}))
    _, tokenizer, _ = load_pretrained(folder)
    texts = ["The cat sat on the mats.", "Cat é cats", "the CAT"]
    reference = BertTokenizer(str(folder / "vocab.txt"), do_lower_case=lowercase)
    assert tokenizer.encode_batch(texts, add_special=True) == reference(texts)["input_ids"]
    assert tokenizer.encode("Cat") != tokenizer.encode("cat") or lowercase
