"""`attn serve --lora NAME=DIR`: a PEFT adapter served as a model of its own beside its base, on one base's weights.

The adapter model answers as the base with the adapter merged into its weights (`merge_lora`, computed apart);
the base answers as it did without the adapter.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fastapi.testclient import TestClient
from serve_models import TEXTS

from attn.app.serve import ServedModel, create_app
from attn.app.serve.served_models import adapter_models, load_served_models
from attn.artifacts import Bundle, load_model
from attn.artifacts.adapters import load_adapter, save_adapter, shared_copy
from attn.artifacts.pretrained import SpecialIds, export_pretrained
from attn.core.errors import ConfigError
from attn.core.lora import LoRAConfig, add_lora, merge_lora
from attn.core.presets import preset
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig
from attn.inference.continuation import continue_texts
from attn.models import build_model

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = ["In the", "And God said"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """A tiny Llama-style model with grouped KV heads as a Hugging Face directory, and a random adapter of it."""
    root = tmp_path_factory.mktemp("lora")
    tokenizer = Tokenizer.train_chars(TEXTS)
    config = preset("llama-3.2-1b-tiny").replace(vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    model = build_model(config).eval()
    export_pretrained(model, config, root / "base", "llama", tokenizer=tokenizer,
                      ids=SpecialIds(bos=tokenizer.bos_id, eos=tokenizer.eos_id, pad=tokenizer.pad_id))
    add_lora(model, LoRAConfig(rank=4, alpha=8, targets=TARGETS))
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if ".lora." in name:
                tensor.normal_(0, 0.3)
    save_adapter(model, config, root / "adapter", "llama", base=str(root / "base"))
    return {"base": str(root / "base"), "adapter": str(root / "adapter")}


@pytest.fixture(scope="module")
def served(folders: dict[str, str]) -> list[ServedModel]:
    return load_served_models([f"base={folders['base']}"], "cpu", adapters=[f"tuned={folders['adapter']}"])


@pytest.fixture(scope="module")
def client(served: list[ServedModel]):
    with TestClient(create_app(served)) as client:
        yield client


def answers(client: TestClient, model: str) -> list[str]:
    body = {"model": model, "prompt": PROMPTS, "temperature": 0, "max_tokens": 12}
    return [choice["text"] for choice in client.post("/v1/completions", json=body).json()["choices"]]


def library_answers(bundle: Bundle) -> list[str]:
    return [found[0].text for found in continue_texts(bundle, PROMPTS, GenerationConfig(max_new_tokens=12))]


def test_the_adapter_model_answers_as_its_merged_model_and_the_base_as_before(client, folders) -> None:
    base = load_model(folders["base"], "cpu")
    merged = copy.deepcopy(base)
    merge_lora(load_adapter(merged.model, merged.model_config, folders["adapter"], "llama"))
    expected = library_answers(merged)
    assert expected != library_answers(base)  # the adapter changes the answers
    assert answers(client, "tuned") == expected
    assert answers(client, "base") == library_answers(base)


def test_models_lists_the_adapter_model_with_its_base(client) -> None:
    cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    assert list(cards) == ["base", "tuned"]
    assert (cards["base"]["parent"], cards["tuned"]["parent"]) == (None, "base")
    assert {k: v for k, v in cards["tuned"].items() if k not in ("id", "parent")} == \
        {k: v for k, v in cards["base"].items() if k not in ("id", "parent")}


def test_the_adapter_model_holds_the_base_weights_themselves(served: list[ServedModel]) -> None:
    base, tuned = (served_model.bundle.model for served_model in served)
    held = {id(tensor) for tensor in tuned.parameters()}
    assert all(id(tensor) in held for tensor in base.parameters())
    extra = sum(t.numel() for t in tuned.parameters()) - sum(t.numel() for t in base.parameters())
    assert extra == sum(t.numel() for name, t in tuned.named_parameters() if ".lora." in name)


def test_shared_copy_shares_every_tensor_and_linear_layer() -> None:
    model = build_model(preset("llama-3.2-1b-tiny"))
    copied = shared_copy(model)
    assert copied is not model and copied.blocks is not model.blocks
    assert [id(t) for t in copied.state_dict(keep_vars=True).values()] == \
        [id(t) for t in model.state_dict(keep_vars=True).values()]
    assert copied.blocks[0].attn.qkv is model.blocks[0].attn.qkv


@pytest.mark.parametrize("spec, message", [
    ("base={adapter}", "two models are named 'base'"),
    ("=x", "give DIR or NAME=DIR"),
])
def test_a_bad_lora_spec_names_the_flag(served: list[ServedModel], folders, spec, message) -> None:
    with pytest.raises(ConfigError, match=f"--lora.*{message}"):
        adapter_models(served[:1], [spec.format(**folders)])
