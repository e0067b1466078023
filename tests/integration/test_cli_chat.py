"""`attn chat` and `attn generate --chat` as a user runs them, on a tiny random ChatML model saved as a checkpoint:
every answer is the library's continuation of the conversation so far, rendered by the model's template."""

from __future__ import annotations

import builtins
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chat_models import tiny_chat_bundle
from cli_helpers import ROOT, run_cli

from attn.inference import chat as chat_module
from attn.inference.chat import conversation
from attn.app.cli import main
from attn.inference.continuation import continue_texts
from attn.artifacts import Bundle, load_model, save_model
from attn.decoding import GenerationConfig

LIMIT = 30


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tiny_chat_bundle(), tmp_path_factory.mktemp("chat") / "ckpt")


@pytest.fixture(scope="module")
def loaded(model: Path) -> Bundle:
    return load_model(model, "cpu")


def answer_of(loaded: Bundle, messages: list[dict[str, str]], config: GenerationConfig | None = None) -> str:
    config = loaded.generation_config(config or GenerationConfig(max_new_tokens=LIMIT), chat=True)
    return continue_texts(loaded, [loaded.render_chat(messages)], config)[0][0].text


def test_chat_answers_each_line_remembers_the_conversation_and_resets(model: Path, loaded: Bundle) -> None:
    lines = ["Tell me a joke about cats and dogs.", "Hi", "/reset", "", "Tell me a joke about cats and dogs."]
    found = run_cli("chat", "--model", str(model), "--device", "cpu", "--max-tokens", str(LIMIT), "--system",
                    "Be brief.", stdin="\n".join(lines) + "\n")
    assert found.returncode == 0, found.stderr
    first = answer_of(loaded, conversation(lines[0], "Be brief."))
    second = answer_of(loaded, [*conversation(lines[0], "Be brief."), {"role": "assistant", "content": first},
                                {"role": "user", "content": lines[1]}])
    assert first and second and first != second
    assert found.stdout == f"{first}\n{second}\n{first}\n"  # after /reset the first answer again; a blank line is none
    assert found.stderr.count("attn chat: a new conversation") == 1 and "Traceback" not in found.stderr


def test_chat_decodes_under_every_sampling_flag(model: Path, loaded: Bundle) -> None:
    flags = {"temperature": 0.8, "top_k": 30, "top_p": 0.9, "min_p": 0.05, "seed": 5, "repetition_penalty": 1.1,
             "frequency_penalty": 0.4, "presence_penalty": 0.6}
    args = [item for name, value in flags.items() for item in (f"--{name.replace('_', '-')}", str(value))]
    found = run_cli("chat", "--model", str(model), "--device", "cpu", "--max-tokens", str(LIMIT), *args,
                    "--logit-bias", "7=1.5", stdin="Tell me a joke.\n")
    assert found.returncode == 0, found.stderr
    config = GenerationConfig(max_new_tokens=LIMIT, sample=True, logit_bias={7: 1.5}, **flags)
    expected = answer_of(loaded, conversation("Tell me a joke."), config)
    assert found.stdout == f"{expected}\n" and expected != answer_of(loaded, conversation("Tell me a joke."))


def test_a_line_that_is_not_utf8_is_refused_and_the_chat_goes_on(model: Path, loaded: Bundle) -> None:
    found = subprocess.run([sys.executable, "-m", "attn.app.cli", "chat", "--model", str(model), "--device", "cpu",
                            "--max-tokens", str(LIMIT)], input=b"caf\xe9\nHi\n", capture_output=True, timeout=120,
                           check=False)
    assert found.returncode == 0, found.stderr
    errors = [line for line in found.stderr.decode().splitlines() if line.startswith("attn: error:")]
    assert errors == [("attn: error: message: is not valid Unicode: a lone surrogate U+DCE9 (the byte 0xe9 of text "
                       "that is not UTF-8) at character 3; give the text in UTF-8; /reset starts a new conversation")]
    assert found.stdout.decode() == answer_of(loaded, conversation("Hi", None)) + "\n"  # the refused line is no turn


def test_ctrl_c_stops_an_answer_which_stays_in_the_conversation(model: Path, loaded: Bundle,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    typed = iter(["Tell me a joke.", "Hi"])

    def user(prompt: str) -> str:  # Ctrl-C at the prompt once both lines are typed
        line = next(typed, None)
        if line is None:
            raise KeyboardInterrupt
        return line

    real, interrupted = chat_module.generate_stream, []

    def stopped_once(*args, **kwargs):  # Ctrl-C in the middle of the first answer, after two pieces of text
        pieces = real(*args, **kwargs)
        if interrupted:
            return pieces
        interrupted.append(True)

        def two_then_ctrl_c():
            yield next(pieces)
            yield next(pieces)
            raise KeyboardInterrupt

        return two_then_ctrl_c()

    monkeypatch.setattr(builtins, "input", user)
    monkeypatch.setattr(chat_module, "generate_stream", stopped_once)
    assert main(["chat", "--model", str(model), "--device", "cpu", "--max-tokens", str(LIMIT)]) == 0
    out, err = capsys.readouterr()
    shown, rest = out.split("\n", 1)
    whole = answer_of(loaded, conversation("Tell me a joke."))
    assert shown and whole.startswith(shown) and whole != shown
    second = answer_of(loaded, [*conversation("Tell me a joke."), {"role": "assistant", "content": shown},
                                {"role": "user", "content": "Hi"}])
    assert rest == f"{second}\n" and "attn chat: answer stopped" in err


def test_ctrl_c_at_the_prompt_ends_the_chat_cleanly(model: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "attn.app.cli", "chat", "--model", str(model), "--device",
                                "cpu"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr.readline().startswith("attn chat: ")  # the model is loaded: the chat waits for a line
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert (process.returncode, out, err) == (0, "", "")


def test_a_model_without_a_chat_template_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    plain = tiny_chat_bundle()
    plain.chat_template, plain.stop_ids = None, ()
    folder = save_model(plain, tmp_path / "plain")
    for command in (("chat",), ("generate", "--chat", "Hi")):
        found = run_cli(*command, "--model", str(folder), "--device", "cpu", stdin="Hi\n")
        assert found.returncode == 1 and found.stdout == ""
        assert found.stderr == (f"attn: error: {folder}: the model has no chat template, so it cannot chat; put the "
                                f"template it was trained with in {folder}/chat_template.jinja, or continue plain "
                                "text with attn generate (without --chat)\n")


def test_generate_chat_answers_each_prompt_as_a_users_message(model: Path, loaded: Bundle,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    prompts = ["Tell me a joke.", "Hi"]
    args = ["generate", "--model", str(model), "--device", "cpu", "--chat", "--max-new-tokens", str(LIMIT)]
    assert main([*args, prompts[0]]) == 0  # one prompt streams its answer, and only the answer
    assert capsys.readouterr().out == answer_of(loaded, conversation(prompts[0])) + "\n"
    assert main([*args, "--system", "Be brief.", "--json", *prompts]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"prompt": p, "continuations": [{"text": answer_of(loaded, conversation(p, "Be brief.")), "score": None}]}
        for p in prompts]


@pytest.mark.parametrize(("args", "message"), [
    (("generate", "--system", "Be brief.", "Hi"), "--system: is the system message of a chat: give --chat as well"),
    (("chat", "--temperature", "-1"), "--temperature: must be a number >= 0, got -1.0; 0 decodes greedily"),
    (("chat", "--max-tokens", "0"), "--max-tokens: must be >= 1, got 0; use None for the default limit"),
    (("chat", "--temperature", "1", "--min-p", "-0.5"), "--min-p: must be in [0, 1], got -0.5; 0 turns min-p "
                                                        "filtering off"),
])
def test_flags_that_do_not_fit_are_refused_before_the_model_loads(args: tuple[str, ...], message: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, "--model", "no/such/model"]) == 2
    assert capsys.readouterr().err == f"attn: error: {message}\n"
