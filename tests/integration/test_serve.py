"""`attn serve` through its HTTP API (FastAPI's TestClient), on tiny random models: every route's
answer against the library functions it stands for, computed independently."""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading

import pytest
import torch
from fastapi.testclient import TestClient
from serve_models import PAIR_LABELS, TEXTS, tiny_bundles

from attn.inference.attention_views import attention_of
from attn.inference.classification import classify, embed
from attn.inference.continuation import continue_texts, prompt_ids
from attn.app.serve import ServedModel, create_app
from attn.app.serve.routes import PAGE
from attn.app.serve.work import classify_job
from attn.inference.translation import translate
from attn.artifacts import Bundle
from attn.decoding import GenerationConfig

ATOL = 1e-5


@pytest.fixture(scope="module")
def bundles() -> dict[str, Bundle]:
    return tiny_bundles()


@pytest.fixture(scope="module")
def client(bundles: dict[str, Bundle]):
    with TestClient(create_app([ServedModel(name, bundle) for name, bundle in bundles.items()])) as client:
        yield client


def events(response) -> list[dict | str]:
    """The `data:` payloads of a server-sent event stream (JSON objects, and the final "[DONE]")."""
    found = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.startswith("data: ")]
    return [item if item == "[DONE]" else json.loads(item) for item in found]


def test_models_lists_every_model_with_its_shape(client: TestClient, bundles: dict[str, Bundle]) -> None:
    cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    assert list(cards) == ["translator", "lm", "classifier", "encoder", "pairs"]
    translator = bundles["translator"].model_config
    assert cards["translator"] == {"id": "translator", "object": "model", "owned_by": "attn", "task": "translation",
                                   "architecture": "encoder-decoder", "max_positions": 64,
                                   "layers": translator.encoder_layers, "decoder_layers": translator.decoder_layers,
                                   "heads": translator.heads, "kv_heads": translator.heads,
                                   "head_groups": list(range(translator.heads)), "labels": [], "pairs": False,
                                   "chat": False, "parent": None}
    assert cards["lm"]["architecture"] == "decoder-only" and cards["lm"]["decoder_layers"] is None
    assert cards["classifier"]["labels"] == ["art", "law", "food"]
    assert [name for name, card in cards.items() if card["pairs"]] == ["pairs"]
    assert cards["pairs"]["labels"] == PAIR_LABELS


def test_translate_gives_what_the_library_translates(client: TestClient, bundles: dict[str, Bundle]) -> None:
    texts = TEXTS[:3]
    answer = client.post("/v1/translate", json={"model": "translator", "inputs": texts, "max_tokens": 12,
                                                "n_best": 3}).json()
    expected = translate(bundles["translator"], texts, GenerationConfig(beam_size=4, length_penalty=0.6,
                                                                        max_new_tokens=12))
    assert [t["text"] for t in answer["translations"]] == expected
    for found in answer["translations"]:
        scores = [h["score"] for h in found["n_best"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True) and found["n_best"][0]["text"] == found["text"]
    greedy = client.post("/v1/translate", json={"model": "translator", "input": texts[0], "beam_size": 1,
                                                "max_tokens": 12}).json()
    assert greedy["translations"][0]["text"] == translate(bundles["translator"], texts[:1],
                                                          GenerationConfig(max_new_tokens=12))[0]


def test_translate_alignment_is_the_last_layer_cross_attention(client: TestClient, bundles: dict[str, Bundle]) -> None:
    text = TEXTS[2][:30]  # its translation stays within the positions, as attention_of's below
    found = client.post("/v1/translate", json={"model": "translator", "input": text,
                                               "alignment": True}).json()["translations"][0]
    aligned = found["alignment"]
    weights = torch.tensor(aligned["weights"])
    assert weights.shape == (len(aligned["target_tokens"]), len(aligned["source_tokens"]))
    assert aligned["source_tokens"] == list(text)
    torch.testing.assert_close(weights.sum(1), torch.ones(len(weights)), atol=ATOL, rtol=ATOL)
    # `attention_of` draws the same map over the same translation: its rows are the decoder's inputs
    # (start token, then the output), so row i is the query that chose output token i.
    view = attention_of(bundles["translator"], text, "cross", -1, None)
    torch.testing.assert_close(weights, view.weights[: len(weights)], atol=ATOL, rtol=ATOL)


def test_greedy_completions_are_what_continue_texts_writes(client: TestClient, bundles: dict[str, Bundle]) -> None:
    prompts = ["In the", "And God said"]
    answer = client.post("/v1/completions", json={"model": "lm", "prompt": prompts, "temperature": 0,
                                                  "max_tokens": 12}).json()
    expected = continue_texts(bundles["lm"], prompts, GenerationConfig(max_new_tokens=12))
    assert [c["text"] for c in answer["choices"]] == [found[0].text for found in expected]
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    prompt_tokens = sum(len(prompt_ids(bundles["lm"], p)) for p in prompts)
    assert answer["usage"]["prompt_tokens"] == prompt_tokens
    assert answer["usage"]["total_tokens"] == prompt_tokens + answer["usage"]["completion_tokens"]
    for choice in answer["choices"]:
        assert choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    assert answer["id"].startswith("cmpl-") and answer["object"] == "text_completion"


def test_completions_sent_together_are_decoded_together_and_each_equals_its_answer_alone(
        bundles: dict[str, Bundle]) -> None:
    prompts = ["In the", "And God said", "Let there be light", "Y", "the earth was without form", "and void", "Dark",
               "Sea la luz"]
    bodies = [{"model": "lm", "prompt": prompt, "max_tokens": 30, "logprobs": 1,
               **({"temperature": 0} if i % 2 else {"temperature": 0.8, "top_k": 5, "seed": i, "n": 2})}
              for i, prompt in enumerate(prompts)]
    bodies[3]["stop"] = ["e"]
    with TestClient(create_app([ServedModel("lm", bundles["lm"])])) as client:
        alone = [client.post("/v1/completions", json=body).json()["choices"] for body in bodies]
        start = threading.Barrier(len(bodies))

        def send(body: dict) -> list[dict]:
            start.wait()
            return client.post("/v1/completions", json=body).json()["choices"]

        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            together = list(pool.map(send, bodies))
        batched = re.findall(r'attn_batch_size_bucket\{le="1.0",model="lm",route="completions"\} (\S+)\n'
                             r'.*attn_batch_size_count\{model="lm",route="completions"\} (\S+)',
                             client.get("/metrics").text, flags=re.DOTALL)
    ones, steps = map(float, batched[0])
    assert ones < steps  # some decode steps ran several requests' rows at once
    for mine, theirs in zip(together, alone, strict=True):
        assert [c["text"] for c in mine] == [c["text"] for c in theirs]
        assert [c["finish_reason"] for c in mine] == [c["finish_reason"] for c in theirs]
        for a, b in zip(mine, theirs, strict=True):
            assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
            torch.testing.assert_close(torch.tensor(a["logprobs"]["token_logprobs"]),
                                       torch.tensor(b["logprobs"]["token_logprobs"]), atol=ATOL, rtol=ATOL)


def test_streamed_deltas_add_up_to_the_answer_and_end_with_done(client: TestClient) -> None:
    request = {"model": "lm", "prompt": ["In the", "Y dijo"], "temperature": 0.9, "top_k": 20, "seed": 7, "n": 2,
               "max_tokens": 15}
    whole = client.post("/v1/completions", json=request).json()["choices"]
    with client.stream("POST", "/v1/completions", json={**request, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        response.read()
    found = events(response)
    assert found[-1] == "[DONE]"
    chunks = found[:-1]
    for index, choice in enumerate(whole):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["text"] for c in mine) == choice["text"]
        assert [c["finish_reason"] for c in mine[:-1]] == [None] * (len(mine) - 1)
        assert mine[-1]["finish_reason"] == choice["finish_reason"]
    assert len({c["text"] for c in whole}) > 1  # the samples differ, so a mix-up of choices would show


def test_a_seed_makes_samples_repeatable_and_choice_j_uses_seed_plus_j(client: TestClient) -> None:
    request = {"model": "lm", "prompt": "In the", "temperature": 1.0, "max_tokens": 10}
    pair = client.post("/v1/completions", json={**request, "seed": 3, "n": 2}).json()["choices"]
    again = client.post("/v1/completions", json={**request, "seed": 3, "n": 2}).json()["choices"]
    next_seed = client.post("/v1/completions", json={**request, "seed": 4}).json()["choices"]
    assert [c["text"] for c in pair] == [c["text"] for c in again]
    assert pair[1]["text"] == next_seed[0]["text"]


def test_logprobs_are_the_models_log_softmax(client: TestClient, bundles: dict[str, Bundle]) -> None:
    lm = bundles["lm"]
    prompt = "In the"
    choice = client.post("/v1/completions", json={"model": "lm", "prompt": prompt, "temperature": 0, "max_tokens": 6,
                                                  "logprobs": 3}).json()["choices"][0]
    logprobs = choice["logprobs"]
    ids = prompt_ids(lm, prompt)
    new = [lm.tokenizer.token_to_id(token) for token in logprobs["tokens"]]
    with torch.no_grad():  # one uncached forward pass over prompt + completion
        expected = lm.model(torch.tensor([ids + new]))[0, len(ids) - 1 : -1].log_softmax(-1)
    chosen = expected[torch.arange(len(new)), torch.tensor(new)]
    torch.testing.assert_close(torch.tensor(logprobs["token_logprobs"]), chosen, atol=ATOL, rtol=ATOL)
    for step, top in enumerate(logprobs["top_logprobs"]):
        best = expected[step].topk(3)
        assert list(top) == [lm.tokenizer.decode([i]) for i in best.indices.tolist()]
        torch.testing.assert_close(torch.tensor(list(top.values())), best.values, atol=ATOL, rtol=ATOL)
    assert logprobs["text_offset"] == [len(prompt) + i for i in range(len(new))]  # one character per token


def test_a_stop_string_ends_the_text_before_it(client: TestClient) -> None:
    request = {"model": "lm", "prompt": "In the", "temperature": 0, "max_tokens": 30}
    free = client.post("/v1/completions", json=request).json()["choices"][0]["text"]
    assert free.startswith("iiezuvf")  # the seeded tiny model's greedy text: "ez" spans two character tokens
    stopped = client.post("/v1/completions", json={**request, "stop": ["ez"], "logprobs": 0}).json()["choices"][0]
    assert stopped["text"] == "ii"
    assert stopped["finish_reason"] == "stop" and len(stopped["logprobs"]["tokens"]) == 4  # ends at the "z"


def test_a_stop_string_spanning_tokens_without_text_ends_the_decode(client: TestClient) -> None:
    request = {"model": "lm", "prompt": "In the", "temperature": 0, "max_tokens": 30}
    free = client.post("/v1/completions", json={**request, "logprobs": 0}).json()["choices"][0]
    assert free["logprobs"]["tokens"][10:21] == ["f", *[""] * 9, "c"]  # nine special tokens between f and c
    stopped = client.post("/v1/completions", json={**request, "stop": ["fc"], "logprobs": 0}).json()["choices"][0]
    assert stopped["text"] == free["text"][: free["text"].index("fc")]
    assert stopped["finish_reason"] == "stop" and stopped["logprobs"]["tokens"] == free["logprobs"]["tokens"][:21]


def test_streamed_attention_is_each_token_over_what_came_before(client: TestClient, bundles: dict[str, Bundle]) -> None:
    prompt = "In the beginning"
    with client.stream("POST", "/v1/completions", json={"model": "lm", "prompt": prompt, "temperature": 0,
                                                        "max_tokens": 5, "stream": True,
                                                        "attention": {"layer": 1, "head": None}}) as response:
        response.read()
    chunks = events(response)[:-1]
    keys = list(prompt)
    for chunk in chunks:
        seen = chunk["attention"]
        assert seen["keys"] == keys and seen["layer"] == 1 and seen["head"] is None
        assert abs(sum(seen["weights"]) - 1) < ATOL
        keys = keys + [bundles["lm"].tokenizer.id_to_token(bundles["lm"].tokenizer.token_to_id(seen["token"]))]
    # The first token was chosen by the prompt's last position: the last row of the prompt's map.
    view = attention_of(bundles["lm"], prompt, "decoder", 1, None)
    torch.testing.assert_close(torch.tensor(chunks[0]["attention"]["weights"]), view.weights[-1], atol=ATOL, rtol=ATOL)


def test_embeddings_are_the_librarys(client: TestClient, bundles: dict[str, Bundle]) -> None:
    answer = client.post("/v1/embeddings", json={"model": "encoder", "input": TEXTS}).json()
    vectors = torch.tensor([item["embedding"] for item in answer["data"]])
    torch.testing.assert_close(vectors, embed(bundles["encoder"], TEXTS), atol=ATOL, rtol=ATOL)
    assert [item["index"] for item in answer["data"]] == [0, 1, 2, 3]
    tokens = sum(len(bundles["encoder"].tokenizer.encode(t, add_special=True)) for t in TEXTS)
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    one = client.post("/v1/embeddings", json={"model": "encoder", "input": TEXTS[1]}).json()["data"]
    torch.testing.assert_close(torch.tensor(one[0]["embedding"]), vectors[1], atol=ATOL, rtol=ATOL)


def test_classify_gives_the_librarys_labels_and_probabilities(client: TestClient, bundles: dict[str, Bundle]) -> None:
    results = client.post("/v1/classify", json={"model": "classifier", "inputs": TEXTS}).json()["results"]
    for found, expected in zip(results, classify(bundles["classifier"], TEXTS), strict=True):
        assert found["label"] == expected.label
        assert abs(found["score"] - expected.probability) < ATOL
        assert list(found["probabilities"]) == ["art", "law", "food"]
        assert all(abs(found["probabilities"][k] - v) < ATOL for k, v in expected.probabilities.items())


def assert_predictions(results: list[dict], expected: list) -> None:
    assert len(results) == len(expected)
    for found, prediction in zip(results, expected):
        assert found["label"] == prediction.label and abs(found["score"] - prediction.probability) < ATOL
        assert list(found["probabilities"]) == list(prediction.probabilities)
        assert all(abs(found["probabilities"][k] - v) < ATOL for k, v in prediction.probabilities.items())


def test_a_pair_classifier_classifies_each_input_with_its_second_text(client: TestClient,
                                                                      bundles: dict[str, Bundle]) -> None:
    texts, pairs = TEXTS[:3], [TEXTS[1], TEXTS[3], TEXTS[0]]
    results = client.post("/v1/classify", json={"model": "pairs", "inputs": texts, "pairs": pairs}).json()["results"]
    assert_predictions(results, classify(bundles["pairs"], texts, pairs=pairs))
    swapped = client.post("/v1/classify", json={"model": "pairs", "inputs": pairs, "pairs": texts}).json()["results"]
    assert [r["probabilities"] for r in swapped] != [r["probabilities"] for r in results]  # the order of a pair counts
    one = client.post("/v1/classify", json={"model": "pairs", "input": texts[2], "pair": pairs[2]}).json()["results"]
    assert_predictions(one, classify(bundles["pairs"], texts[2:], pairs=pairs[2:]))


def test_pair_requests_batched_together_each_get_their_own_answers(bundles: dict[str, Bundle]) -> None:
    served = ServedModel("pairs", bundles["pairs"])
    texts, pairs = ["In the", "And God said", "Sea la luz"], ["beginning", "Let there be", "y fue"]
    first = classify_job(served, texts[:2], pairs[:2])
    second = classify_job(served, texts[2:], pairs[2:])
    assert first.group == second.group != classify_job(ServedModel("c", bundles["classifier"]), texts).group
    assert list(first.sizes) == [6 + 9 + 3, 12 + 12 + 3]  # [CLS] text [SEP] pair [SEP], a token per character
    mine, theirs = first.run([first, second])
    as_json = [[{"label": p.label, "score": p.probability, "probabilities": p.probabilities} for p in found]
               for found in (mine, theirs)]
    assert_predictions(as_json[0], classify(bundles["pairs"], texts[:2], pairs=pairs[:2]))
    assert_predictions(as_json[1], classify(bundles["pairs"], texts[2:], pairs=pairs[2:]))


def test_attention_of_every_layer_and_head_or_one(client: TestClient, bundles: dict[str, Bundle]) -> None:
    text = "In the beginning"
    every = client.post("/v1/attention", json={"model": "lm", "text": text, "kind": "self"}).json()
    config = bundles["lm"].model_config
    weights = torch.tensor(every["weights"])
    assert weights.shape == (config.decoder_layers, config.heads, len(text), len(text))
    assert (every["layers"], every["heads"], every["queries"], every["keys"]) == (
        config.decoder_layers, config.heads, list(text), list(text))
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=ATOL, rtol=ATOL)
    assert float(weights.triu(1).abs().max()) == 0.0  # causal: no query attends to a later key
    one = client.post("/v1/attention", json={"model": "lm", "text": text, "layer": 1, "head": 2}).json()
    torch.testing.assert_close(torch.tensor(one["weights"]), weights[1:2, 2:3], atol=ATOL, rtol=ATOL)
    mean = attention_of(bundles["lm"], text, "decoder", 1, None).weights
    torch.testing.assert_close(weights[1].mean(0), mean, atol=ATOL, rtol=ATOL)


def test_cross_attention_of_a_translator_is_over_its_translation(client: TestClient,
                                                                 bundles: dict[str, Bundle]) -> None:
    text = TEXTS[0][:10]  # source + 50 tokens stay within the positions: the paper's limit applies
    found = client.post("/v1/attention", json={"model": "translator", "text": text, "kind": "cross",
                                               "layer": -1}).json()
    assert found["target"] == translate(bundles["translator"], [text])[0]  # as /v1/translate by default
    assert found["keys"] == list(text)
    assert len(found["weights"]) == 1 and len(found["weights"][0]) == bundles["translator"].model_config.heads
    assert len(found["weights"][0][0]) == len(found["queries"])
    assert found["target"] is not None and found["kind"] == "cross"


def test_an_input_of_512_tokens_gets_its_attention_map() -> None:
    encoder = tiny_bundles(max_positions=600)["encoder"]
    text = (TEXTS[0] * 12)[:520]
    with TestClient(create_app([ServedModel("long", encoder)])) as client:
        found = client.post("/v1/attention", json={"text": text, "kind": "encoder", "layer": 0, "head": 0}).json()
    weights = torch.tensor(found["weights"])
    assert weights.shape == (1, 1, 522, 522)  # the text in the frame classify reads it in
    framed = [encoder.tokenizer.id_to_token(i) for i in encoder.tokenizer.encode(text, add_special=True)]
    assert found["keys"] == framed and framed[1:-1] == list(text)
    rounding = 522 * 0.5e-6  # the route sends weights to 6 decimals
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, 522), atol=rounding, rtol=0)


def test_the_model_may_be_left_out_when_only_one_is_served(bundles: dict[str, Bundle]) -> None:
    with TestClient(create_app([ServedModel("only", bundles["encoder"])])) as client:
        answer = client.post("/v1/embeddings", json={"input": "Light"})
    assert answer.status_code == 200 and answer.json()["model"] == "only"


def test_health_and_metrics(client: TestClient) -> None:
    assert client.get("/health").json() == {"status": "ok", "models": ["translator", "lm", "classifier", "encoder",
                                                                       "pairs"]}
    client.post("/v1/embeddings", json={"model": "encoder", "input": "Light"})
    client.post("/v1/completions", json={"model": "lm", "prompt": "In", "max_tokens": 2, "stream": True})
    text = client.get("/metrics").text
    assert 'attn_requests_total{model="encoder",route="/v1/embeddings",status="200"}' in text
    for name in ('attn_queue_length{model="lm"}', 'attn_batch_size_count{model="encoder",route="embeddings"}',
                 'attn_request_latency_seconds_count{model="encoder",route="/v1/embeddings"}',
                 'attn_time_to_first_token_seconds_count{model="lm"}'):
        assert name in text, name


def test_every_route_is_in_the_openapi_docs(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for route in ("/v1/completions", "/v1/embeddings", "/v1/translate", "/v1/classify", "/v1/attention",
                  "/v1/models", "/health", "/metrics", "/"):
        assert route in paths, route
    assert client.get("/docs").status_code == 200


def test_the_page_is_served_at_the_root(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == PAGE.read_text(encoding="utf-8")
