"""`attn serve` through the official `openai` client, against uvicorn on 127.0.0.1: chat completions (whole and
streamed, several choices, logprobs), completions and embeddings, each the library's own answer for the same
model and input; a chat and a completion sent together decode in one running batch; every sampling setting reaches
decoding, each request's own in a shared batch; the fields OpenAI's clients may send that change nothing are
accepted, and those the server does not implement are a 422 naming them."""

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
from attn.decoding import GenerationConfig, generate, requested

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


def sent_together(server, model: str, *calls):
    """The results of `calls`, started together from threads, and the rows of each step of the model's running
    batch as (route, request) pairs; the first step waits until every call's request was admitted."""
    engine = server.state.serve.engines[model]
    running = engine.running
    step, steps = running.step, []

    def recorded_step():
        if not steps:
            deadline = time.monotonic() + 60
            while engine._admitted < len(calls) and time.monotonic() < deadline:
                time.sleep(0.01)
        found = step()
        steps.append({(token.key[0].work.route, id(token.key[0])) for token in found})
        return found

    start = threading.Barrier(len(calls))

    def started(call):
        start.wait()
        return call()

    running.step = recorded_step
    try:
        with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
            futures = [pool.submit(started, call) for call in calls]
            results = [future.result() for future in futures]
    finally:
        del running.step
    return results, steps


def test_a_chat_and_a_completion_sent_together_share_the_running_batch(server, client,
                                                                      bundles: dict[str, Bundle]) -> None:
    prompt = bundles["chat"].render_chat(JOKE)
    (answer, completion), steps = sent_together(
        server, "chat",
        lambda: client.chat.completions.create(model="chat", messages=JOKE, temperature=0, max_tokens=LIMIT),
        lambda: client.completions.create(model="chat", prompt=prompt, temperature=0, max_tokens=LIMIT))
    assert {"chat/completions", "completions"} in [{route for route, _ in step} for step in steps]
    text = answer.choices[0].message.content
    assert text and completion.choices[0].text.startswith(text)  # the chat ends at the end of its turn


SETTINGS = [  # OpenAI's own arguments, and vLLM's through extra_body
    {"temperature": 0.9, "top_p": 0.95, "seed": 3, "frequency_penalty": 1.2, "logit_bias": {"40": 3},
     "extra_body": {"top_k": 50, "min_p": 0.02}},
    {"temperature": 0, "presence_penalty": 2.0, "logit_bias": {"7": -100, "12": 2.5},
     "extra_body": {"repetition_penalty": 1.3}},
    {"temperature": 1.2, "seed": 9, "presence_penalty": -1.0, "extra_body": {"min_p": 0.1, "top_k": -1}},
]


def library_config(settings: dict) -> GenerationConfig:
    """The library's settings for a request's `settings`, as OpenAI and vLLM mean them."""
    fields = {**settings, **settings.get("extra_body", {})}
    fields.pop("extra_body", None)
    fields["logit_bias"] = {int(token): bias for token, bias in fields.get("logit_bias", {}).items()}
    fields["top_k"] = max(fields.get("top_k", 0), 0)
    return requested(max_new_tokens=LIMIT, **fields)


def test_every_setting_reaches_decoding_each_request_its_own_in_one_batch(server, client,
                                                                          bundles: dict[str, Bundle]) -> None:
    calls = [lambda s=s: client.chat.completions.create(model="chat", messages=JOKE, max_tokens=LIMIT, **s)
             for s in SETTINGS]
    found, steps = sent_together(server, "chat", *calls)
    assert max(map(len, steps)) == len(SETTINGS)  # the three requests decoded together
    for answer, settings in zip(found, SETTINGS):
        text, finish, tokens = library_answer(bundles["chat"], JOKE, library_config(settings))
        choice = answer.choices[0]
        assert (choice.message.content, choice.finish_reason, answer.usage.completion_tokens) == (text, finish, tokens)
    plain = library_answer(bundles["chat"], JOKE, GenerationConfig(max_new_tokens=LIMIT))[0]
    assert found[1].choices[0].message.content != plain  # the penalties changed the greedy answer


def test_a_logit_bias_of_100_makes_greedy_decoding_choose_that_token(client, bundles: dict[str, Bundle]) -> None:
    tokenizer = bundles["chat"].tokenizer
    token = tokenizer.encode(" cat")[-1]
    answer = client.chat.completions.create(model="chat", messages=JOKE, temperature=0, max_tokens=6,
                                            logit_bias={str(token): 100})
    assert answer.choices[0].message.content == tokenizer.decode([token] * 6)
    completion = client.completions.create(model="lm", prompt="In the", temperature=0, max_tokens=5,
                                           logit_bias={str(token % 40): 100})
    assert completion.choices[0].text == bundles["lm"].tokenizer.decode([token % 40] * 5)


def test_a_presence_penalty_changes_a_repeated_answer(client, bundles: dict[str, Bundle]) -> None:
    plain = client.completions.create(model="lm", prompt="In the", temperature=0, max_tokens=LIMIT)
    penalised = client.completions.create(model="lm", prompt="In the", temperature=0, max_tokens=LIMIT,
                                          presence_penalty=2.0)
    text, penalised_text = plain.choices[0].text, penalised.choices[0].text
    assert len(set(text)) < len(text) and len(set(penalised_text)) > len(set(text))
    expected = continue_texts(bundles["lm"], ["In the"], GenerationConfig(max_new_tokens=LIMIT, presence_penalty=2.0))
    assert penalised_text == expected[0][0].text


NO_OPS = {"user": "u-1", "store": False, "metadata": {"team": "docs"}, "service_tier": "auto",
          "parallel_tool_calls": False, "modalities": ["text"], "response_format": {"type": "text"},
          "tool_choice": "none", "tools": [], "prompt_cache_key": "k", "safety_identifier": "s"}


def test_fields_that_change_nothing_are_accepted(client) -> None:
    plain = client.chat.completions.create(model="chat", messages=JOKE, temperature=0, max_tokens=LIMIT)
    accepted = client.chat.completions.create(model="chat", messages=[{**JOKE[0], "name": "narrator"}, JOKE[1]],
                                              temperature=0, max_tokens=LIMIT, **NO_OPS)
    assert accepted.choices[0].message.content == plain.choices[0].message.content
    again = client.chat.completions.create(model="chat", messages=[*JOKE, plain.choices[0].message,
                                                                   {"role": "user", "content": "Hi"}], max_tokens=4)
    assert again.choices[0].message.role == "assistant"  # an answer sent back as the client parsed it
    chunks = list(client.completions.create(model="lm", prompt="In the", temperature=0, max_tokens=5, stream=True,
                                            user="u-1", echo=False, best_of=1,
                                            stream_options={"include_usage": True, "include_obfuscation": False}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert [c.usage for c in chunks[:-1]] == [None] * 5


@pytest.mark.parametrize(("route", "fields", "param", "message"), [
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice",
     "names the function 'f', which is not among the tools"),
    ("chat", {"extra_body": {"reasoning_effort": "high"}}, "reasoning_effort", "is not supported by this server"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities", "it answers in text only"),
    ("completions", {"echo": True}, "echo", "leave echo out or false"),
    ("completions", {"best_of": 3}, "best_of", "leave best_of out or equal to n"),
    ("completions", {"logit_bias": {"100000": 5}}, "logit_bias", "token id 100000 is outside the model's vocabulary"),
])
def test_what_the_server_does_not_do_is_a_422_naming_the_field(client, route, fields, param, message) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as found:
        if route == "chat":
            client.chat.completions.create(model="chat", messages=JOKE, **fields)
        else:
            client.completions.create(model="lm", prompt="In the", **fields)
    error = found.value.body
    assert error["param"] == param and message in error["message"], error


def test_a_model_without_a_chat_template_is_a_clear_client_error(client) -> None:
    with pytest.raises(openai.BadRequestError) as found:
        client.chat.completions.create(model="lm", messages=JOKE)
    assert found.value.status_code == 400
    assert "cannot serve /v1/chat/completions, which needs a decoder-only language model with a chat template" in (
        found.value.message)
