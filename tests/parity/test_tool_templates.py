"""A conversation with tools renders as transformers' `apply_chat_template(messages, tools=...)` renders it, on
templates of Qwen2.5's, Llama 3.1's and Mistral's shape: OpenAI's messages (an assistant's `tool_calls` with their
arguments as a JSON string, `tool` messages with their `tool_call_id`) give the prompt that transformers gives for
the same conversation written as its documentation writes it (arguments as an object), and each template's calls
are read in the format its text names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_chat_templates_as_transformers import LLAMA31, huggingface_tokenizer

from attn.data.chat_template import ChatTemplate
from attn.inference.tool_calls import HERMES, LLAMA3, MISTRAL, tool_format
from attn.inference.tools import render

TEMPLATES = Path(__file__).parent / "chat_templates"
QWEN25 = (TEMPLATES / "qwen2.5-shape.jinja").read_text(encoding="utf-8")
MISTRAL_SHAPE = (TEMPLATES / "mistral-shape.jinja").read_text(encoding="utf-8")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "e.g. Zürich"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time <now> & here.",
                                         "parameters": {"type": "object", "properties": {}}}}
ARGUMENTS = {"city": "Zürich", "unit": "celsius"}


def conversation(call_id: str, arguments: object) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "21 degrees"},
            {"role": "assistant", "content": "It is 21 degrees."}, {"role": "user", "content": "And the time?"}]


@pytest.mark.parametrize(("template", "bos", "eos", "specials", "form", "call_id"), [
    (QWEN25, "<|endoftext|>", "<|im_end|>", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], HERMES, "call_abc"),
    (LLAMA31, "<|begin_of_text|>", "<|eot_id|>", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                                  "<|eot_id|>", "<|python_tag|>"], LLAMA3, "call_abc"),
    (MISTRAL_SHAPE, "<s>", "</s>", ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]"], MISTRAL, "a1B2c3D4e"),
], ids=["qwen2.5", "llama-3.1", "mistral"])
def test_tools_render_as_transformers_renders_them(template: str, bos: str, eos: str, specials: list[str], form,
                                                   call_id: str) -> None:
    reference = huggingface_tokenizer(template, bos, eos, specials)
    ours = ChatTemplate(template, {"bos_token": bos, "eos_token": eos})
    sent = conversation(call_id, json.dumps(ARGUMENTS, ensure_ascii=False))
    expected = reference.apply_chat_template(conversation(call_id, ARGUMENTS), tools=[WEATHER, TIME], tokenize=False,
                                             add_generation_prompt=True)
    assert render(ours, sent, [WEATHER, TIME]) == expected
    assert ours.render(conversation(call_id, ARGUMENTS), True, [WEATHER, TIME]) == expected
    assert tool_format(template) == form


@pytest.mark.parametrize("template", [QWEN25, LLAMA31, MISTRAL_SHAPE], ids=["qwen2.5", "llama-3.1", "mistral"])
def test_tool_choice_none_renders_no_tools(template: str) -> None:
    reference = huggingface_tokenizer(template, "<s>", "</s>", ["<s>", "</s>"])
    messages = [{"role": "user", "content": "Hi"}]
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render(ChatTemplate(template, {"bos_token": "<s>", "eos_token": "</s>"}), messages, [WEATHER], "none") == \
        expected
