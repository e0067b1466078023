"""A chat template that fails gives a ChatTemplateError naming the cause, never Jinja's or Python's own error:
one that refuses the conversation, does not compile, reads Python internals, builds huge values, recurses or
loops past its time limit."""

from __future__ import annotations

import sys
import time

import pytest

from attn.data import chat_template
from attn.data.chat_template import ChatTemplate
from attn.errors import ChatTemplateError

HELLO = [{"role": "user", "content": "Hello"}]


def failure(source: str, messages: object = HELLO) -> ChatTemplateError:
    with pytest.raises(ChatTemplateError) as found:
        ChatTemplate(source).render(messages)
    return found.value


def test_a_template_that_refuses_the_conversation_blames_the_messages() -> None:
    error = failure("{% if messages[0].role != 'system' %}{{ raise_exception('Start with a system message.') }}"
                    "{% endif %}")
    assert error.field == "messages"
    assert str(error) == "messages: the model's chat template refuses this conversation: Start with a system message."


def test_a_template_that_does_not_compile_names_the_line() -> None:
    with pytest.raises(ChatTemplateError, match=r"does not compile: unexpected '}' \(line 2 of the template\)"):
        ChatTemplate("{% for m in messages %}\n{{ m.content }")


@pytest.mark.parametrize(("source", "cause"), [
    ("{{ messages.__class__.__mro__ }}", "may not read '__class__' of a list"),
    ("{{ messages.append(1) }}", "may not read 'append' of a list"),
    ("{% set ns = namespace(_secret=1) %}", "may not hold '_secret'"),
    ("{{ 'ab' * 1000000 }}", "repeating 2 items 1000000 times makes more than 1000000"),
    ("{{ 10 ** 100000 }}", "has an exponent above 4096"),
])
def test_a_template_that_breaks_the_sandbox_is_stopped(source: str, cause: str) -> None:
    error = failure(source)
    assert "broke a rule of its sandbox" in str(error) and cause in str(error) and error.field is None


def test_a_template_that_loops_too_long_is_stopped_at_its_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 0.2)
    before = sys.gettrace()
    started = time.monotonic()
    error = failure("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}")
    assert time.monotonic() - started < 2
    assert "ran longer than 0.2 s" in str(error)
    assert sys.gettrace() is before  # the trace function that timed the template is gone


@pytest.mark.parametrize(("source", "messages", "cause"), [
    ("{% macro down() %}{{ down() }}{% endmacro %}{{ down() }}", HELLO, "recursed too deeply"),
    ("{{ messages[0].content + 1 }}", HELLO, "failed on this conversation (TypeError: can only concatenate"),
    ("{{ messages[0].content }}", "Hello", "messages: must be a list of messages, got str"),
    ("{{ messages[0].content }}", ["Hello"], "messages: message 0 is a str; give each message as an object"),
    ("{{ messages[0].content }}", [{"role": "user", "content": object()}], "message 0 holds a object"),
])
def test_other_failures_say_what_failed(source: str, messages: object, cause: str) -> None:
    assert cause in str(failure(source, messages))


def test_messages_reach_the_template_as_fresh_plain_data() -> None:
    messages = [{"role": "user", "content": "Hi", "name": None, "parts": ("a", {"b": 1})}]
    rendered = ChatTemplate("{{ messages | tojson }}").render(messages)
    assert rendered == '[{"role": "user", "content": "Hi", "parts": ["a", {"b": 1}]}]'
    assert messages[0]["name"] is None  # the caller's messages are left as they were
