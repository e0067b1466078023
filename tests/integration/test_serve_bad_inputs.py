"""The bad-request catalogue of `attn serve` (the server's part of tests/integration/test_bad_inputs.py).

Each case sends one broken request to a server of five tiny models and checks what the client
gets: the case's status, the contract's JSON error (`{"error": {message, type, param, code}}`,
never a traceback, never FastAPI's `{"detail": ...}`), the field at fault in `param`, and a
message that names the problem.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import torch
from chat_models import tiny_chat_bundle
from fastapi.testclient import TestClient
from serve_models import tiny_bundles

from attn.app.serve import ServedModel, ServeOptions, create_app

LONG = "x" * 100  # more tokens than the tiny models' 64 positions
MAX_BODY = 4096
CAP, MAX_N = 500, 8  # the server's --max-tokens-cap and --max-n: above the models' positions, below the schema's n
TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
         405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
         429: "rate_limit_error", 500: "server_error", 503: "server_error", 504: "server_error"}


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad request.

    Attributes:
        id: the case's name.
        route: the path it is sent to (POST unless `method` says otherwise).
        body: the JSON body, or raw bytes sent as they are.
        status: the HTTP status the server answers with.
        param: the request field the error names (None: none).
        expect: a part of the message.
    """

    id: str
    route: str
    body: Any
    status: int
    param: str | None
    expect: str
    method: str = "POST"


LM, TR, CHAT = {"model": "lm"}, {"model": "translator"}, {"model": "chat"}
CHAT_ROUTE, HI = "/v1/chat/completions", [{"role": "user", "content": "Hi"}]
# A template that refuses a conversation whose roles do not alternate, as Llama 2's and Mistral's do.
STRICT = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("
          "'Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{{ m.content }}"
          "{% endfor %}")
CASES = [
    Case("malformed-json", "/v1/completions", b'{"model": "lm", "prompt": ', 422, None, "the body is not valid JSON"),
    Case("body-not-an-object", "/v1/completions", b"[1, 2]", 422, None, "Input should be a valid dictionary"),
    Case("wrong-type", "/v1/completions", {**LM, "prompt": "x", "max_tokens": "five"}, 422, "max_tokens",
         "max_tokens: Input should be a valid integer"),
    Case("number-as-string", "/v1/completions", {**LM, "prompt": "x", "temperature": "0.5"}, 422, "temperature",
         "valid number"),
    Case("prompt-missing", "/v1/completions", LM, 422, "prompt", "prompt: Field required"),
    Case("prompt-wrong-type", "/v1/completions", {**LM, "prompt": 7}, 422, "prompt", "prompt: Input should be"),
    Case("prompt-list-empty", "/v1/completions", {**LM, "prompt": []}, 422, "prompt", "non-empty list of prompts"),
    Case("prompt-longer-than-positions", "/v1/completions", {**LM, "prompt": LONG}, 422, "prompt",
         "max_positions=64"),
    Case("prompt-and-max-tokens-beyond-positions", "/v1/completions", {**LM, "prompt": "x" * 60, "max_tokens": 10},
         422, "prompt", "max_positions=64"),
    Case("temperature-negative", "/v1/completions", {**LM, "prompt": "x", "temperature": -1}, 422, "temperature",
         "greater than or equal to 0"),
    Case("top-p-zero", "/v1/completions", {**LM, "prompt": "x", "top_p": 0}, 422, "top_p", "greater than 0"),
    Case("logprobs-above-five", "/v1/completions", {**LM, "prompt": "x", "logprobs": 6}, 422, "logprobs",
         "less than or equal to 5"),
    Case("n-greedy", "/v1/completions", {**LM, "prompt": "x", "temperature": 0, "n": 2}, 422, "n",
         "greedy decoding and beam search give one continuation"),
    Case("seed-beyond-64-bits", "/v1/completions", {**LM, "prompt": "x", "seed": 2**76}, 422, "seed",
         "less than or equal to 9223372036854775807"),
    Case("seed-negative", "/v1/completions", {**LM, "prompt": "x", "seed": -1}, 422, "seed",
         "greater than or equal to 0"),
    Case("stop-empty", "/v1/completions", {**LM, "prompt": "x", "stop": [""]}, 422, "stop", "must not be empty"),
    Case("attention-without-stream", "/v1/completions", {**LM, "prompt": "x", "attention": {"layer": 0}}, 422,
         "attention", "set stream: true"),
    Case("attention-layer-missing", "/v1/completions", {**LM, "prompt": "x", "stream": True,
                                                        "attention": {"layer": 9}}, 422, "attention.layer",
         "layer 9 does not exist"),
    Case("unknown-model", "/v1/completions", {"model": "gpt-5", "prompt": "x"}, 404, "model",
         "'gpt-5' is not served here; the served models are: translator, lm, classifier, encoder, pairs"),
    Case("model-left-out-of-several", "/v1/completions", {"prompt": "x"}, 422, "model", "serves several models"),
    Case("completions-of-a-translator", "/v1/completions", {**TR, "prompt": "x"}, 400, "model",
         "'translator' (task translation, encoder-decoder) cannot serve /v1/completions"),
    Case("translate-with-a-language-model", "/v1/translate", {**LM, "input": "x"}, 400, "model", "task lm"),
    Case("embeddings-of-a-language-model", "/v1/embeddings", {**LM, "input": "x"}, 400, "model",
         "needs an encoder-only model"),
    Case("classify-with-an-untrained-encoder", "/v1/classify", {"model": "encoder", "input": "x"}, 400, "model",
         "needs a trained classifier"),
    Case("classify-pairs-with-a-single-text-classifier", "/v1/classify",
         {"model": "classifier", "inputs": ["a"], "pairs": ["b"]}, 400, "pairs",
         "model 'classifier' classifies single texts (text); leave out pairs and pair"),
    Case("classify-pair-with-a-single-text-classifier", "/v1/classify", {"model": "classifier", "input": "a",
                                                                         "pair": "b"}, 400, "pairs",
         "choose a sentence-pair classifier"),
    Case("pair-classifier-without-pairs", "/v1/classify", {"model": "pairs", "inputs": ["a"]}, 400, "pairs",
         "model 'pairs' classifies sentence pairs (premise, hypothesis); send pairs: the second text of each input"),
    Case("pairs-fewer-than-inputs", "/v1/classify", {"model": "pairs", "inputs": ["a", "b"], "pairs": ["c"]}, 422,
         "pairs", "2 inputs but 1 second texts; give one second text per input"),
    Case("pair-with-several-inputs", "/v1/classify", {"model": "pairs", "inputs": ["a", "b"], "pair": "c"}, 422,
         "pair", "2 inputs but 1 second texts"),
    Case("pairs-blank", "/v1/classify", {"model": "pairs", "inputs": ["a"], "pairs": [" "]}, 422, "pairs",
         "every second text must hold a non-blank character"),
    Case("pairs-wrong-type", "/v1/classify", {"model": "pairs", "inputs": ["a"], "pairs": "b"}, 422, "pairs",
         "pairs: Input should be a valid list"),
    Case("translate-inputs-empty", "/v1/translate", {**TR, "inputs": []}, 422, "inputs", "non-empty list of texts"),
    Case("translate-input-blank", "/v1/translate", {**TR, "inputs": ["ok", "  "]}, 422, "inputs", "non-blank"),
    Case("translate-no-input", "/v1/translate", TR, 422, "inputs", "give a non-empty list"),
    Case("translate-longer-than-positions", "/v1/translate", {**TR, "input": LONG}, 422, "inputs",
         "a source of 100 tokens exceeds the model's max_positions=64"),
    Case("n-best-above-beam-size", "/v1/translate", {**TR, "input": "x", "beam_size": 2, "n_best": 3}, 422, "n_best",
         "n_best: must be in [1, beam_size=2], got 3"),
    Case("max-tokens-beyond-positions", "/v1/translate", {**TR, "input": "x", "max_tokens": 100}, 422, "max_tokens",
         "max_tokens: 100 is more than the model's max_positions=64"),
    Case("embeddings-input-empty", "/v1/embeddings", {"model": "encoder", "input": []}, 422, "input",
         "non-blank text"),
    Case("embeddings-encoding-unknown", "/v1/embeddings", {"model": "encoder", "input": "x",
                                                           "encoding_format": "binary"}, 422, "encoding_format",
         "Input should be 'float' or 'base64'"),
    Case("attention-text-empty", "/v1/attention", {**LM, "text": ""}, 422, "text", "at least 1 character"),
    Case("attention-kind-unknown", "/v1/attention", {**LM, "text": "x", "kind": "diagonal"}, 422, "kind",
         "Input should be 'encoder', 'decoder', 'cross' or 'self'"),
    Case("attention-kind-not-in-model", "/v1/attention", {**LM, "text": "x", "kind": "cross"}, 422, "kind",
         "has no 'cross' attention; choose one of decoder, self"),
    Case("attention-self-of-a-translator", "/v1/attention", {**TR, "text": "x", "kind": "self"}, 422, "kind",
         "has no 'self' attention; choose one of encoder, decoder, cross"),
    Case("attention-layer-out-of-range", "/v1/attention", {**LM, "text": "x", "layer": 7}, 422, "layer",
         "layer 7 does not exist"),
    Case("attention-head-out-of-range", "/v1/attention", {**LM, "text": "x", "head": 9}, 422, "head",
         "head 9 does not exist; 'lm' has heads 0..3"),
    Case("attention-longer-than-positions", "/v1/attention", {**LM, "text": LONG}, 422, "text",
         "100 positions exceed the model's max_positions=64"),
    Case("attention-head-neither-a-head-nor-the-mean", "/v1/attention", {**LM, "text": "x", "head": "max"}, 422,
         "head", "'max' is not a head: give a head's number (0 or more), \"mean\" for the mean over heads"),
    Case("attention-head-negative", "/v1/attention", {**LM, "text": "x", "head": -1}, 422, "head",
         "-1 is not a head"),
    Case("attention-pool-zero", "/v1/attention", {**LM, "text": "x", "pool": 0}, 422, "pool",
         "greater than or equal to 1"),
    Case("attention-format-unknown", "/v1/attention", {**LM, "text": "x", "format": "png"}, 422, "format",
         "Input should be 'float' or 'uint16'"),
    Case("chat-attention-without-stream", CHAT_ROUTE, {**CHAT, "messages": HI, "attention": {"layer": 0}}, 422,
         "attention", "set stream: true"),
    Case("chat-attention-head-missing", CHAT_ROUTE, {**CHAT, "messages": HI, "stream": True,
                                                     "attention": {"layer": 0, "head": 4}}, 422, "attention.head",
         "head 4 does not exist; 'chat' has heads 0..3"),
    Case("body-too-large", "/v1/embeddings", {"model": "encoder", "input": "x" * MAX_BODY}, 413, None,
         f"more than the server's limit of {MAX_BODY}"),
    Case("unknown-route", "/v1/edits", {**LM, "prompt": "x"}, 404, None, "no route /v1/edits"),
    Case("wrong-method", "/v1/models", {}, 405, None, "POST is not allowed on /v1/models"),
    Case("chat-messages-missing", CHAT_ROUTE, CHAT, 422, "messages", "messages: Field required"),
    Case("chat-messages-empty", CHAT_ROUTE, {**CHAT, "messages": []}, 422, "messages", "at least 1 item"),
    Case("chat-message-not-an-object", CHAT_ROUTE, {**CHAT, "messages": ["Hi"]}, 422, "messages.0",
         "messages.0: Input should be a valid dictionary"),
    Case("chat-role-unknown", CHAT_ROUTE, {**CHAT, "messages": [{"role": "robot", "content": "Hi"}]}, 422,
         "messages.0.role", "Input should be 'system', 'developer', 'user', 'assistant' or 'tool'"),
    Case("chat-content-missing", CHAT_ROUTE, {**CHAT, "messages": [{"role": "user"}]}, 422, "messages.0.content",
         "messages.0.content: Field required"),
    Case("chat-content-image", CHAT_ROUTE, {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 422, "messages.0.content",
         "this server reads text only: give each part as {\"type\": \"text\", \"text\": ...}, not a 'image_url' part"),
    Case("chat-tools", CHAT_ROUTE, {**CHAT, "messages": HI, "tools": [{"type": "function"}]}, 422,
         "tools.0.function", "tools.0.function: Field required"),
    Case("chat-top-logprobs-alone", CHAT_ROUTE, {**CHAT, "messages": HI, "top_logprobs": 2}, 422, "top_logprobs",
         "needs logprobs: true"),
    Case("chat-top-logprobs-above-20", CHAT_ROUTE, {**CHAT, "messages": HI, "logprobs": True, "top_logprobs": 21},
         422, "top_logprobs", "less than or equal to 20"),
    Case("chat-stream-options-alone", CHAT_ROUTE, {**CHAT, "messages": HI, "stream_options": {"include_usage": True}},
         422, "stream_options", "applies to streamed answers only"),
    Case("chat-n-greedy", CHAT_ROUTE, {**CHAT, "messages": HI, "n": 2, "temperature": 0}, 422, "n",
         "greedy decoding and beam search give one continuation per prompt"),
    Case("chat-stop-empty", CHAT_ROUTE, {**CHAT, "messages": HI, "stop": [""]}, 422, "stop", "must not be empty"),
    Case("chat-model-without-template", CHAT_ROUTE, {**LM, "messages": HI}, 400, "model",
         "cannot serve /v1/chat/completions, which needs a decoder-only language model with a chat template"),
    Case("chat-translator", CHAT_ROUTE, {**TR, "messages": HI}, 400, "model", "which needs a decoder-only language"),
    Case("chat-template-refuses", CHAT_ROUTE, {"model": "strict", "messages": [{"role": "assistant", "content": "x"}]},
         422, "messages", "messages: the model's chat template refuses this conversation: Conversation roles must "
         "alternate user/assistant/user/assistant/..."),
    Case("chat-longer-than-positions", CHAT_ROUTE, {**CHAT, "messages": [{"role": "user", "content": LONG * 2}]}, 422,
         "messages", "more than the model's max_positions=64; shorten the prompt"),
    # Text that is not valid Unicode: JSON allows an unpaired surrogate escape such as \ud800.
    Case("prompt-lone-surrogate", "/v1/completions", b'{"model": "lm", "prompt": "\\ud800 x"}', 422, "prompt",
         "prompt: is not valid Unicode: a lone surrogate U+D800 at character 0"),
    Case("prompts-lone-surrogate", "/v1/completions", b'{"model": "lm", "prompt": ["ok", "a\\udce9"]}', 422,
         "prompt.1", "a lone surrogate U+DCE9 (the byte 0xe9 of text that is not UTF-8) at character 1"),
    Case("stop-lone-surrogate", "/v1/completions", b'{"model": "lm", "prompt": "x", "stop": ["\\udfff"]}', 422,
         "stop.0", "is not valid Unicode"),
    Case("chat-content-lone-surrogate", CHAT_ROUTE,
         b'{"model": "chat", "messages": [{"role": "user", "content": "Hi \\ud83d"}]}', 422, "messages.0.content",
         "a lone surrogate U+D83D at character 3"),
    Case("chat-text-part-lone-surrogate", CHAT_ROUTE, b'{"model": "chat", "messages": [{"role": "user", "content": '
         b'[{"type": "text", "text": "\\ud800"}]}]}', 422, "messages.0.content.0.text", "is not valid Unicode"),
    Case("translate-lone-surrogate", "/v1/translate", b'{"model": "translator", "inputs": ["ok", "\\ud800"]}', 422,
         "inputs.1", "is not valid Unicode"),
    Case("embeddings-lone-surrogate", "/v1/embeddings", b'{"model": "encoder", "input": "\\ud800"}', 422, "input",
         "is not valid Unicode"),
    Case("classify-pair-lone-surrogate", "/v1/classify", b'{"model": "pairs", "inputs": ["a"], "pairs": ["\\ud800"]}',
         422, "pairs.0", "is not valid Unicode"),
    Case("attention-text-lone-surrogate", "/v1/attention", b'{"model": "lm", "text": "\\ud800"}', 422, "text",
         "is not valid Unicode"),
    Case("model-name-lone-surrogate", "/v1/completions", b'{"model": "\\ud800", "prompt": "x"}', 422, "model",
         "is not valid Unicode"),
    Case("body-not-utf8", "/v1/completions", b'{"model": "lm", "prompt": "caf\xe9"}', 400, None,
         "the body is not valid UTF-8 (byte 0xe9 at offset 30); send JSON encoded as UTF-8"),
    Case("chat-max-tokens-beyond-positions", CHAT_ROUTE, {**CHAT, "messages": HI, "max_completion_tokens": 60}, 422,
         "messages", "but max_tokens=60; set max_tokens <= "),
    Case("max-tokens-over-cap", "/v1/completions", {**LM, "prompt": "x", "max_tokens": CAP + 1}, 422, "max_tokens",
         f"max_tokens: {CAP + 1} is more than this server's cap of {CAP} new tokens (--max-tokens-cap)"),
    Case("chat-max-completion-tokens-over-cap", CHAT_ROUTE, {**CHAT, "messages": HI, "max_completion_tokens": CAP + 1},
         422, "max_completion_tokens", f"cap of {CAP} new tokens"),
    Case("chat-max-tokens-over-cap", CHAT_ROUTE, {**CHAT, "messages": HI, "max_tokens": CAP + 1}, 422, "max_tokens",
         f"cap of {CAP} new tokens"),
    Case("translate-max-tokens-over-cap", "/v1/translate", {**TR, "input": "x", "max_tokens": CAP + 1}, 422,
         "max_tokens", f"cap of {CAP} new tokens"),
    Case("n-over-cap", "/v1/completions", {**LM, "prompt": "x", "n": MAX_N + 1}, 422, "n",
         f"n: {MAX_N + 1} choices are more than this server's cap of {MAX_N} (--max-n)"),
    # Nothing is ignored: a field the server does not read is a 422 naming it, nested ones included.
    Case("unknown-field", "/v1/completions", {**LM, "prompt": "x", "frobnicate": 1}, 422, "frobnicate",
         "frobnicate: is not supported by this server; leave it out"),
    Case("chat-audio", CHAT_ROUTE, {**CHAT, "messages": HI, "audio": {"voice": "alloy", "format": "mp3"}}, 422,
         "audio", "audio: is not supported by this server"),
    Case("chat-prediction", CHAT_ROUTE, {**CHAT, "messages": HI, "prediction": {"type": "content", "content": "x"}},
         422, "prediction", "is not supported by this server"),
    Case("chat-functions", CHAT_ROUTE, {**CHAT, "messages": HI, "functions": [{"name": "f"}]}, 422, "functions",
         "is not supported by this server"),
    # A format the server follows, but whose schema or grammar is broken, or a model whose tokenizer llguidance
    # cannot read (the tiny "lm" has a character tokenizer).
    Case("chat-response-format-bad-schema", CHAT_ROUTE,
         {**CHAT, "messages": HI, "response_format": {"type": "json_schema", "json_schema": {
             "name": "answer", "schema": {"type": "bogus"}}}},
         400, "response_format.json_schema.schema", "llguidance rejects the json_schema grammar: Invalid type: bogus"),
    Case("chat-response-format-bad-regex", CHAT_ROUTE,
         {**CHAT, "messages": HI, "response_format": {"type": "regex", "regex": "[0-9"}},
         400, "response_format.regex", "unclosed character class"),
    Case("completion-response-format-no-regex", "/v1/completions",
         {**LM, "prompt": "x", "response_format": {"type": "regex"}},
         422, "response_format.regex", "type 'regex' needs its regex"),
    Case("completion-response-format-char-tokenizer", "/v1/completions",
         {**LM, "prompt": "x", "response_format": {"type": "json_object"}},
         422, "response_format", "llguidance cannot read this chars tokenizer"),
    Case("chat-tool-choice-required", CHAT_ROUTE, {**CHAT, "messages": HI, "tool_choice": "required"}, 422,
         "tool_choice", "\"required\" needs tools: send the functions in tools"),
    Case("chat-modalities-audio", CHAT_ROUTE, {**CHAT, "messages": HI, "modalities": ["audio"]}, 422, "modalities",
         "it answers in text only"),
    Case("chat-message-unknown-field", CHAT_ROUTE, {**CHAT, "messages": [{**HI[0], "tool_id": "c1"}]}, 422,
         "messages.0.tool_id", "messages.0.tool_id: is not supported by this server"),
    Case("chat-user-message-tool-call-id", CHAT_ROUTE, {**CHAT, "messages": [{**HI[0], "tool_call_id": "c1"}]}, 422,
         "messages.0.tool_call_id", "a tool message gives the id of the call it answers, and only a tool message"),
    Case("chat-message-tool-calls", CHAT_ROUTE, {**CHAT, "messages": [*HI, {"role": "assistant", "content": "x",
         "tool_calls": [{"id": "c1", "type": "function"}]}]}, 422, "messages.1.tool_calls.0.function",
         "messages.1.tool_calls.0.function: Field required"),
    Case("chat-text-part-unknown-field", CHAT_ROUTE, {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hi", "cache_control": {}}]}]}, 422, "messages.0.content.0.cache_control",
         "is not supported by this server"),
    Case("chat-stream-options-unknown-field", CHAT_ROUTE, {**CHAT, "messages": HI, "stream": True,
         "stream_options": {"include_usage": True, "chunk_size": 3}}, 422, "stream_options.chunk_size",
         "is not supported by this server"),
    Case("completions-echo", "/v1/completions", {**LM, "prompt": "x", "echo": True}, 422, "echo",
         "echo: True is not supported by this server; leave echo out or false"),
    Case("completions-suffix", "/v1/completions", {**LM, "prompt": "x", "suffix": "y"}, 422, "suffix",
         "the server continues prompts, it does not insert text"),
    Case("completions-best-of-above-n", "/v1/completions", {**LM, "prompt": "x", "best_of": 2}, 422, "best_of",
         "leave best_of out or equal to n"),
    Case("completions-stream-options-alone", "/v1/completions", {**LM, "prompt": "x", "stream_options": {}}, 422,
         "stream_options", "applies to streamed answers only"),
    Case("embeddings-dimensions", "/v1/embeddings", {"model": "encoder", "input": "x", "dimensions": 8}, 422,
         "dimensions", "is not supported by this server"),
    Case("translate-unknown-field", "/v1/translate", {**TR, "input": "x", "temperature": 0.5}, 422, "temperature",
         "is not supported by this server"),
    # The sampling settings, each out of its range.
    Case("min-p-above-one", "/v1/completions", {**LM, "prompt": "x", "min_p": 1.5}, 422, "min_p",
         "less than or equal to 1"),
    Case("top-k-below-minus-one", "/v1/completions", {**LM, "prompt": "x", "top_k": -2}, 422, "top_k",
         "greater than or equal to -1"),
    Case("repetition-penalty-zero", "/v1/completions", {**LM, "prompt": "x", "repetition_penalty": 0}, 422,
         "repetition_penalty", "greater than 0"),
    Case("frequency-penalty-beyond-two", "/v1/completions", {**LM, "prompt": "x", "frequency_penalty": 2.5}, 422,
         "frequency_penalty", "less than or equal to 2"),
    Case("presence-penalty-below-minus-two", CHAT_ROUTE, {**CHAT, "messages": HI, "presence_penalty": -3}, 422,
         "presence_penalty", "greater than or equal to -2"),
    Case("logit-bias-key-not-an-id", "/v1/completions", {**LM, "prompt": "x", "logit_bias": {"cat": 5}}, 422,
         "logit_bias", "logit_bias: 'cat' is not a token id; give each key as a token id in a string"),
    Case("logit-bias-beyond-100", CHAT_ROUTE, {**CHAT, "messages": HI, "logit_bias": {"5": 101}}, 422, "logit_bias",
         "logit_bias: the bias of token 5 must be a number in [-100, 100], got 101.0"),
    Case("logit-bias-outside-vocabulary", "/v1/completions", {**LM, "prompt": "x", "logit_bias": {"5000": -100}},
         422, "logit_bias", "logit_bias: token id 5000 is outside the model's vocabulary of"),
    Case("chat-logit-bias-outside-vocabulary", CHAT_ROUTE, {**CHAT, "messages": HI, "logit_bias": {"5000": 1}}, 422,
         "logit_bias", "logit_bias: token id 5000 is outside the model's vocabulary of"),
    Case("logit-bias-not-a-number", "/v1/completions", {**LM, "prompt": "x", "logit_bias": {"5": "big"}}, 422,
         "logit_bias.5", "Input should be a valid number"),
]
# Extremes that the generated requests of test_serve_schema.py send, which sampling must take in its stride.
EXTREMES = [("top-p-below-float32", "/v1/completions", {**LM, "prompt": "x", "top_p": 5e-324, "max_tokens": 3}),
         ("temperature-below-float32", "/v1/completions", {**LM, "prompt": "x", "temperature": 5e-324,
                                                            "max_tokens": 3}),
         ("both-below-float32-with-top-k", "/v1/completions", {**LM, "prompt": "", "temperature": 5e-324,
                                                                "top_p": 5e-324, "top_k": 3, "n": 2}),
         ("chat-temperature-below-float32", CHAT_ROUTE, {**CHAT, "messages": HI, "temperature": 1e-40,
                                                         "max_tokens": 3, "stream": True}),
         ("repetition-penalty-below-float32", "/v1/completions", {**LM, "prompt": "xx", "repetition_penalty": 5e-324,
                                                                   "logprobs": 2, "max_tokens": 3}),
         ("every-setting-at-its-edge", CHAT_ROUTE, {**CHAT, "messages": HI, "temperature": 5e-324, "min_p": 1,
                                                    "top_k": -1, "frequency_penalty": -2, "presence_penalty": 2,
                                                    "logit_bias": {"5": -100, "6": 100}, "max_tokens": 3})]


@pytest.fixture(scope="module")
def client():
    chat = tiny_chat_bundle(max_positions=64)
    models = [ServedModel(name, bundle) for name, bundle in tiny_bundles().items()]
    models += [ServedModel("chat", chat), ServedModel("strict", dataclasses.replace(chat, chat_template=STRICT))]
    with TestClient(create_app(models, ServeOptions(max_body_bytes=MAX_BODY, max_tokens_cap=CAP,
                                                    max_n=MAX_N))) as client:
        yield client


def check_error(response, status: int, param: str | None, expect: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"], body
    error = body["error"]
    assert error == {"message": error["message"], "type": TYPES[status], "param": param, "code": status}
    assert expect in error["message"], error["message"]
    assert "Traceback" not in response.text


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_request_gets_the_contracts_json_error(case: Case, client: TestClient) -> None:
    send = {"content": case.body} if isinstance(case.body, bytes) else {"json": case.body}
    response = client.request(case.method, case.route, headers={"content-type": "application/json"}, **send)
    check_error(response, case.status, case.param, case.expect)


def test_case_ids_are_unique() -> None:
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("route,body", [case[1:] for case in EXTREMES], ids=[case[0] for case in EXTREMES])
def test_extreme_sampling_values_are_answered(route: str, body: dict, client: TestClient) -> None:
    response = client.post(route, json=body)
    assert response.status_code == 200, response.text
    assert '"error"' not in response.text


def test_a_completion_for_a_stopped_model_is_a_503_not_a_500() -> None:
    """The engine refuses a stopped model's rows before any token is awaited; the route answers as every route."""
    models = [ServedModel("lm", tiny_bundles()["lm"])]
    with TestClient(create_app(models), raise_server_exceptions=False) as client:
        client.portal.call(client.app.state.serve.engines["lm"].drain)
        response = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    check_error(response, 503, None, "model 'lm' is shutting down and takes no new requests")


def test_a_body_without_content_length_is_limited_while_it_is_read(client: TestClient) -> None:
    def pieces():
        for _ in range(MAX_BODY // 100 + 2):
            yield b" " * 100  # JSON whitespace: valid until the limit cuts it

    response = client.post("/v1/embeddings", content=pieces(), headers={"content-type": "application/json"})
    assert "content-length" not in {k.lower() for k in response.request.headers}
    check_error(response, 413, None, f"more than the server's limit of {MAX_BODY}")


def test_an_internal_error_is_a_short_500(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("tensor trouble at line 42")

    monkeypatch.setattr("attn.app.serve.work.embed", broken)
    models = [ServedModel("encoder", tiny_bundles()["encoder"])]
    with TestClient(create_app(models), raise_server_exceptions=False) as client:
        response = client.post("/v1/embeddings", json={"input": "x"})
    check_error(response, 500, None, "internal error (RuntimeError); the server log has the details")
    assert "line 42" not in response.text


def test_a_full_queue_answers_429_with_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(bundle, texts):  # holds the model's only queue place until released
        started.set()
        release.wait(30)
        return torch.zeros(len(texts), 4)

    monkeypatch.setattr("attn.app.serve.work.embed", slow)
    models = [ServedModel("encoder", tiny_bundles()["encoder"])]
    with TestClient(create_app(models, ServeOptions(max_queue=1))) as client:
        first = threading.Thread(target=client.post, args=("/v1/embeddings",), kwargs={"json": {"input": "a"}})
        first.start()
        assert started.wait(30)
        response = client.post("/v1/embeddings", json={"input": "b"})
        release.set()
        first.join(30)
    check_error(response, 429, None, "the model's queue is full; retry after")
    assert int(response.headers["retry-after"]) >= 1
