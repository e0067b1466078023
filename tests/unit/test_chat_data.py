"""Conversations as training data: the assistant's tokens marked by rendering each conversation's prefixes, the loss
on those tokens only, malformed lines named by number, and a fine-tuning run on a chat file end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from chat_models import SMOLLM2_TEMPLATE, tiny_chat_bundle

from attn import load_run_config
from attn.app.tasks import EvalOptions, evaluate, get_task
from attn.artifacts import Bundle, load_model, save_model
from attn.core.errors import ConfigError, DataFormatError
from attn.data.chat_data import (
    Conversation,
    assistant_spans,
    collate_chat,
    encode_conversations,
    read_conversations,
    unscored_id,
)
from attn.data.chat_template import ChatTemplate
from attn.data.readers import Fields, load_parallel
from attn.decoding import GenerationConfig
from attn.training import run_training
from attn.training.runconfig import RunConfig
from attn.training.task_data import TaskContext, lm_task
from benchmarks.bible_chat import FOLDER, PROMPT, write_chats

TWO_TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"},
             {"role": "assistant", "content": "Hi there."}, {"role": "user", "content": "How are you?"},
             {"role": "assistant", "content": "Fine, thank you."}]
CHATML = ChatTemplate(SMOLLM2_TEMPLATE)


@pytest.fixture(scope="module")
def chat() -> Bundle:
    return tiny_chat_bundle()


def write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows),
                    encoding="utf-8")
    return path


def test_the_assistant_tokens_are_those_between_the_prompt_and_the_rendering_through_the_turn(chat):
    example = encode_conversations("x", [Conversation(TWO_TURNS, 1)], CHATML, chat.tokenizer)[0]
    marked = [token for token, mine in zip(example.ids, example.assistant) if mine]
    answers = "Hi there.<|im_end|>\nFine, thank you.<|im_end|>\n"
    assert chat.tokenizer.decode(marked, skip_special=False) == answers
    # The last turn's tokens: the rendering without its answer, with the generation prompt, is the rest.
    prompt = chat.tokenizer.encode(CHATML.render(TWO_TURNS[:-1], add_generation_prompt=True))
    last = chat.tokenizer.encode("Fine, thank you.<|im_end|>\n")
    assert example.ids == prompt + last
    assert example.assistant[len(prompt):] == [True] * len(last)


def test_a_template_that_does_not_append_turns_is_refused_naming_the_line(chat, tmp_path):
    last_differs = "{% for m in messages %}{{ m.content }}{% if loop.last %}.{% endif %}{% endfor %}"
    path = write_lines(tmp_path / "c.jsonl", [{"messages": TWO_TURNS[1:3]}, {"messages": TWO_TURNS}])
    with pytest.raises(DataFormatError, match=r"c\.jsonl:1: .*differently from the start of a longer one"):
        encode_conversations(path, read_conversations(path), ChatTemplate(last_differs), chat.tokenizer)
    text, spans = assistant_spans(CHATML, TWO_TURNS)
    assert [text[start:end] for start, end in spans] == ["Hi there.<|im_end|>\n", "Fine, thank you.<|im_end|>\n"]


@pytest.mark.parametrize(("line", "message"), [
    ('{"messages": [', r"not valid JSON"),
    ('{"conversation": []}', r'needs "messages".*its keys are \'conversation\''),
    ({"messages": [{"role": "robot", "content": "beep"}]}, r'message 0 has the role "robot"; use one of system, '),
    ({"messages": [{"role": "user", "content": "Hi"}]}, r"no assistant turn"),
    ({"messages": [{"role": "user", "content": ["Hi"]}, {"role": "assistant", "content": "Hello"}]},
     r'message 0 \(user\) has the content \["Hi"\], not a string'),
    ({"messages": [{"role": "user", "content": "\ud800"}, {"role": "assistant", "content": "Hello"}]},
     r"message 0 \(user\)"),
])
def test_a_malformed_line_is_named_with_its_number_and_the_fix(tmp_path, line, message):
    good = {"messages": TWO_TURNS[1:3]}
    path = write_lines(tmp_path / "chats.jsonl", [good, good, line])
    with pytest.raises(DataFormatError, match=rf"chats\.jsonl:3: .*{message}"):
        read_conversations(path)


def test_an_assistant_turn_of_tool_calls_needs_no_content(tmp_path):
    calls = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "w"}}]},
             {"role": "tool", "content": "sunny", "tool_call_id": "1"}, {"role": "assistant", "content": "Sunny."}]
    path = write_lines(tmp_path / "tools.jsonl", [{"messages": calls}])
    assert read_conversations(path)[0].messages == calls


def test_the_loss_counts_the_assistant_tokens_alone(chat):
    conversations = [Conversation(TWO_TURNS, 1), Conversation(TWO_TURNS[1:3], 2)]
    examples = encode_conversations("x", conversations, CHATML, chat.tokenizer)
    ignore = unscored_id(chat.tokenizer.vocab_size, examples)
    x, y = collate_chat(examples, ignore)  # the second conversation is padded
    with torch.no_grad():
        logits = chat.model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=ignore)
        # Each conversation alone, unpadded, summed over the positions whose next token is the assistant's.
        total, count = 0.0, 0
        for example in examples:
            log_p = torch.log_softmax(chat.model(torch.tensor([example.ids[:-1]]))[0], -1)
            for position, (token, mine) in enumerate(zip(example.ids[1:], example.assistant[1:])):
                if mine:
                    total -= float(log_p[position, token])
                    count += 1
    assert count == int((y != ignore).sum()) == sum(sum(e.assistant[1:]) for e in examples)
    assert math.isclose(float(loss), total / count, rel_tol=1e-5)
    assert ignore not in {t for e in examples for t, mine in zip(e.ids, e.assistant) if mine}


def test_a_run_fine_tunes_on_chat_files_and_keeps_the_template(chat, tmp_path):
    model = save_model(chat, tmp_path / "chat-model")
    rows = [{"messages": [{"role": "user", "content": f"Hello {n}!"}, {"role": "assistant", "content": "Hi."}]}
            for n in range(6)]
    long = {"messages": [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "Hi."}]}
    train = write_lines(tmp_path / "train.jsonl", [*rows, long])
    valid = write_lines(tmp_path / "valid.jsonl", rows[:2])
    config = RunConfig.from_dict({
        "task": "lm", "run_dir": str(tmp_path / "run"),
        "data": {"train": str(train), "valid": str(valid), "format": "chat", "max_length": 64},
        "model": {"init_from": str(model)}, "batch": {"max_tokens": 256, "max_sentences": 4},
        "optim": {"optimizer": "adamw", "schedule": "constant", "lr": 1e-3, "warmup_steps": 0},
        "train": {"max_steps": 2, "quiet": True, "eval_interval": 0, "checkpoint_interval": 0, "precision": "fp32",
                  "label_smoothing": 0.0},
    })
    with pytest.warns(UserWarning, match="data.train: 1 conversations longer than 64 tokens were dropped"):
        result = run_training(config, task_builder=get_task("lm").build)
    assert math.isfinite(result.metrics["val_loss"])
    trained = load_model(tmp_path / "run", "cpu")
    assert trained.chat_template == SMOLLM2_TEMPLATE
    scored = evaluate(trained, valid, EvalOptions(GenerationConfig(max_new_tokens=4)))
    assert scored["task"] == "chat" and scored["conversations"] == 2 and 0.0 <= scored["bleu"] <= 100.0


def test_chat_files_need_a_model_with_a_template_and_belong_to_the_lm_task(chat, tmp_path):
    train = write_lines(tmp_path / "train.jsonl", [{"messages": TWO_TURNS}])
    config = RunConfig.from_dict({"task": "lm", "data": {"train": str(train), "format": "chat"}})
    with pytest.raises(ConfigError, match="data.format: chat needs the chat template"):
        lm_task(config, chat.model_config, TaskContext(tokenizer=chat.tokenizer))
    with pytest.raises(ConfigError, match="format: chat files .* train the lm task only"):
        load_parallel(train, Fields(format="chat"))


def test_the_bible_chat_recipes_read_the_files_their_data_step_writes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert write_chats(FOLDER) == {"train": 27_378, "valid": 983, "test": 1_043}
    first = read_conversations(f"{FOLDER}/test.jsonl")[0].messages
    verse = load_parallel("data/bible-en-es/test.tsv")
    assert first == [{"role": "user", "content": PROMPT + verse.sources[0]},
                     {"role": "assistant", "content": verse.targets[0]}]
    for name, rank in (("smollm2-bible-chat", 0), ("smollm2-bible-chat-lora", 16)):
        config = load_run_config(f"configs/{name}.toml")
        assert (config.data.format, config.data.train, config.data.valid, config.lora.rank) == \
            ("chat", f"{FOLDER}/train.jsonl", f"{FOLDER}/valid.jsonl", rank)
        assert config.model.init_from == "SmolLM2-135M-Instruct"
