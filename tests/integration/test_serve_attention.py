"""What `attn serve` sends of attention, on a tiny Llama-block chat model with grouped-query attention (9 query
heads sharing 3 key/value heads, as SmolLM2-135M's layers): the head layout, maps of one head or the mean in a
bounded size for a 1,200-token text, and the attention of each token of a streamed chat answer, all checked
against `attention_maps` on the same tokens."""

from __future__ import annotations

import base64
import json

import pytest
import torch
import torch.nn.functional as F
from chat_models import TEXTS, tiny_gqa_chat_bundle
from fastapi.testclient import TestClient

from attn.inference.attention_views import token_pieces
from attn.inference.continuation import prompt_ids
from attn.app.serve import ServedModel, create_app
from attn.app.serve.routes import MAX_ATTENTION_WEIGHTS
from attn.artifacts import Bundle
from attn.decoding import GenerationConfig, attention_maps, generate

ATOL = 1e-5
GROUPS = [0, 0, 0, 1, 1, 1, 2, 2, 2]
LONG_TEXT = " ".join(TEXTS * 25)  # 1,200+ tokens of the chat tokenizer


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return tiny_gqa_chat_bundle()


@pytest.fixture(scope="module")
def client(bundle: Bundle):
    with TestClient(create_app([ServedModel("gqa", bundle)])) as client:
        yield client


def maps(answer: dict) -> torch.Tensor:
    """(layers, heads, rows, cols) weights of a /v1/attention answer, in either format."""
    if answer["format"] == "float":
        return torch.tensor(answer["weights"], dtype=torch.float64)
    scales = torch.tensor(answer["scales"], dtype=torch.float64)  # (L, H, R)
    levels = torch.stack([torch.stack([torch.frombuffer(bytearray(base64.b64decode(m)), dtype=torch.int16)
                                       .to(torch.int32) % 65536 for m in layer]) for layer in answer["weights"]])
    return levels.view(*scales.shape, -1).double() / 65535 * scales[..., None]


def test_the_card_and_every_map_give_the_head_layout(client: TestClient) -> None:
    (card,) = client.get("/v1/models").json()["data"]
    assert (card["heads"], card["kv_heads"], card["head_groups"]) == (9, 3, GROUPS)
    answer = client.post("/v1/attention", json={"text": TEXTS[1], "layer": 0, "head": 4}).json()
    assert (answer["heads"], answer["kv_heads"], answer["groups"]) == (9, 3, GROUPS)


def test_the_mean_uint16_and_pooled_maps_are_the_float_maps(client: TestClient, bundle: Bundle) -> None:
    text = TEXTS[2]
    every = client.post("/v1/attention", json={"text": text, "layer": 1}).json()
    weights = maps(every)[0]  # (heads, T, T)
    expected = attention_maps(bundle.model, bundle.tokenizer.encode(text), 1, "self").double()
    torch.testing.assert_close(weights, expected, atol=ATOL, rtol=0)
    for head, chosen in [("mean", weights.mean(0)), (4, weights[4])]:
        for form in ("float", "uint16"):
            answer = client.post("/v1/attention", json={"text": text, "layer": 1, "head": head, "format": form}).json()
            assert answer["format"] == form and (answer["scales"] is None) == (form == "float")
            torch.testing.assert_close(maps(answer)[0, 0], chosen, atol=ATOL, rtol=0)
    pooled = client.post("/v1/attention", json={"text": text, "layer": 1, "pool": 5, "format": "uint16"}).json()
    torch.testing.assert_close(maps(pooled)[0], F.adaptive_max_pool2d(weights, (5, 5)), atol=ATOL, rtol=0)
    assert pooled["queries"] == every["queries"]  # the tokens stay whole: the blocks are the API's to describe


def test_a_1200_token_text_gets_one_bounded_map_and_never_every_map(client: TestClient, bundle: Bundle) -> None:
    tokens = len(bundle.tokenizer.encode(LONG_TEXT))
    assert tokens >= 1200
    refused = client.post("/v1/attention", json={"text": LONG_TEXT})
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert f"2 layers x 9 heads x {tokens} queries x {tokens} keys" in error["message"]
    assert f"more than the {MAX_ATTENTION_WEIGHTS:,} one request may ask for" in error["message"]

    response = client.post("/v1/attention", json={"text": LONG_TEXT, "layer": 1, "head": "mean", "format": "uint16"})
    assert response.status_code == 200
    # two bytes a weight in base64 (8/3 characters), a scale per row and the tokens: about 4 MB, not the dense
    # float JSON of every layer and head (2 x 9 x T x T numbers, some 230 MB)
    assert len(response.content) < 8 / 3 * tokens**2 + 100 * tokens
    weights = maps(response.json())[0, 0]
    assert weights.shape == (tokens, tokens)
    torch.testing.assert_close(weights.sum(-1), torch.ones(tokens, dtype=torch.float64), atol=tokens * ATOL, rtol=0)
    heads = client.post("/v1/attention", json={"text": LONG_TEXT, "layer": 1, "pool": 96, "format": "uint16"})
    assert heads.status_code == 200 and len(heads.content) < 9 * 96 * 96 * 3 + 100 * tokens
    assert maps(heads.json()).shape == (1, 9, 96, 96)


def stream(client: TestClient, route: str, body: dict) -> list[dict]:
    with client.stream("POST", route, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        found = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert found[-1] == "[DONE]"
    return [json.loads(item) for item in found[:-1]]


@pytest.mark.parametrize("head", [4, None], ids=["head-4", "mean"])
def test_each_token_of_a_streamed_chat_answer_carries_the_attention_that_chose_it(client: TestClient,
                                                                                  bundle: Bundle, head) -> None:
    messages = [{"role": "user", "content": TEXTS[3]}]
    body = {"messages": messages, "temperature": 0, "max_completion_tokens": 12}
    chunks = stream(client, "/v1/chat/completions", {**body, "attention": {"layer": 1, "head": head}})
    plain = stream(client, "/v1/chat/completions", body)
    assert [c["choices"] for c in chunks] == [c["choices"] for c in plain]  # following changes nothing of the answer
    assert all("attention" not in c for c in plain)

    prompt = prompt_ids(bundle, bundle.render_chat(messages))
    (answer,) = generate(bundle.model, [prompt], bundle.generation_config(GenerationConfig(max_new_tokens=12), chat=True),
                         bundle.eos_id)
    assert len(chunks) == len(answer)
    ids = prompt + answer
    whole = attention_maps(bundle.model, ids[:-1], 1, "self")  # (heads, T, T)
    chosen = whole.mean(0) if head is None else whole[head]
    for k, chunk in enumerate(chunks):
        seen, position = chunk["attention"], len(prompt) + k  # the keys before the token it chose
        assert (seen["layer"], seen["head"]) == (1, head)
        assert seen["keys"] == token_pieces(bundle, ids[:position])
        assert seen["token"] == bundle.tokenizer.decode([answer[k]])
        torch.testing.assert_close(torch.tensor(seen["weights"]), chosen[position - 1, :position], atol=ATOL, rtol=0)


def test_completions_and_chat_follow_attention_the_same_way(client: TestClient, bundle: Bundle) -> None:
    messages = [{"role": "user", "content": TEXTS[1]}]
    option = {"temperature": 0, "max_tokens": 6, "attention": {"layer": 0, "head": 7}}
    chat = stream(client, "/v1/chat/completions", {"messages": messages, **option})
    completion = stream(client, "/v1/completions", {"prompt": bundle.render_chat(messages), **option})
    assert [c["attention"] for c in chat] == [c["attention"] for c in completion]
