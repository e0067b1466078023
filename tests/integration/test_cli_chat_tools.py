"""`attn chat --tools` as a user runs it, on a tiny random ChatML model saved as a checkpoint (its template knows no
tools: the fallback format): a forced call is printed, its result read as the next line, and the answer to it is
the library's; flags that do not fit are one line naming the flag."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from chat_models import tiny_chat_bundle

from attn.app.cli import main
from attn.artifacts import load_model, save_model
from attn.decoding import GenerationConfig
from attn.inference.chat import ChatSession

BOOKING = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "properties": {"nights": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["nights"], "additionalProperties": False}}}
LIMIT = 80


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tiny_chat_bundle(1024), tmp_path_factory.mktemp("chat") / "ckpt")


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tools") / "tools.json"
    path.write_text(json.dumps([BOOKING]), encoding="utf-8")
    return path


def test_chat_prints_a_forced_call_reads_its_result_and_answers(model: Path, tools: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("A room?\nbooked\n"))
    assert main(["chat", "--model", str(model), "--device", "cpu", "--max-tokens", str(LIMIT), "--tools", str(tools),
                 "--tool-choice", "book"]) == 0
    found = capsys.readouterr()
    session = ChatSession(load_model(model, "cpu"), GenerationConfig(max_new_tokens=LIMIT), tools=[BOOKING],
                          tool_choice="required")
    call_text = "".join(session.reply("A room?"))
    (call,) = session.calls
    answer = "".join(session.answer_calls(["booked"]))
    assert found.out == f"{call_text}\n{answer}\n"
    assert f"attn chat: book called with {call.arguments}; its result:" in found.err


@pytest.mark.parametrize(("args", "message"), [
    (("--tool-choice", "required"), "--tool-choice: chooses among tools: give --tools FILE as well"),
    (("--tools", "{tools}", "--tool-choice", "cancel"), "--tool-choice: names the function 'cancel'"),
    (("--tools", "{bad}"), "--tools: "),
])
def test_tool_flags_that_do_not_fit_are_refused_before_the_model_loads(tools: Path, args: tuple[str, ...],
                                                                       message: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    bad = tools.with_name("bad.json")
    bad.write_text('[{"type": "function"}]', encoding="utf-8")
    assert main(["chat", "--model", "no/such/model", *[arg.format(tools=tools, bad=bad) for arg in args]]) == 2
    assert capsys.readouterr().err.startswith(f"attn: error: {message}")


def test_a_forced_call_and_a_grammar_flag_are_one_line(model: Path, tools: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chat", "--model", str(model), "--device", "cpu", "--tools", str(tools), "--tool-choice", "book",
                 "--regex", "[0-9]+"]) == 2
    assert capsys.readouterr().err.startswith("attn: error: --tool-choice: a forced call is all the answer holds")
