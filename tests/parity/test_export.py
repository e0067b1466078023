"""Export of `attn` models built from our presets: `transformers` loads them and computes the same outputs."""

import pytest
import torch
from transformers import BertForMaskedLM, BertModel, GPT2LMHeadModel, MarianMTModel

from attn.config import preset
from attn.models import build_model
from attn.pretrained import SpecialIds, export_pretrained


def built(config):
    """Our model with every weight from N(0, 0.2) (LayerNorm gains around 1), in eval mode."""
    model = build_model(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            gain = name.endswith("norm.weight")
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2 + gain)
    return model.eval()


def padded(tokens, length, pad_from):
    ids = tokens(2, length)
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, pad_from:] = False
    return ids, mask


def gpt2_outputs(model, hf, tokens):
    ids, mask = padded(tokens, 10, 6)
    return model(ids, mask)[mask], hf(input_ids=ids, attention_mask=mask.long()).logits[mask]


def bert_mlm_outputs(model, hf, tokens):
    ids, mask = padded(tokens, 10, 6)
    segments = tokens(2, 10, high=2, seed=1)
    expected = hf(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments).logits
    return model.mlm_logits(ids, mask, segments)[mask], expected[mask]


def bert_pooled_outputs(model, hf, tokens):
    ids, mask = padded(tokens, 10, 6)
    return model.pooled(ids, mask), hf(input_ids=ids, attention_mask=mask.long()).pooler_output


def marian_outputs(model, hf, tokens):
    (src, src_mask), (tgt, tgt_mask) = padded(tokens, 9, 5), padded(tokens, 7, 4)
    expected = hf(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt,
                  decoder_attention_mask=tgt_mask.long()).logits
    return model(src, tgt, src_mask, tgt_mask)[tgt_mask], expected[tgt_mask]


CASES = {
    "gpt2-tiny": (preset("gpt2-tiny"), "gpt2", GPT2LMHeadModel, gpt2_outputs),
    "bert-mlm": (preset("bert-base-tiny").replace(pooler=False, num_labels=0), "bert", BertForMaskedLM,
                 bert_mlm_outputs),
    "minilm-tiny": (preset("minilm-l6-tiny").replace(num_labels=0), "bert", BertModel, bert_pooled_outputs),
    "marian-base-tiny": (preset("marian-base-tiny"), "marian", MarianMTModel, marian_outputs),
}


@pytest.mark.parametrize("case", CASES)
def test_transformers_runs_our_exported_model_identically(case, tmp_path, tokens):
    config, family, hf_class, outputs = CASES[case]
    model = built(config)
    export_pretrained(model, config, tmp_path, family, ids=SpecialIds(pad=96, eos=0))
    hf = hf_class.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        ours, expected = outputs(model, hf, tokens)
    assert expected.abs().mean() > 0.05  # far above the tolerance, so a misplaced weight shows
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
