"""The time to the first token of a chat's last turn, its conversation's keys and values kept (the prefix cache) or
not: `ChatSession` and `attn serve`.

    python -m benchmarks.chat_prefix              # SmolLM2-135M-Instruct, 10 turns, answers of at most 60 tokens
    python -m benchmarks.chat_prefix --quick      # a tiny random chat model, 3 turns of 8 tokens: checks that it runs

The conversation: the first `--turns` of case 9's questions, each answered greedily with at most `--answer-tokens`
new tokens. Each contender plays the earlier turns once; then its last turn is timed `--reps` times, the contenders
taking turns, each time from the state the earlier turns left (the conversation, and a copy of the kept keys and
values), so every repetition does the same work. `ChatSession`: from `reply` to its first piece of text. The server
(uvicorn in a thread of this process, on 127.0.0.1): from sending the streamed request to the first chunk with
content, read by httpx. The contenders must give the same answers, so the model's weights are float32 (the GGUF
file's blocks dequantized): its kept-quantized layers compute in bf16, whose rounding depends on how many tokens a
step feeds, and a near tie between two tokens can then go either way with or without the cache. Target: with the
cache, at most 0.25 x the time without.

Results: `--out` (default benchmarks/results/chat-prefix/)<date>.json and .md, with the command, the commit, the
machine and its load (`uptime`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import torch
import uvicorn

from attn.app.serve import ServedModel, ServeOptions, create_app, listen
from attn.artifacts import Bundle, load_model
from attn.core.presets import preset
from attn.data.tokenizers import Tokenizer
from attn.decoding import DEFAULT_PREFIX_CACHE_BYTES, GenerationConfig, PrefixCache
from attn.inference.chat import ChatSession
from attn.models import build_model
from benchmarks.chat_model import QUESTIONS, gguf_path
from benchmarks.harness import RESULTS_DIR, script_record, write_record
from benchmarks.serving_load import uptime

MODES = {"cached": DEFAULT_PREFIX_CACHE_BYTES, "uncached": 0}
TINY_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"

Message = dict[str, str]


def tiny_bundle() -> Bundle:
    """A seeded random character-level chat model with a plain template (`--quick`)."""
    tokenizer = Tokenizer.train_chars([*QUESTIONS, TINY_TEMPLATE])
    config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size, dropout=0.0, max_positions=2048)
    torch.manual_seed(0)
    return Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task="lm", model_config=config,
                  path=Path("tiny-chat"), chat_template=TINY_TEMPLATE)


class SessionContender:
    """A `ChatSession`, with or without its prefix cache, and the state its earlier turns left."""

    def __init__(self, bundle: Bundle, config: GenerationConfig, prefix_cache_bytes: int) -> None:
        self.session = ChatSession(bundle, config, prefix_cache_bytes=prefix_cache_bytes)
        self.saved: tuple[list[Message], PrefixCache | None] = ([], None)

    def play(self, turns: list[str]) -> None:
        for text in turns:
            "".join(self.session.reply(text))
        self.saved = (list(self.session.messages), copy.deepcopy(self.session.prefix_cache))

    def first_token_s(self, text: str) -> float:
        self.session.messages, self.session.prefix_cache = list(self.saved[0]), copy.deepcopy(self.saved[1])
        start = time.perf_counter()
        with contextlib.closing(self.session.reply(text)) as pieces:
            next(pieces)
            return time.perf_counter() - start

    def answer(self, text: str) -> str:
        self.session.messages, self.session.prefix_cache = list(self.saved[0]), copy.deepcopy(self.saved[1])
        return "".join(self.session.reply(text))


class ServerContender:
    """`attn serve` with or without its prefix cache, on a free port of 127.0.0.1, in a thread of this process."""

    def __init__(self, bundle: Bundle, config: GenerationConfig, prefix_cache_bytes: int) -> None:
        self.app = create_app([ServedModel("chat", bundle)], ServeOptions(prefix_cache_bytes=prefix_cache_bytes))
        self.body = {"model": "chat", "temperature": 0, "max_tokens": config.max_new_tokens}
        self.messages: list[Message] = []
        self.saved: PrefixCache | None = None

    @property
    def running(self) -> Any:
        return self.app.state.serve.engines["chat"].running

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        bound = listen(ServeOptions(port=0))
        server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [bound]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{bound.getsockname()[1]}/v1", timeout=None)
        try:
            yield
        finally:
            self.client.close()
            server.should_exit = True
            thread.join()

    def play(self, turns: list[str]) -> None:
        for text in turns:
            content = self.answer(text, keep=True)
            self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": content}]
        self.saved = copy.deepcopy(self.running.prefix_cache)

    def first_token_s(self, text: str) -> float:
        self.running.prefix_cache = copy.deepcopy(self.saved)  # the engine is idle between requests
        body = {**self.body, "messages": [*self.messages, {"role": "user", "content": text}], "stream": True}
        start = time.perf_counter()
        with self.client.stream("POST", "/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                    return time.perf_counter() - start
        raise RuntimeError("the stream ended without content")

    def answer(self, text: str, keep: bool = False) -> str:
        if not keep:
            self.running.prefix_cache = copy.deepcopy(self.saved)
        body = {**self.body, "messages": [*self.messages, {"role": "user", "content": text}]}
        return self.client.post("/chat/completions", json=body).json()["choices"][0]["message"]["content"]


def compare(contenders: dict[str, Any], turns: list[str], reps: int) -> dict[str, Any]:
    """Plays the earlier turns, checks that every contender answers the last one alike, then times its first token
    `reps` times, the contenders taking turns."""
    *earlier, last = turns
    for contender in contenders.values():
        contender.play(earlier)
    answers = {mode: contender.answer(last) for mode, contender in contenders.items()}
    if len(set(answers.values())) != 1:
        raise RuntimeError(f"the contenders answer the last turn differently: {answers}")
    times: dict[str, list[float]] = {mode: [] for mode in contenders}
    for _ in range(reps):
        for mode, contender in contenders.items():
            times[mode].append(contender.first_token_s(last))
    medians = {mode: statistics.median(found) for mode, found in times.items()}
    return {"first_token_s": times, "median_s": medians, "cached_over_uncached": medians["cached"] / medians["uncached"]}


def run(bundle: Bundle, turns: list[str], config: GenerationConfig, reps: int) -> dict[str, Any]:
    sessions = {mode: SessionContender(bundle, config, budget) for mode, budget in MODES.items()}
    results: dict[str, Any] = {"ChatSession": compare(sessions, turns, reps)}
    servers: dict[str, ServerContender] = {mode: ServerContender(bundle, config, budget) for mode, budget in MODES.items()}
    with contextlib.ExitStack() as stack:
        for server in servers.values():
            stack.enter_context(server.serving())
        results["attn serve"] = compare(servers, turns, reps)
    prompt = bundle.render_chat(sessions["uncached"].session.messages[:-1])
    results["last_prompt_tokens"] = len(bundle.tokenizer.encode(prompt))
    return results


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny random chat model, 3 turns of 8 tokens, 1 rep")
    parser.add_argument("--turns", type=int, help="user messages (default 10; 3 with --quick)")
    parser.add_argument("--answer-tokens", type=int, help="the most new tokens of an answer (default 60; 8 with "
                        "--quick)")
    parser.add_argument("--reps", type=int, help="timed repetitions of the last turn (default 5; 1 with --quick)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "chat-prefix", help="the folder of the result files")
    args = parser.parse_args(argv)
    args.turns = args.turns or (3 if args.quick else 10)
    args.answer_tokens = args.answer_tokens or (8 if args.quick else 60)
    args.reps = args.reps or (1 if args.quick else 5)
    if not 2 <= args.turns <= len(QUESTIONS):
        parser.error(f"--turns: give 2..{len(QUESTIONS)}, got {args.turns}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs both comparisons, writes the result files and prints the table."""
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = tiny_bundle() if args.quick else load_model(gguf_path(), "cpu", dequantize=True)
    record = script_record("chat_prefix", argv, "tiny random chat model" if args.quick else str(gguf_path()),
                           {"turns": args.turns, "answer_tokens": args.answer_tokens, "reps": args.reps})
    config = GenerationConfig(max_new_tokens=args.answer_tokens)
    record["results"] = run(bundle, list(QUESTIONS[: args.turns]), config, args.reps)
    record["load_after"] = uptime()
    write_record(args.out, "-quick" if args.quick else "", record, markdown(record))
    return 0


def markdown(record: dict[str, Any]) -> str:
    settings, results = record["settings"], record["results"]
    title = f"# Time to the first token of a chat's turn {settings['turns']}, prefix cache on and off ({record['date']})"
    where = (f"`{record['command']}` at {record['commit']} on {record['machine']}, torch {record['torch']}, "
             f"{record['threads']} thread(s); {record['model']}; answers of at most {settings['answer_tokens']} "
             f"tokens; the last prompt has {results['last_prompt_tokens']} tokens")
    lines = [title, "", where, "",
             f"load before: `{record['load_before']}`", f"load after: `{record['load_after']}`", "",
             "| contender | cached median s | uncached median s | cached / uncached (target <= 0.25) |",
             "|---|---|---|---|"]
    for name in ("ChatSession", "attn serve"):
        found = results[name]
        lines.append(f"| {name} | {found['median_s']['cached']:.4f} | {found['median_s']['uncached']:.4f} | "
                     f"{found['cached_over_uncached']:.3f} |")
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    sys.exit(main())
