"""Chat templates: a conversation rendered into a model's prompt by the Jinja template the model ships with.

`ChatTemplate(source, special_tokens).render(messages, add_generation_prompt)` gives the text of transformers'
`tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` for the same template and
special tokens (tests/parity/test_chat_templates_as_transformers.py compares them):

- Jinja as transformers sets it up: `trim_blocks`, `lstrip_blocks`, the `loopcontrols` extension;
- the helpers templates call: `raise_exception(message)`, `strftime_now(format)` (local time) and a `tojson` filter
  that writes JSON as `json.dumps` does (non-ASCII and `<>&'` kept) and takes `indent`, `separators`, `sort_keys`;
- the variables: `messages` (plain dicts and lists; keys whose value is None left out), `add_generation_prompt`,
  `tools` (the tool schemas given, as `apply_chat_template(tools=...)` passes them, else None), `documents` (always
  None) and the special tokens given (`bos_token`, `eos_token`, ...).

A template is code that comes with a model, so it runs in Jinja's immutable sandbox: reading a Python internal (a
name that starts with "_") is an error at once, the messages cannot be changed, a `namespace` holds no "_" names,
and `*` or `**` may not build a string, list or number beyond `MAX_ITEMS` items or an exponent of `MAX_EXPONENT`.
No text may grow past `MAX_CHARS` characters: not the prompt, a value stored on a namespace or passed to a call,
nor what `+`, `%`, a string method or a filter that pads, indents, joins, replaces or formats would build (bounded
from its inputs before it runs), so a template cannot fill the memory within its time. `lipsum` is left out (it
writes as many paragraphs as asked). Rendering stops after `RENDER_SECONDS` (a loop of loops that would not end
in any useful time); only the template's own lines are timed, through a trace function, so a debugger or coverage
tool does not see them. Every failure is a `ChatTemplateError` naming the cause.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from attn.data.tokenizers import Tokenizer
from attn.core.errors import ChatTemplateError

RENDER_SECONDS = 2.0
MAX_ITEMS = 1_000_000
MAX_CHARS = 1 << 24
MAX_EXPONENT = 4096
_SOURCE_NAME = "<chat template>"  # the file name of the template's compiled code, which the time limit traces
# An assistant message that no template changes, to see what a template writes after one (`end_of_turn_id`).
_ANSWER = "attn-answer-7f3c"


class _Refused(TemplateError):
    """`raise_exception(message)` in a template: it refuses the conversation."""


class _TimeUp(Exception):
    """The render ran past its deadline."""


class _Namespace(Namespace):
    """Jinja's `namespace`, refusing attribute names that start with "_" (Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature: `self` may be an attribute name
        self, values = args[0], dict(*args[1:], **kwargs)
        for name in values:
            _check_name(name)
        Namespace.__init__(self, values)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        _check_chars(_size(value), f"the value stored as {name!r}")
        Namespace.__setitem__(self, name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"a namespace may not hold {name!r}: names that start with '_' are Python internals")


def _size(value: Any) -> int:
    """The characters a value holds, roughly: a text's length, a sequence's or mapping's items and their texts."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        return len(value) + sum(len(item) for item in items if isinstance(item, str))
    return 0


def _check_chars(size: int, what: str) -> None:
    if size > MAX_CHARS:
        raise SecurityError(f"{what} would hold {size:,} characters, more than {MAX_CHARS:,}")


def _number(value: Any, default: int) -> int:
    return len(value) if isinstance(value, str) else value if isinstance(value, int) else default


def _formatted(text: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """At most what formatting `text` (`%` or `format`) builds: its numbers count as widths."""
    widths = sum(int(digits) for digits in re.findall(r"\d+", text))
    return len(text) + widths + sum(map(_size, args)) + sum(map(_size, kwargs.values()))


def _padded(text: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    return len(text) + _number(args[0] if args else kwargs.get("width"), 80)


def _indented(text: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    return len(text) + _number(args[0] if args else kwargs.get("width"), 4) * (text.count("\n") + 1)


def _replaced(text: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    old, new = (list(args) + [kwargs.get("old", ""), kwargs.get("new", "")])[:2]
    return len(text) + (text.count(str(old)) + 1) * _size(new)


def _joined(items: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    sized = hasattr(items, "__len__")  # a generator (`map`) yields items that are bounded themselves
    return _size(items) + (len(items) * _size(args[0] if args else kwargs.get("d", "")) if sized else 0)


# What a string method or filter may build, bounded from its inputs (see the module docstring).
_GROWTH = {"center": _padded, "ljust": _padded, "rjust": _padded, "zfill": _padded, "expandtabs": _indented,
           "indent": _indented, "replace": _replaced, "join": _joined, "format": _formatted}


def _bounded_filter(name: str, function: Any) -> Any:
    """The filter `function`, refusing a call whose result would pass `MAX_CHARS` before it runs."""

    @functools.wraps(function)  # keeps Jinja's marker of a filter that takes the context first
    def bounded(*args: Any, **kwargs: Any) -> Any:
        first = 1 if getattr(function, "jinja_pass_arg", None) else 0
        value = args[first] if len(args) > first else ""
        if name != "join" and not isinstance(value, str):
            value = str(value)
        _check_chars(_GROWTH[name](value, args[first + 1:], kwargs), f"the {name} filter's result")
        return function(*args, **kwargs)

    return bounded


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with `*`, `**`, `+`, `%`, calls and the filters that grow text bounded."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        for value in (*args, *kwargs.values()):
            _check_chars(_size(value), "an argument")
        owner = getattr(getattr(obj, "__wrapped__", obj), "__self__", None)  # the sandbox wraps str.format
        growth = _GROWTH.get(getattr(obj, "__name__", ""))
        if isinstance(owner, str) and growth is not None:
            _check_chars(growth(owner, args, kwargs), f"str.{obj.__name__}'s result")
        return super().call(context, obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            _check_chars(_size(left) + _size(right), "a sum")
        if operator == "%" and isinstance(left, str):
            _check_chars(_formatted(left, right if isinstance(right, tuple) else (right,), {}), "a % format")
        if operator == "**" and isinstance(right, int) and isinstance(left, (int, float)) and abs(left) > 1 \
                and abs(right) > MAX_EXPONENT:
            raise SecurityError(f"{left!r} ** {right} has an exponent above {MAX_EXPONENT}")
        if operator == "*":
            sized, count = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(sized, (str, list, tuple)) and isinstance(count, int) and len(sized) * count > MAX_ITEMS:
                raise SecurityError(f"repeating {len(sized)} items {count} times makes more than {MAX_ITEMS}")
        return super().call_binop(context, operator, left, right)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        """Refuses an unsafe attribute at once (Jinja's sandbox renders it as undefined until it is used)."""
        raise SecurityError(f"a template may not read {attribute!r} of a {type(obj).__name__}")


def _raise_exception(message: str) -> None:
    raise _Refused(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    environment = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=_Namespace)
    del environment.globals["lipsum"]
    for name in ("center", "indent", "replace", "join", "format"):
        environment.filters[name] = _bounded_filter(name, environment.filters[name])
    try:
        code = environment.compile(source, filename=_SOURCE_NAME)
    except TemplateSyntaxError as error:
        raise ChatTemplateError(f"the chat template does not compile: {error.message} (line {error.lineno} of the "
                                "template); correct the model's chat template") from None
    return environment.template_class.from_code(environment, code, environment.make_globals(None))


class ChatTemplate:
    """A chat template, compiled once, with the special tokens it may refer to.

    Args:
        source: the Jinja source (tokenizer_config.json's "chat_template", a chat_template.jinja file).
        special_tokens: the variables that name special tokens, e.g. {"bos_token": "<s>", "eos_token": "</s>"};
            a None value is left out.

    Raises:
        ChatTemplateError: the source does not compile (the message gives Jinja's reason and line).

    Example:
        >>> chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}"
        ...           "{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
        >>> ChatTemplate(chatml).render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str | None] | None = None) -> None:
        self.source = source
        self.special_tokens = {name: token for name, token in (special_tokens or {}).items() if token is not None}
        self._template = _compile(source)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
               tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The conversation as the template writes it.

        Args:
            messages: oldest first: mappings with "role" and "content" (and whatever else the template reads), made
                of strings, numbers, booleans, None, lists and mappings.
            add_generation_prompt: end with the start of an assistant's turn (what a model continues to answer).
            tools: the functions the model may call, each {"type": "function", "function": {"name", "description",
                "parameters"}}, or None.

        Raises:
            ChatTemplateError: the messages are not such mappings or the template refuses them (`raise_exception`),
                both with field "messages"; the template breaks the sandbox's rules, fails, or runs too long.
        """
        variables = {**self.special_tokens, "messages": _plain_messages(messages),
                     "tools": None if tools is None else list(tools), "documents": None,
                     "add_generation_prompt": add_generation_prompt}
        deadline = time.monotonic() + RENDER_SECONDS

        def line(frame: Any, event: str, arg: Any) -> Any:
            if time.monotonic() > deadline:
                raise _TimeUp
            return line

        def call(frame: Any, event: str, arg: Any) -> Any:  # only the template's own frames are timed
            return line if frame.f_code.co_filename == _SOURCE_NAME else None

        before = sys.gettrace()
        sys.settrace(call)
        try:
            return _joined_text(self._template.generate(variables))
        except _Refused as error:
            raise ChatTemplateError(f"the model's chat template refuses this conversation: {error.message}",
                                    "messages") from None
        except _TimeUp:
            raise ChatTemplateError(f"the model's chat template ran longer than {RENDER_SECONDS} s (a loop that does "
                                    "not end in time); correct the chat template") from None
        except SecurityError as error:
            raise ChatTemplateError(f"the model's chat template broke a rule of its sandbox ({error}); correct the "
                                    "chat template") from None
        except RecursionError:
            raise ChatTemplateError("the model's chat template recursed too deeply; correct the chat template") from None
        except Exception as error:  # noqa: BLE001 - the template is foreign code: any failure of it is reported
            raise ChatTemplateError(f"the model's chat template failed on this conversation ({type(error).__name__}: "
                                    f"{error}); check the messages' roles and contents, or correct the template") from None
        finally:
            sys.settrace(before)


def _joined_text(pieces: Iterator[str]) -> str:
    """The pieces of a render as one text, refused once it passes `MAX_CHARS`."""
    kept, size = [], 0
    for piece in pieces:
        size += len(piece)
        _check_chars(size, "the rendered prompt")
        kept.append(piece)
    return "".join(kept)


def _plain_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as fresh plain data, without the keys whose value is None (as transformers passes them)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(f"must be a list of messages, got {type(messages).__name__}", "messages")
    plain = []
    for number, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"message {number} is a {type(message).__name__}; give each message as an "
                                    "object with a role and a content", "messages")
        plain.append({str(key): _plain(value, number) for key, value in message.items() if value is not None})
    return plain


def _plain(value: Any, number: int) -> Any:
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(key): _plain(item, number) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, number) for item in value]
    raise ChatTemplateError(f"message {number} holds a {type(value).__name__}; messages hold text, numbers, lists "
                            "and objects only", "messages")


def end_of_turn_id(template: ChatTemplate, tokenizer: Tokenizer) -> int | None:
    """The special token the template writes right after an assistant's message: where a model's answer ends.

    ChatML's `<|im_end|>`, Llama 3's `<|eot_id|>`; None when the template writes no special token there or refuses
    a user message followed by an assistant's.

    Example:
        >>> import tokenizers
        >>> backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
        >>> backend.add_special_tokens(["<end>"])
        1
        >>> end_of_turn_id(ChatTemplate("{% for m in messages %}{{ m.content }}<end>{% endfor %}"),
        ...                Tokenizer(backend, "file"))
        2
    """
    try:
        text = template.render([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": _ANSWER}])
    except ChatTemplateError:
        return None
    if _ANSWER not in text:
        return None
    after = tokenizer.encode(text[text.rindex(_ANSWER) + len(_ANSWER):].lstrip())
    if not after:
        return None
    first = after[0]
    return first if tokenizer.decode([first]) == "" and tokenizer.decode([first], skip_special=False) else None
