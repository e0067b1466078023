"""`attn serve` through the official `openai` client, against uvicorn on 127.0.0.1: chat completions (whole and
streamed, several choices, logprobs), completions and embeddings, each the library's own answer for the same
model and input; a chat and a completion sent together decode in one running batch."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import torch
from chat_models import tiny_chat_bundle
from reference_imports import require
from serve_models import tiny_bundles, uvicorn_serving

from attn.inference.chat import conversation
from attn.inference.classification import embed
from attn.inference.continuation import continue_texts, prompt_ids
from attn.app.serve import ServedModel, create_app
from attn.artifacts import Bundle
from attn.decoding import GenerationConfig, generate

openai = require("openai")

LIMIT = 30
JOKE = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me a joke."}]


@pytest.fixture(scope="module")
def bundles() -> dict[str, Bundle]:
    tiny = tiny_bundles()
    return {"chat": tiny_chat_bundle(), "lm": tiny["lm"], "encoder": tiny["encoder"]}


@pytest.fixture(scope="module")
def server(bundles: dict[str, Bundle]):
    """uvicorn serving the models on a free port of 127.0.0.1, in a thread of this process; yields the app."""
    app = create_app([ServedModel(name, bundle) for name, bundle in bundles.items()])
    with uvicorn_serving(app) as base:
        app.state.base_url = f"{base}/v1"
        yield app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.state.base_url, api_key="x", max_retries=0, timeout=120)


def library_answer(loaded: Bundle, messages: list[dict[str, str]], config: GenerationConfig) -> tuple[str, str, int]:
    """The answer's text, its finish reason and its token count (the end of the turn included), as the library
    decodes the conversation rendered by the model's template."""
    prompt = prompt_ids(loaded, loaded.render_chat(messages))
    config = loaded.generation_config(config, chat=True)
    tokens = generate(loaded.model, [prompt], config, loaded.eos_id, loaded.tokenizer.decode)[0]
    text = continue_texts(loaded, [loaded.render_chat(messages)], config)[0][0].text
    ended = len(tokens) < config.max_new_tokens
    return text, "stop" if ended else "length", len(tokens) + ended


@pytest.mark.parametrize("messages", [JOKE, conversation("Tell me a joke about cats and dogs.", "Be brief."),
                                      [*JOKE, {"role": "assistant", "content": "Why?"}, {"role": "user", "content": "Hi"}]],
                         ids=["system", "limit", "multi-turn"])
def test_a_chat_is_the_librarys_answer(client, bundles: dict[str, Bundle], messages: list[dict[str, str]]) -> None:
    found = client.chat.completions.create(model="chat", messages=messages, temperature=0, max_tokens=LIMIT)
    text, finish, tokens = library_answer(bundles["chat"], messages, GenerationConfig(max_new_tokens=LIMIT))
    (choice,) = found.choices
    assert (choice.message.role, choice.message.content, choice.finish_reason) == ("assistant", text, finish)
    prompt = len(prompt_ids(bundles["chat"], bundles["chat"].render_chat(messages)))
    assert (found.usage.prompt_tokens, found.usage.completion_tokens) == (prompt, tokens)
    assert found.object == "chat.completion" and found.id.startswith("chatcmpl-") and found.model == "chat"


def test_a_streamed_chat_adds_up_to_the_whole_answer(client, bundles: dict[str, Bundle]) -> None:
    chunks = list(client.chat.completions.create(model="chat", messages=JOKE, temperature=0, max_tokens=LIMIT,
                                                 stream=True, stream_options={"include_usage": True}))
    text, finish, tokens = library_answer(bundles["chat"], JOKE, GenerationConfig(max_new_tokens=LIMIT))
    *deltas, last = chunks
    assert "".join(c.choices[0].delta.content for c in deltas) == text and finish == "stop"
    assert deltas[0].choices[0].delta.role == "assistant" and {c.choices[0].delta.role for c in deltas[1:]} == {None}
    assert [c.choices[0].finish_reason for c in deltas] == [None] * (len(deltas) - 1) + [finish]
    assert last.choices == [] and last.usage.completion_tokens == tokens == len(deltas)
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1


def test_sampled_choices_are_seeded_one_after_another(client) -> None:
    request = {"model": "chat", "messages": JOKE, "temperature": 0.9, "top_p": 0.9, "max_tokens": 12}
    pair = client.chat.completions.create(**request, n=2, seed=5).choices
    alone = [client.chat.completions.create(**request, seed=seed).choices[0] for seed in (5, 6)]
    assert [c.message.content for c in pair] == [c.message.content for c in alone]
    assert [c.index for c in pair] == [0, 1] and pair[0].message.content != pair[1].message.content


def test_chat_logprobs_are_those_of_the_same_prompt_completed(client, bundles: dict[str, Bundle]) -> None:
    found = client.chat.completions.create(model="chat", messages=JOKE, temperature=0, max_tokens=LIMIT,
                                           logprobs=True, top_logprobs=3).choices[0].logprobs.content
    prompt = bundles["chat"].render_chat(JOKE)
    completed = client.completions.create(model="chat", prompt=prompt, temperature=0, max_tokens=LIMIT,
                                          logprobs=3).choices[0].logprobs
    assert [t.token for t in found[:-1]] == completed.tokens[: len(found) - 1]  # the last is the end of the turn
    assert [t.logprob for t in found] == pytest.approx(completed.token_logprobs[: len(found)], abs=1e-5)
    for token, top in zip(found, completed.top_logprobs):
        assert {t.token: t.logprob for t in token.top_logprobs} == pytest.approx(top, abs=1e-5)
        assert token.bytes == list(token.token.encode("utf-8")) and len(token.top_logprobs) == 3


def test_completions_and_embeddings_through_the_client_are_the_librarys(client, bundles: dict[str, Bundle]) -> None:
    prompts = ["In the", "And God said"]
    found = client.completions.create(model="lm", prompt=prompts, temperature=0, max_tokens=12)
    expected = continue_texts(bundles["lm"], prompts, GenerationConfig(max_new_tokens=12))
    assert [c.text for c in found.choices] == [e[0].text for e in expected]
    texts = ["a cat", "a kitten sleeps"]
    for encoding in ({}, {"encoding_format": "float"}):  # the client asks for base64 and decodes it, unless told
        vectors = client.embeddings.create(model="encoder", input=texts, **encoding).data
        torch.testing.assert_close(torch.tensor([v.embedding for v in vectors]), embed(bundles["encoder"], texts),
                                   atol=1e-5, rtol=1e-5)


def test_a_chat_and_a_completion_sent_together_share_the_running_batch(server, client,
                                                                      bundles: dict[str, Bundle]) -> None:
    engine = server.state.serve.engines["chat"]
    running = engine.running
    step, routes = running.step, []

    def recorded_step():  # the routes of the rows decoded together in each step
        if not routes:  # the first step waits for the other request, however late its thread sends it
            deadline = time.monotonic() + 60
            while engine._admitted < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        found = step()
        routes.append({token.key[0].work.route for token in found})
        return found

    prompt = bundles["chat"].render_chat(JOKE)
    start = threading.Barrier(2)

    def chat():
        start.wait()
        return client.chat.completions.create(model="chat", messages=JOKE, temperature=0, max_tokens=LIMIT)

    def complete():
        start.wait()
        return client.completions.create(model="chat", prompt=prompt, temperature=0, max_tokens=LIMIT)

    running.step = recorded_step
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answered, completed = pool.submit(chat), pool.submit(complete)
            answer, completion = answered.result(), completed.result()
    finally:
        del running.step
    assert {"chat/completions", "completions"} in routes
    text = answer.choices[0].message.content
    assert text and completion.choices[0].text.startswith(text)  # the chat ends at the end of its turn


def test_a_model_without_a_chat_template_is_a_clear_client_error(client) -> None:
    with pytest.raises(openai.BadRequestError) as found:
        client.chat.completions.create(model="lm", messages=JOKE)
    assert found.value.status_code == 400
    assert "cannot serve /v1/chat/completions, which needs a decoder-only language model with a chat template" in (
        found.value.message)
