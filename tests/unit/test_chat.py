"""Chat models: where the template and the end of a turn come from (attn checkpoints, Hugging Face directories),
and a conversation's history, its answers equal to the library's continuation of the rendered conversation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_models import SMOLLM2_TEMPLATE, tiny_chat_bundle

from attn.inference.chat import ChatSession, conversation
from attn.inference.continuation import continue_texts
from attn.artifacts import Bundle, load_model, save_model
from attn.artifacts.pretrained import export_pretrained
from attn.decoding import GenerationConfig
from attn.core.errors import ChatTemplateError, CheckpointError, GenerationError
from attn.models import build_model

LIMIT = GenerationConfig(max_new_tokens=30)


@pytest.fixture(scope="module")
def chat() -> Bundle:
    return tiny_chat_bundle()


def answer_of(loaded: Bundle, messages: list[dict[str, str]], config: GenerationConfig = LIMIT) -> str:
    """The library's answer: the rendered conversation's continuation, ended at the model's end of turn."""
    return continue_texts(loaded, [loaded.render_chat(messages)], loaded.generation_config(config, chat=True))[0][0].text


def test_a_chat_template_renders_with_the_models_special_tokens(chat: Bundle) -> None:
    rendered = chat.render_chat(conversation("Hi", system="Be brief."))
    assert rendered == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert chat.render_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    assert chat.render_chat([{"role": "user", "content": "Hi"}]).startswith("<|im_start|>system\nYou are a helpful")
    without = Bundle(model=chat.model, tokenizer=chat.tokenizer, task="lm", model_config=chat.model_config,
                     path=Path("runs/lm"))
    with pytest.raises(ChatTemplateError, match=r"runs/lm: the model has no chat template, so it cannot chat; put the "
                       r"template it was trained with in runs/lm/chat_template.jinja, or continue plain text"):
        without.render_chat(conversation("Hi"))


def test_an_attn_checkpoint_keeps_the_template_and_the_end_of_a_turn(chat: Bundle, tmp_path: Path) -> None:
    folder = save_model(chat, tmp_path / "chat")
    assert (folder / "chat_template.jinja").read_text(encoding="utf-8") == SMOLLM2_TEMPLATE
    loaded = load_model(folder, "cpu")
    assert (loaded.chat_template, loaded.stop_ids) == (SMOLLM2_TEMPLATE, chat.stop_ids)
    messages = conversation("What is the capital of France?")
    assert answer_of(loaded, messages) == answer_of(chat, messages)
    # Without a record of it, the end of a turn is the special token that the template writes after an answer.
    info = json.loads((folder / "task.json").read_text(encoding="utf-8"))
    (folder / "task.json").write_text(json.dumps({k: v for k, v in info.items() if k != "stop_ids"}), encoding="utf-8")
    assert load_model(folder, "cpu").stop_ids == chat.stop_ids
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"chat_template.jinja: the chat template does not compile: "):
        load_model(folder, "cpu")


def test_a_hugging_face_directory_gives_its_template_and_the_ids_that_end_generation(chat: Bundle,
                                                                                      tmp_path: Path) -> None:
    config = chat.model_config.replace(output_bias=False)  # GPT-2 has no output bias
    folder = export_pretrained(build_model(config), config, tmp_path / "hf", "gpt2", chat.tokenizer)
    assert load_model(folder, "cpu").chat_template is None  # transformers' own files, and no template in them
    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    settings["chat_template"] = SMOLLM2_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [chat.eos_id, 7]}), encoding="utf-8")
    loaded = load_model(folder, "cpu")
    assert loaded.chat_template == SMOLLM2_TEMPLATE and loaded.stop_ids == tuple(sorted({7, *chat.stop_ids}))
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ messages[0].content }}"}]
    (folder / "chat_template.jinja").write_text("{{ 'file' }}", encoding="utf-8")  # the file comes first
    assert load_model(folder, "cpu").chat_template == "{{ 'file' }}"
    (folder / "chat_template.jinja").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": named}), encoding="utf-8")
    assert load_model(folder, "cpu").render_chat(conversation("Hi")) == "Hi"
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": 3}), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"tokenizer_config.json: \"chat_template\" must be a template string"):
        load_model(folder, "cpu")


def test_a_session_keeps_the_history_and_answers_as_the_library_does(chat: Bundle) -> None:
    session = ChatSession(chat, LIMIT, system="You are terse.")
    first = "".join(session.reply("Tell me a joke."))
    expected = conversation("Tell me a joke.", system="You are terse.")
    assert first and first == answer_of(chat, expected)
    second = "".join(session.reply("Hi"))
    expected += [{"role": "assistant", "content": first}, {"role": "user", "content": "Hi"}]
    assert second and second == answer_of(chat, expected)
    assert session.messages == [*expected, {"role": "assistant", "content": second}]
    session.reset()
    assert session.messages == [{"role": "system", "content": "You are terse."}]
    assert "".join(session.reply("Tell me a joke.")) == first


def test_an_answer_cut_short_joins_the_history_as_far_as_it_was_shown(chat: Bundle) -> None:
    session = ChatSession(chat, GenerationConfig(max_new_tokens=30))
    pieces = session.reply("Tell me a joke.")
    shown = next(pieces)
    pieces.close()  # what Ctrl-C between two pieces of an answer does
    assert session.messages == [{"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": shown}]


def test_a_conversation_too_long_for_the_model_leaves_the_history_as_it_was(chat: Bundle) -> None:
    short = tiny_chat_bundle(max_positions=64)
    session = ChatSession(short, GenerationConfig(max_new_tokens=10))
    with pytest.raises(GenerationError, match="more than the model's max_positions=64"):
        session.reply("Tell me a joke about cats and dogs. " * 5)
    assert session.messages == []


def test_an_answer_ends_at_the_end_of_a_turn_which_it_does_not_show(chat: Bundle) -> None:
    end = chat.tokenizer.token_to_id("<|im_end|>")
    prompt = chat.render_chat(conversation("Tell me a joke."))
    free = continue_texts(chat, [prompt], GenerationConfig(max_new_tokens=60))[0][0].text
    ended = answer_of(chat, conversation("Tell me a joke."), GenerationConfig(max_new_tokens=60))
    assert chat.stop_ids == (end,) and ended and ended != free and free.startswith(ended)  # it ends its turn early
