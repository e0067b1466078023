"""Export of `attn` models built from our presets: `transformers` loads them and computes the same outputs.

The Llama-family presets are also checked against the checkpoints they describe: the parameter count of
the same config built by `transformers` (and the model card's, where it gives one), and the config.json
an export writes, which must read back as the preset.
"""

import pytest
import torch
from hf_reference import hf_logits
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    BertForMaskedLM,
    BertModel,
    GPT2LMHeadModel,
    MarianMTModel,
)

from attn.artifacts.pretrained import FAMILIES, SpecialIds, export_pretrained
from attn.data.tokenizers import Tokenizer
from attn.models import build_model, count_parameters
from attn.core.presets import preset


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


def causal_lm_outputs(model, hf, tokens):
    """Logits of a row and a row left-padded by 5, 12 tokens: longer than the tiny presets' windows of 8."""
    ids = tokens(2, 12)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, :5] = False
    return model(ids, mask)[mask], hf_logits(hf, ids, mask)[mask]


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
# The Llama-family presets and the family of the checkpoint each describes.
LLAMA_PRESETS = {
    "llama-3.2-1b": "llama", "qwen2.5-0.5b": "qwen2", "qwen3-0.6b": "qwen3", "smollm2-135m": "llama",
    "smollm2-360m": "llama", "gemma-2-2b": "gemma2", "gemma-3-270m": "gemma3_text", "mistral-7b": "mistral",
    "olmo-2-1b": "olmo2", "phi-3-mini": "phi3",
}
CASES.update({f"{name}-tiny": (preset(f"{name}-tiny"), family, AutoModelForCausalLM, causal_lm_outputs)
              for name, family in LLAMA_PRESETS.items()})


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


# The parameter counts the model cards give.
CITED_PARAMETERS = {
    "llama-3.2-1b": 1_235_814_400, "qwen2.5-0.5b": 494_032_768, "smollm2-135m": 134_515_008,
    "mistral-7b": 7_241_732_096,
}


@pytest.mark.parametrize("name", LLAMA_PRESETS)
def test_preset_has_the_parameters_of_the_same_config_in_transformers(name):
    config = preset(name)
    hf_config = FAMILIES[LLAMA_PRESETS[name]].hf_config(config, SpecialIds())
    with torch.device("meta"):  # shapes only
        ours = count_parameters(build_model(config))
        theirs = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf_config))
    assert ours == sum(p.numel() for p in theirs.parameters())  # a tied matrix counts once on both sides
    assert ours == CITED_PARAMETERS.get(name, ours)


@pytest.mark.parametrize("name", LLAMA_PRESETS)
def test_preset_reads_back_from_the_config_json_it_exports(name):
    family = FAMILIES[LLAMA_PRESETS[name]]
    assert family.model_config(family.hf_config(preset(name), SpecialIds()), ()) == preset(name)


# Every character class a user's text holds: double spaces, a tab, newlines (one at the end),
# accents (composed and decomposed), punctuation against words, and emoji outside the BMP.
TEXT = "ROMEO.\nBut soft,  what light\tthrough yonder window breaks?\nCafé, naïve re\u0301sumé: 🙂 😀!\n"
TRAINING = [TEXT, "the cat sat on the mat.\tA dog ran.", "Über straße, ñandú 🙂 and more words here"] * 4
TOKENIZERS = {
    "chars": lambda: Tokenizer.train_chars(TRAINING),
    "bpe": lambda: Tokenizer.train_bpe(TRAINING, 150),
    "byte-bpe": lambda: Tokenizer.train_bpe(TRAINING, 300, byte_level=True),
    "wordpiece": lambda: Tokenizer.train_wordpiece(TRAINING, 150),
}
FAMILY_PRESETS = {
    "gpt2": preset("gpt2-tiny"),
    "bert": preset("bert-base-tiny").replace(pooler=False, num_labels=0),
    "marian": preset("marian-base-tiny"),
    "llama": preset("llama-3.2-1b-tiny"),
}


@pytest.mark.parametrize("family", FAMILY_PRESETS)
@pytest.mark.parametrize("kind", TOKENIZERS)
def test_auto_tokenizer_reads_our_exported_tokenizer_as_we_do(kind, family, tmp_path):
    """`attn convert --to FAMILY` of a model with a trained tokenizer: transformers' AutoTokenizer,
    loaded offline from the exported folder, gives our ids and our text, frame included."""
    from transformers import AutoTokenizer

    ours = TOKENIZERS[kind]()
    config = FAMILY_PRESETS[family].replace(vocab_size=ours.vocab_size)
    export_pretrained(build_model(config), config, tmp_path, family, tokenizer=ours)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    for add_special in (False, True):
        ids = ours.encode(TEXT, add_special)
        assert theirs(TEXT, add_special_tokens=add_special)["input_ids"] == ids
        for skip in (True, False):
            assert theirs.decode(ids, skip_special_tokens=skip) == ours.decode(ids, skip)
    # A plain-text kind must give the text back: the round trip goes through HF's decode too.
    if kind in ("chars", "byte-bpe"):
        assert theirs.decode(theirs(TEXT)["input_ids"], skip_special_tokens=True) == TEXT
    assert (theirs.pad_token_id, theirs.eos_token_id) == (ours.pad_id, ours.eos_id)
