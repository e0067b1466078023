"""`attn serve`'s prefix cache: a chat's next turns and completions whose prompts share a start feed only what the
cache lacks, and answer as the library does for the whole prompt, under the default budget and under one so small
that it evicts at every request; a negative budget is refused, naming its flag."""

from __future__ import annotations

import pytest
from chat_models import tiny_gqa_chat_bundle
from fastapi.testclient import TestClient

from attn.app.serve import ServedModel, ServeOptions, create_app
from attn.artifacts import Bundle
from attn.core.errors import ConfigError
from attn.decoding import GenerationConfig
from attn.inference.continuation import continue_texts

LIMIT = 10
TURNS = ["Hello! How are you today?", "Tell me a joke about cats.", "What is the capital of France?"]


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return tiny_gqa_chat_bundle()


def _library(bundle: Bundle, prompt: str, chat: bool) -> str:
    config = bundle.generation_config(GenerationConfig(max_new_tokens=LIMIT), chat=chat)
    return continue_texts(bundle, [prompt], config, chat=chat)[0][0].text


@pytest.fixture
def fed(bundle: Bundle):
    """The number of tokens of each forward pass of the model during the test (its embeddings' inputs)."""
    counts: list[int] = []
    handle = bundle.model.embeddings.register_forward_hook(lambda m, inputs, out: counts.append(inputs[0].numel()))
    yield counts
    handle.remove()


# The default budget, and one of about 70 tokens' keys and values: every request evicts.
@pytest.mark.parametrize("budget", [ServeOptions().prefix_cache_bytes, 30_000], ids=["default", "evicting"])
def test_shared_starts_are_fed_once_and_answers_are_the_librarys(bundle: Bundle, fed: list[int], budget: int) -> None:
    app = create_app([ServedModel("chat", bundle)], ServeOptions(prefix_cache_bytes=budget))
    prefixes = app.state.serve.engines["chat"].running.prefix_cache
    with TestClient(app) as client:
        messages: list[dict[str, str]] = []
        for text in TURNS:
            messages.append({"role": "user", "content": text})
            before = len(fed)
            answer = client.post("/v1/chat/completions", json={"model": "chat", "messages": messages,
                                                               "temperature": 0, "max_tokens": LIMIT}).json()
            content = answer["choices"][0]["message"]["content"]
            assert content == _library(bundle, bundle.render_chat(messages), chat=True)
            if budget == ServeOptions().prefix_cache_bytes and len(messages) > 1:
                assert fed[before] < answer["usage"]["prompt_tokens"]  # the first pass feeds only the new turn
            messages.append({"role": "assistant", "content": content})
            assert 0 < prefixes.nbytes <= budget
        rendered = bundle.render_chat(messages[:2])
        prompts = [rendered, rendered + " more", "Tell me", rendered[:-5]]  # a cached start but for "Tell me"
        choices = client.post("/v1/completions", json={"model": "chat", "prompt": prompts, "temperature": 0,
                                                       "max_tokens": LIMIT}).json()["choices"]
        assert [c["text"] for c in choices] == [_library(bundle, p, chat=False) for p in prompts]


def test_a_negative_budget_is_refused_naming_its_flag() -> None:
    with pytest.raises(ConfigError, match=r"--prefix-cache-bytes.*must be >= 0"):
        ServeOptions(prefix_cache_bytes=-1)
