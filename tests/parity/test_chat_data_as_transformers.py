"""The assistant's tokens of a conversation, as attn marks them for training, are the tokens and the mask of
transformers' `apply_chat_template(..., return_assistant_tokens_mask=True)` for the same conversation, written by
SmolLM2's ChatML template with its assistant turns inside `{% generation %}` (the marker transformers reads)."""

from __future__ import annotations

import pytest
from chat_models import SMOLLM2_TEMPLATE, TEXTS
from transformers import PreTrainedTokenizerFast

from attn.data.chat_data import Conversation, encode_conversations
from attn.data.chat_template import ChatTemplate
from attn.data.tokenizer_pipelines import bpe_pipeline
from attn.data.tokenizers import Tokenizer

# SMOLLM2_TEMPLATE, each assistant's content and end of turn marked as the assistant's: the same text.
MARKED = SMOLLM2_TEMPLATE.replace(
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}",
    "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' + '\n' }}{% endgeneration %}{% else %}"
    "{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}")

CONVERSATIONS = [
    [{"role": "user", "content": "Translate to Spanish: In the beginning God created the heavens and the earth."},
     {"role": "assistant", "content": "En el principio crió Dios los cielos y la tierra."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello! How are you today?"},
     {"role": "assistant", "content": "Fine, thanks."}, {"role": "user", "content": "Tell me a joke about cats."},
     {"role": "assistant", "content": " Cats and dogs...\n\n"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "two-turns"])
def test_the_assistant_tokens_are_transformers_assistant_mask(messages):
    backend = bpe_pipeline(TEXTS, 400, byte_level=True)
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    reference = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>")
    reference.chat_template = MARKED
    assert MARKED != SMOLLM2_TEMPLATE
    expected = reference.apply_chat_template(messages, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
    ours = encode_conversations("chats.jsonl", [Conversation(messages, 1)], ChatTemplate(SMOLLM2_TEMPLATE),
                                Tokenizer(backend, "byte-bpe"))[0]
    assert ours.ids == expected["input_ids"]
    assert ours.assistant == [bool(flag) for flag in expected["assistant_masks"]]
    assert sum(ours.assistant) > len(messages)  # the answers are there, more than a token each
