"""The chat files of `configs/smollm2-bible-chat.toml`: every verse of the shipped English->Spanish Bible as a
conversation, the user's "Translate to Spanish: <English verse>" and the assistant's Spanish verse.

    python -m benchmarks.bible_chat [FOLDER]

writes train.jsonl, valid.jsonl and test.jsonl (one conversation per line, `attn.data.chat_data`) from the splits of
`data/bible-en-es/` into FOLDER (default: runs/bible-chat-data, where the recipe reads them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attn.data.readers import load_parallel

PROMPT = "Translate to Spanish: "
SPLITS = {"train": "data/bible-en-es/train.tsv.gz", "valid": "data/bible-en-es/valid.tsv",
          "test": "data/bible-en-es/test.tsv"}
FOLDER = "runs/bible-chat-data"


def conversation(english: str, spanish: str) -> dict[str, list[dict[str, str]]]:
    """One verse as a chat: the user asks for its translation, the assistant gives the Spanish verse."""
    return {"messages": [{"role": "user", "content": PROMPT + english},
                         {"role": "assistant", "content": spanish}]}


def write_chats(folder: str | Path) -> dict[str, int]:
    """Writes one chat file per split into `folder`; returns the conversations written per split."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, path in SPLITS.items():
        corpus = load_parallel(path)
        lines = [json.dumps(conversation(en, es), ensure_ascii=False) for en, es in zip(corpus.sources, corpus.targets)]
        (out / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        written[split] = len(lines)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default=FOLDER, help=f"where the chat files go (default: {FOLDER})")
    folder = parser.parse_args().folder
    for split, count in write_chats(folder).items():
        print(f"{Path(folder) / split}.jsonl: {count:,} conversations")


if __name__ == "__main__":
    main()
