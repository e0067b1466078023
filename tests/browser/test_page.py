"""The page at `/` of `attn serve`, driven in a real browser (headless Chromium through Playwright).

A real `attn serve` runs as a subprocess on 127.0.0.1 with tiny random models that this module builds (a
translator, a character LM, a classifier, a sentence-pair classifier, an embedder, and two chat models, one
with grouped-query attention: 9 query heads sharing 3 key/value heads, as SmolLM2's). Every
control of the page is used, and what the page shows is checked against the server's own JSON
answers, asked for here with httpx: the page must show what the API says, not what it computes
itself. The page exposes what each canvas draws through `window.attnPage.views[canvasId]` and
`data-` attributes.

Without /usr/bin/chromium or the `playwright` package the module is skipped, except in CI
(`CI=true`), where a missing browser is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
import torch
from chat_models import TEXTS as CHAT_TEXTS
from chat_models import tiny_chat_bundle, tiny_gqa_chat_bundle

from attn.artifacts import save_model
from attn.artifacts.checkpoint import write_checkpoint
from attn.data.readers import Fields
from attn.data.tokenizers import Tokenizer
from attn.models import build_model
from attn.core.presets import preset

CHROMIUM = Path("/usr/bin/chromium")
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update"]


def _browser_missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is not installed (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    return None


_MISSING = _browser_missing()
if _MISSING and os.environ.get("CI") == "true":
    pytest.fail(f"browser tests cannot run in CI: {_MISSING}", pytrace=False)
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, Locator, Page, Route, expect, sync_playwright

TEXT = ("In the beginning God created the heaven and the earth. ROMEO. But soft, what light through yonder "
        "window breaks? Never trust a computer you can't throw out a window. 0123456789\n")
LONG_PROMPT = ("the quick brown fox jumps over the lazy dog " * 14)[:600]  # 600 characters, 600+ tokens


def _tiny(tmp: Path, name: str, preset_name: str, task: str, fields: Fields | None = None, **changes) -> Path:
    tokenizer = Tokenizer.train_chars([TEXT])
    config = preset(preset_name).replace(vocab_size=tokenizer.vocab_size, dropout=0.0, **changes)
    torch.manual_seed(0)
    model = build_model(config).eval()
    if task == "lm":  # no EOS from the random LM, so a stream runs as long as it is asked to
        with torch.no_grad():
            model.lm_head.bias[tokenizer.eos_id] = -1e4
    info = {"task": task, **({"label_names": ["law", "science", "humour"]} if task == "classification" else {}),
            **({"fields": fields.to_dict()} if fields else {})}
    return write_checkpoint(tmp / name, model, config, tokenizer=tokenizer, task_info=info)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("page-models")
    return {
        "mt": _tiny(tmp, "mt", "paper-base-tiny", "translation"),
        "lm": _tiny(tmp, "lm", "char-gpt-tiny", "lm", max_positions=1024, output_bias=True),
        "cls": _tiny(tmp, "cls", "bert-base-tiny", "classification"),
        "nli": _tiny(tmp, "nli", "bert-base-tiny", "classification", Fields(text_pair_field="hypothesis")),
        "emb": _tiny(tmp, "emb", "minilm-l6-tiny", "embedding", num_labels=0),
        "chat": save_model(tiny_chat_bundle(), tmp / "chat"),
        "gqa": save_model(tiny_gqa_chat_bundle(), tmp / "gqa"),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(checkpoints: dict[str, Path], log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """The base URL of `attn serve` of `checkpoints`, running while the block runs."""
    port = _free_port()
    models = [arg for name, path in checkpoints.items() for arg in ("--model", f"{name}={path}")]
    command = [sys.executable, "-m", "attn.app.cli", "serve", *models, "--host", "127.0.0.1", "--port", str(port),
               "--device", "cpu"]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(base, process, log)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a running `attn serve` with the tiny models."""
    with _serving(checkpoints, tmp_path_factory.mktemp("serve-log") / "serve.log") as base:
        yield base


def _wait_until_up(base: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"attn serve exited with {process.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    pytest.fail(f"attn serve did not answer /health within 120 s: {log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def api(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, server: str) -> Iterator[Page]:
    """The page, opened; fails the test if it asked for anything that is not on this machine or threw."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    outside: list[str] = []
    errors: list[str] = []

    def guard(route: Route) -> None:
        host = urlparse(route.request.url).hostname
        if host in ("127.0.0.1", "localhost") or route.request.url.startswith("data:"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    tab = context.new_page()
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto(f"{server}/")
    expect(tab.locator("body")).to_have_attribute("data-ready", "true")
    yield tab
    context.close()
    assert outside == [], f"the page asked for addresses outside this machine: {outside}"
    assert errors == [], f"the page threw: {errors}"


def choose(page: Page, model: str, mode: str) -> None:
    page.select_option("#model", model)
    page.click(f"#tab-{mode}")


def run_and_wait(page: Page, name: str, timeout: float = 60_000) -> None:
    page.click(f"#{name}-run")
    expect(page.locator(f"#{name}-output")).to_have_attribute("data-state", re.compile("done|error"), timeout=timeout)
    assert page.get_attribute(f"#{name}-output", "data-state") == "done", page.inner_text("#error")


def view(page: Page, canvas_id: str, i: int, j: int) -> dict:
    """What the page drew on canvas `canvas_id`: its shape, tokens, and cell (i, j)."""
    return page.evaluate(
        """([id, i, j]) => { const v = window.attnPage.views[id];
             return {rows: v.rows, cols: v.cols, queries: v.queries, keys: v.keys, value: v.value(i, j)}; }""",
        [canvas_id, i, j])


def sse_chunks(api: httpx.Client, body: dict) -> list[dict]:
    with api.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        payloads = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


# ---------------------------------------------------------------- tests


def test_the_model_list_comes_from_the_api_and_the_tabs_follow_each_models_task(page: Page, api: httpx.Client) -> None:
    models = api.get("/v1/models").json()["data"]
    assert page.eval_on_selector_all("#model option", "os => os.map(o => o.value)") == [m["id"] for m in models]
    expected = {"mt": {"translate", "attention"}, "lm": {"generate", "attention"},
                "cls": {"classify", "embed", "attention"}, "nli": {"classify", "embed", "attention"},
                "emb": {"embed", "attention"}, "chat": {"generate", "chat", "attention"},
                "gqa": {"generate", "chat", "attention"}}
    for model in models:
        page.select_option("#model", model["id"])
        tabs = page.eval_on_selector_all("[role=tab]:not([hidden])", "ts => ts.map(t => t.dataset.mode)")
        assert set(tabs) == expected[model["id"]]
        assert model["task"] in page.inner_text("#model-info")
        kinds = page.eval_on_selector_all("#attention-kind option", "os => os.map(o => o.value)")
        assert kinds == (["encoder", "decoder", "cross", "all"] if model["id"] == "mt" else ["self"])
        heads = page.eval_on_selector_all("#attention-head option", "os => os.length")
        assert heads == model["heads"] + 1  # the mean, then each head


def test_translation_shows_the_apis_text_n_best_scores_and_alignment(page: Page, api: httpx.Client) -> None:
    choose(page, "mt", "translate")
    page.fill("#translate-input", "God created the earth.\nBut soft")
    page.fill("#beam-size", "3")
    page.fill("#length-penalty", "1.0")
    page.fill("#n-best", "3")
    page.fill("#translate-max-tokens", "12")
    page.check("#alignment")
    run_and_wait(page, "translate")
    answer = api.post("/v1/translate", json={"model": "mt", "inputs": ["God created the earth.", "But soft"],
                                             "beam_size": 3, "length_penalty": 1.0, "n_best": 3, "max_tokens": 12,
                                             "alignment": True}).json()
    cards = page.locator("#translate-output .translation")
    assert cards.count() == 2
    for k, expected in enumerate(answer["translations"]):
        card = cards.nth(k)
        assert card.locator(".translation-text").inner_text() == expected["text"].strip()
        shown = card.locator("ol.n-best li")
        assert shown.count() == len(expected["n_best"]) == 3
        for n, hyp in enumerate(expected["n_best"]):
            assert shown.nth(n).locator(".hyp").inner_text() == hyp["text"].strip()
            assert float(shown.nth(n).get_attribute("data-score")) == pytest.approx(hyp["score"], abs=1e-5)
        alignment = expected["alignment"]
        rows, cols = len(alignment["target_tokens"]), len(alignment["source_tokens"])
        drawn = view(page, f"alignment-{k}", rows - 1, cols // 2)
        assert (drawn["rows"], drawn["cols"]) == (rows, cols)
        assert drawn["queries"] == alignment["target_tokens"] and drawn["keys"] == alignment["source_tokens"]
        assert drawn["value"] == pytest.approx(alignment["weights"][rows - 1][cols // 2], abs=1e-5)


def test_streamed_greedy_text_equals_the_non_streamed_completion(page: Page, api: httpx.Client) -> None:
    choose(page, "lm", "generate")
    page.fill("#prompt", "ROMEO.")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "24")
    run_and_wait(page, "generate")
    answer = api.post("/v1/completions", json={"model": "lm", "prompt": "ROMEO.", "max_tokens": 24,
                                               "temperature": 0}).json()
    expected = answer["choices"][0]["text"]
    assert page.inner_text("#completion") == expected
    assert page.inner_text("#generate-output") == "ROMEO." + expected
    assert int(page.get_attribute("#generate-output", "data-chunks")) > 1  # it came in pieces
    assert page.get_attribute("#generate-output", "data-finish-reason") == answer["choices"][0]["finish_reason"]

    page.uncheck("#stream")
    run_and_wait(page, "generate")
    assert page.inner_text("#completion") == expected


def test_a_chat_streams_each_answer_of_the_conversation_so_far(page: Page, api: httpx.Client) -> None:
    choose(page, "chat", "chat")
    page.fill("#chat-system", "Be brief.")
    page.fill("#chat-max-tokens", "30")
    page.fill("#chat-input", "Tell me a joke about cats and dogs.")
    run_and_wait(page, "chat")
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Tell me a joke about cats and dogs."}]
    request = {"model": "chat", "temperature": 0, "max_completion_tokens": 30}
    answers = []
    for then in ("Hi", None):
        answer = api.post("/v1/chat/completions", json={**request, "messages": messages}).json()["choices"][0]
        answers.append(answer["message"]["content"])
        shown = page.eval_on_selector_all("#chat-output .message.assistant .text", "ms => ms.map(m => m.textContent)")
        assert shown == answers and answers[-1]
        assert int(page.get_attribute("#chat-output", "data-chunks")) > 1  # it came in pieces
        if then is None:
            break
        messages += [{"role": "assistant", "content": answers[-1]}, {"role": "user", "content": then}]
        page.fill("#chat-input", then)
        page.press("#chat-input", "Enter")
        expect(page.locator("#chat-output .message.assistant")).to_have_count(2)
        expect(page.locator("#chat-output")).to_have_attribute("data-state", "done", timeout=60_000)
    assert page.evaluate("window.attnPage.chat") == [*messages[1:], {"role": "assistant", "content": answers[-1]}]
    page.click("#chat-reset")
    expect(page.locator("#chat-output .message")).to_have_count(0)
    assert page.evaluate("window.attnPage.chat") == []


def test_sampling_options_seed_and_stop_reach_the_server(page: Page, api: httpx.Client) -> None:
    body = {"model": "lm", "prompt": "But soft", "max_tokens": 30, "temperature": 0.9, "top_k": 8, "top_p": 0.9,
            "seed": 7}
    sampled = "".join(c["choices"][0]["text"] for c in sse_chunks(api, body))
    stop = next(ch for ch in sampled[3:] if ch.strip())  # a character the sample holds after a few tokens
    with_stop = "".join(c["choices"][0]["text"] for c in sse_chunks(api, {**body, "stop": [stop]}))
    assert stop not in with_stop and len(with_stop) < len(sampled)

    choose(page, "lm", "generate")
    page.fill("#prompt", "But soft")
    for field, value in [("#temperature", "0.9"), ("#top-k", "8"), ("#top-p", "0.9"), ("#max-tokens", "30"),
                         ("#seed", "7")]:
        page.fill(field, value)
    run_and_wait(page, "generate")
    assert page.inner_text("#completion") == sampled
    page.fill("#stop", stop)
    run_and_wait(page, "generate")
    assert page.inner_text("#completion") == with_stop
    assert page.get_attribute("#generate-output", "data-finish-reason") == "stop"


def test_following_attention_draws_each_streamed_tokens_weights(page: Page, api: httpx.Client) -> None:
    choose(page, "lm", "generate")
    page.fill("#prompt", "ROMEO.")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "10")
    page.check("#follow-attention")
    page.select_option("#generate-attention-layer", "0")
    page.select_option("#generate-attention-head", "1")
    run_and_wait(page, "generate")
    chunks = sse_chunks(api, {"model": "lm", "prompt": "ROMEO.", "max_tokens": 10, "temperature": 0,
                              "attention": {"layer": 0, "head": 1}})
    steps = [c["attention"] for c in chunks if c.get("attention")]
    assert steps and all(s["layer"] == 0 and s["head"] == 1 for s in steps)
    last = len(steps) - 1
    drawn = view(page, "generate-attention", last, len(steps[last]["keys"]) - 1)
    assert (drawn["rows"], drawn["cols"]) == (len(steps), len(steps[last]["keys"]))
    assert drawn["queries"] == [s["token"] for s in steps] and drawn["keys"] == steps[last]["keys"]
    assert drawn["value"] == pytest.approx(steps[last]["weights"][-1], abs=1e-5)
    first = view(page, "generate-attention", 0, 0)["value"]
    assert first == pytest.approx(steps[0]["weights"][0], abs=1e-5)
    strip = page.eval_on_selector_all("#generate-attention-strip span", "ss => ss.map(s => Number(s.dataset.weight))")
    assert strip == pytest.approx(steps[last]["weights"], abs=1e-5)  # the latest token's weights, key by key


def test_classification_bars_show_the_apis_probabilities(page: Page, api: httpx.Client) -> None:
    choose(page, "cls", "classify")
    texts = ["Never trust a computer.", "In the beginning"]
    page.fill("#classify-input", "\n".join(texts))
    run_and_wait(page, "classify")
    answer = api.post("/v1/classify", json={"model": "cls", "inputs": texts}).json()
    check_classification_cards(page, answer)
    assert page.locator("#classify-output .second-text").count() == 0


def check_classification_cards(page: Page, answer: dict) -> None:
    """The page's cards show the API's probabilities: bars, values and the top label."""
    cards = page.locator("#classify-output .classification")
    assert cards.count() == len(answer["results"])
    for k, result in enumerate(answer["results"]):
        rows = cards.nth(k).locator(".bar-row")
        shown = {rows.nth(n).get_attribute("data-label"): float(rows.nth(n).get_attribute("data-probability"))
                 for n in range(rows.count())}
        assert shown == pytest.approx(result["probabilities"], abs=1e-6)
        assert cards.nth(k).locator(".bar-row.top").get_attribute("data-label") == result["label"]
        widths = [rows.nth(n).locator(".bar > div").evaluate("d => parseFloat(d.style.width)")
                  for n in range(rows.count())]
        assert widths == pytest.approx([100 * p for p in sorted(result["probabilities"].values(), reverse=True)],
                                       abs=0.01)


def test_a_pair_classifier_gets_a_second_text_field_and_shows_the_apis_pair_results(page: Page,
                                                                                    api: httpx.Client) -> None:
    choose(page, "cls", "classify")
    second = page.get_by_label("Second text")
    expect(second).to_be_hidden()
    choose(page, "nli", "classify")
    expect(second).to_be_visible()
    assert "sentence pairs" in page.inner_text("#model-info")
    cards = {card["id"]: card for card in api.get("/v1/models").json()["data"]}
    assert cards["nli"]["pairs"] and not cards["cls"]["pairs"]
    texts, pairs = ["Never trust a computer.", "In the beginning"], ["A window breaks.", "God created the earth."]
    page.get_by_label("First text").fill("\n".join(texts))
    second.fill("\n".join(pairs))
    run_and_wait(page, "classify")
    answer = api.post("/v1/classify", json={"model": "nli", "inputs": texts, "pairs": pairs}).json()
    check_classification_cards(page, answer)
    assert page.locator("#classify-output .second-text").all_inner_texts() == pairs

    second.fill(pairs[0])  # one second text for two inputs: the server's 422, shown as it is
    page.click("#classify-run")
    expect(page.locator("#classify-output")).to_have_attribute("data-state", "error")
    error = api.post("/v1/classify", json={"model": "nli", "inputs": texts, "pairs": pairs[:1]}).json()["error"]
    assert page.inner_text("#error-message") == error["message"] and error["param"] == "pairs"


def test_embeddings_show_dimension_norms_first_values_and_cosine(page: Page, api: httpx.Client) -> None:
    choose(page, "emb", "embed")
    a, b = "A man is eating food.", "A man eats a meal."
    page.fill("#embed-input-a", a)
    page.fill("#embed-input-b", b)
    run_and_wait(page, "embed")
    data = api.post("/v1/embeddings", json={"model": "emb", "input": [a, b]}).json()["data"]
    va, vb = (torch.tensor(d["embedding"], dtype=torch.float64) for d in sorted(data, key=lambda d: d["index"]))
    assert page.inner_text("#embed-dimension") == str(len(va))
    assert float(page.inner_text("#embed-norm-a")) == pytest.approx(float(va.norm()), abs=1e-5)
    assert float(page.inner_text("#embed-norm-b")) == pytest.approx(float(vb.norm()), abs=1e-5)
    first = [float(x) for x in page.inner_text("#embed-first-a").split()]
    assert first == pytest.approx(va[:8].tolist(), abs=1e-5)
    cosine = float(va @ vb / (va.norm() * vb.norm()))
    assert float(page.inner_text("#embed-cosine")) == pytest.approx(cosine, abs=1e-5)
    assert page.evaluate("window.attnPage.embeddings[1]") == pytest.approx(vb.tolist(), abs=1e-6)

    page.fill("#embed-input-b", "")
    run_and_wait(page, "embed")
    assert page.locator("#embed-cosine").count() == 0


def test_encoder_decoder_attention_shows_self_and_cross_attention_per_head_and_mean(
    page: Page, api: httpx.Client
) -> None:
    choose(page, "mt", "attention")
    text = "God is love."
    page.fill("#attention-input", text)
    page.select_option("#attention-kind", "all")
    page.select_option("#attention-layer", "1")
    page.select_option("#attention-head", "2")
    run_and_wait(page, "attention")
    for k, kind in enumerate(["encoder", "decoder", "cross"]):
        answer = api.post("/v1/attention", json={"model": "mt", "text": text, "kind": kind, "layer": 1,
                                                 "head": 2}).json()
        weights = answer["weights"][0][0]
        i, j = len(answer["queries"]) - 1, len(answer["keys"]) // 2
        drawn = view(page, f"attention-heatmap-{k}", i, j)
        assert (drawn["rows"], drawn["cols"]) == (len(answer["queries"]), len(answer["keys"]))
        assert drawn["queries"] == answer["queries"] and drawn["keys"] == answer["keys"]
        assert drawn["value"] == pytest.approx(weights[i][j], abs=1e-5)
        lines = page.locator(f"#attention-lines-{k}")
        assert int(lines.get_attribute("data-rows")) == len(answer["queries"])
        assert int(lines.get_attribute("data-lines")) > 0
    target = api.post("/v1/attention", json={"model": "mt", "text": text, "kind": "cross", "layer": 1,
                                             "head": None}).json()["target"]
    assert target in page.inner_text("#attention-target")

    page.select_option("#attention-kind", "cross")
    page.select_option("#attention-head", "mean")
    expect(page.locator("#attention-heatmap-0")).to_have_attribute("data-head", "mean")
    expect(page.locator("#attention-output")).to_have_attribute("data-state", "done")
    heads = api.post("/v1/attention", json={"model": "mt", "text": text, "kind": "cross", "layer": 1,
                                            "head": None}).json()["weights"][0]
    drawn = view(page, "attention-heatmap-0", 0, 1)
    assert drawn["value"] == pytest.approx(sum(h[0][1] for h in heads) / len(heads), abs=1e-5)


def test_hovering_a_cell_names_its_query_key_and_weight(page: Page, api: httpx.Client) -> None:
    choose(page, "lm", "attention")
    page.fill("#attention-input", "ROMEO.")
    page.select_option("#attention-head", "0")
    run_and_wait(page, "attention")
    answer = api.post("/v1/attention", json={"model": "lm", "text": "ROMEO.", "kind": "self", "layer": 0,
                                             "head": 0}).json()
    canvas = page.locator("#attention-heatmap-0")
    box = canvas.bounding_box()
    rows, cols = int(canvas.get_attribute("data-rows")), int(canvas.get_attribute("data-cols"))
    assert (rows, cols) == (len(answer["queries"]), len(answer["keys"]))
    left, top, cell = (float(canvas.get_attribute(f"data-{name}")) for name in ("left", "top", "cell"))
    page.mouse.move(box["x"] + left + (cols - 0.5) * cell, box["y"] + top + (rows - 0.5) * cell)  # the last cell
    hover = page.locator("#attention-heatmap-0-hover")
    expect(hover).to_have_attribute("data-query", str(rows - 1))
    assert hover.get_attribute("data-key") == str(cols - 1)
    assert float(hover.get_attribute("data-value")) == pytest.approx(answer["weights"][0][0][-1][-1], abs=1e-5)
    assert answer["queries"][-1] in hover.inner_text()


def long_text_drawn(page: Page, model: str, text: str) -> tuple[float, Locator]:
    """Shows the attention of layer 1 on `text` (the mean over heads): the seconds the page took, and its heat map."""
    choose(page, model, "attention")
    page.fill("#attention-input", text)
    page.select_option("#attention-layer", "1")
    started = time.monotonic()
    run_and_wait(page, "attention", timeout=120_000)
    return time.monotonic() - started, page.locator("#attention-heatmap-0")


def test_attention_over_600_tokens_is_drawn_on_canvas_quickly(page: Page, api: httpx.Client) -> None:
    seconds, canvas = long_text_drawn(page, "lm", LONG_PROMPT)
    rows, cols = int(canvas.get_attribute("data-rows")), int(canvas.get_attribute("data-cols"))
    assert rows >= 512 and cols >= 512
    assert page.locator("#attention-output table").count() == 0
    assert page.evaluate("document.querySelectorAll('*').length") < 1000  # no node per cell (that would be 360k)
    # generous bounds for a shared 2-core machine: the drawing itself, and the whole round trip
    assert float(canvas.get_attribute("data-draw-ms")) < 3000
    assert seconds < 60
    answer = api.post("/v1/attention", json={"model": "lm", "text": LONG_PROMPT, "kind": "self", "layer": 1,
                                             "head": None}).json()
    heads = answer["weights"][0]
    i, j = rows - 1, cols // 3
    drawn = view(page, "attention-heatmap-0", i, j)
    assert drawn["value"] == pytest.approx(sum(h[i][j] for h in heads) / len(heads), abs=1e-5)


def test_an_api_error_is_shown_with_its_message_type_code_and_param(page: Page, api: httpx.Client) -> None:
    choose(page, "lm", "generate")
    page.fill("#prompt", "x" * 1100)  # longer than the model's 1024 positions
    page.click("#generate-run")
    expect(page.locator("#generate-output")).to_have_attribute("data-state", "error")
    response = api.post("/v1/completions", json={"model": "lm", "prompt": "x" * 1100, "stream": True})
    error = response.json()["error"]
    assert page.inner_text("#error-message") == error["message"]
    meta = page.inner_text("#error-meta")
    assert error["type"] in meta and f"HTTP {error['code']}" in meta
    assert (error["param"] or "") in meta

    choose(page, "cls", "classify")
    page.fill("#classify-input", "")
    page.click("#classify-run")
    expect(page.locator("#classify-output")).to_have_attribute("data-state", "error")
    error = api.post("/v1/classify", json={"model": "cls", "inputs": [], "pairs": None}).json()["error"]
    assert page.inner_text("#error-message") == error["message"] and error["code"] == 422
    page.fill("#classify-input", "In the beginning")
    run_and_wait(page, "classify")
    assert not page.locator("#error").is_visible()  # a good request clears the error


def test_a_stopped_stream_keeps_what_came(page: Page) -> None:
    choose(page, "lm", "generate")
    page.fill("#prompt", "ROMEO.")
    page.fill("#max-tokens", "1000")
    page.fill("#temperature", "0")
    page.click("#generate-run")
    expect(page.locator("#generate-output")).not_to_have_attribute("data-chunks", "0")
    page.click("#generate-cancel")
    expect(page.locator("#generate-status")).to_contain_text("stopped")
    assert 0 < len(page.inner_text("#completion")) < 1000 - len("ROMEO.")
    assert not page.locator("#error").is_visible()


def pixel(page: Page, canvas_id: str, i: int, j: int) -> list[int]:
    """The RGB drawn at the centre of cell (i, j) of a heat map."""
    return page.evaluate(
        """([id, i, j]) => { const c = document.getElementById(id), d = c.dataset, r = window.devicePixelRatio || 1;
             const x = (Number(d.left) + (j + 0.5) * Number(d.cell)) * r, y = (Number(d.top) + (i + 0.5) * Number(d.cell)) * r;
             return Array.from(c.getContext("2d").getImageData(x, y, 1, 1).data.slice(0, 3)); }""",
        [canvas_id, i, j])


def test_colour_scale_and_line_threshold_follow_the_weights(page: Page, api: httpx.Client) -> None:
    choose(page, "emb", "attention")
    text = "In the beginning"
    page.fill("#attention-input", text)
    page.select_option("#attention-head", "3")
    page.select_option("#attention-scale", "unit")
    run_and_wait(page, "attention")
    weights = api.post("/v1/attention", json={"model": "emb", "text": text, "kind": "self", "layer": 0,
                                              "head": 3}).json()["weights"][0][0]
    colour = "t => window.attnPage.colour(t)"
    for i, j in [(0, 0), (2, 5), (len(weights) - 1, 1)]:
        assert pixel(page, "attention-heatmap-0", i, j) == page.evaluate(colour, weights[i][j])
    page.select_option("#attention-scale", "row")
    expect(page.locator("#attention-output")).to_have_attribute("data-state", "done")
    i, j = 2, 5
    assert pixel(page, "attention-heatmap-0", i, j) == page.evaluate(colour, weights[i][j] / max(weights[i]))

    peak = max(max(row) for row in weights)
    for threshold in ("0.05", "0.3"):
        page.fill("#lines-threshold", threshold)
        page.dispatch_event("#lines-threshold", "change")
        expected = sum(w / peak >= float(threshold) for row in weights for w in row)
        expect(page.locator("#attention-lines-0")).to_have_attribute("data-lines", str(expected))
    lines = page.locator("#attention-lines-0")
    box = lines.bounding_box()
    step = (box["height"] - 10) / len(weights)
    page.mouse.move(box["x"] + 20, box["y"] + 5 + 2.5 * step)  # query 2, on the left
    expect(lines).to_have_attribute("data-lines", str(sum(w / peak >= 0.3 for w in weights[2])))


def test_arrow_keys_move_between_the_models_tabs(page: Page) -> None:
    page.select_option("#model", "cls")
    page.focus("#tab-classify")
    page.click("#tab-classify")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#tab-embed")).to_have_attribute("aria-selected", "true")
    assert page.locator("#panel-embed").is_visible() and not page.locator("#panel-classify").is_visible()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")  # past the last tab, back to the first
    expect(page.locator("#tab-classify")).to_have_attribute("aria-selected", "true")


# ---------------------------------------------------------------- grouped-query attention, long texts, chat

GQA_GROUPS = ["kv head 0: query heads 0..2", "kv head 1: query heads 3..5", "kv head 2: query heads 6..8"]
LONG_CHAT_TEXT = " ".join(CHAT_TEXTS * 25)  # 1,200+ tokens of the chat models' tokenizer


def head_picker(page: Page, select: str) -> list[list]:
    """The options of a head picker as [group label, option values]; "" labels an option outside a group."""
    return page.eval_on_selector(select, """s => [...s.children].map(c => c.tagName === "OPTGROUP"
        ? [c.label, [...c.children].map(o => o.value)] : ["", [c.value]])""")


def test_grouped_query_heads_are_picked_and_shown_by_the_key_value_head_they_share(page: Page,
                                                                                 api: httpx.Client) -> None:
    card = next(m for m in api.get("/v1/models").json()["data"] if m["id"] == "gqa")
    assert (card["heads"], card["kv_heads"], card["head_groups"]) == (9, 3, [0, 0, 0, 1, 1, 1, 2, 2, 2])
    choose(page, "gqa", "attention")
    assert "9 heads sharing 3 key/value heads" in page.inner_text("#model-info")
    expected = [["", ["mean"]], *[[label, [str(h) for h in range(3 * g, 3 * g + 3)]] for g, label in
                                  enumerate(GQA_GROUPS)]]
    for select in ("#attention-head", "#generate-attention-head", "#chat-attention-head"):
        assert head_picker(page, select) == expected

    text = CHAT_TEXTS[2]
    page.fill("#attention-input", text)
    page.select_option("#attention-layer", "1")
    page.select_option("#attention-head", "4")
    run_and_wait(page, "attention")
    groups = page.locator("#attention-heads-0 .head-group")
    assert groups.locator("h4").all_inner_texts() == GQA_GROUPS
    assert [groups.nth(g).get_attribute("data-heads") for g in range(3)] == ["0,1,2", "3,4,5", "6,7,8"]
    assert page.get_attribute("#attention-heads-0 [aria-pressed=true]", "data-head") == "4"
    assert "head 4 (shares kv head 1)" in page.inner_text("#attention-output h3")
    pooled = api.post("/v1/attention", json={"model": "gqa", "text": text, "layer": 1, "pool": 96}).json()
    assert pooled["groups"] == card["head_groups"]
    for h in (0, 4, 8):
        rows, cols = len(pooled["weights"][0][h]), len(pooled["weights"][0][h][0])
        drawn = page.evaluate("([id, i, j]) => { const v = window.attnPage.views[id]; return [v.rows, v.cols, "
                              "v.group, v.value(i, j)]; }", [f"attention-heads-0-{h}", rows - 1, 0])
        assert drawn[:3] == [rows, cols, h // 3]
        assert drawn[3] == pytest.approx(pooled["weights"][0][h][rows - 1][0], abs=1e-5)

    page.click("#attention-heads-0 [data-head='7']")  # a small multiple shows its head
    expect(page.locator("#attention-heatmap-0")).to_have_attribute("data-head", "7")
    expect(page.locator("#attention-output")).to_have_attribute("data-state", "done")
    assert page.input_value("#attention-head") == "7"
    one = api.post("/v1/attention", json={"model": "gqa", "text": text, "layer": 1, "head": 7}).json()["weights"][0][0]
    i = len(one) - 1
    assert view(page, "attention-heatmap-0", i, 1)["value"] == pytest.approx(one[i][1], abs=1e-5)

    choose(page, "chat", "attention")  # a model without grouped-query attention looks as it did
    assert head_picker(page, "#attention-head") == [["", [v]] for v in ["mean", "0", "1", "2", "3"]]
    run_and_wait(page, "attention")
    assert page.locator("#attention-heads-0").count() == 0


def test_a_1200_token_text_is_drawn_in_seconds_from_answers_of_bounded_size(page: Page, api: httpx.Client) -> None:
    answers: list = []
    page.on("response", lambda r: answers.append(r) if r.url.endswith("/v1/attention") else None)
    seconds, canvas = long_text_drawn(page, "gqa", LONG_CHAT_TEXT)
    tokens = int(canvas.get_attribute("data-rows"))
    assert tokens >= 1200 and int(canvas.get_attribute("data-cols")) == tokens
    sizes = [len(r.body()) for r in answers]
    # one map at two bytes a weight (8/3 characters of base64) and the small multiples, pooled: never the dense
    # floats of every layer and head (2 x 9 x T x T numbers, some 230 MB)
    assert len(sizes) == 2 and sizes[0] < 8 / 3 * tokens**2 + 100 * tokens and sizes[1] < 500_000, sizes
    drawing = [float(c.get_attribute("data-draw-ms")) for c in page.locator("canvas.heatmap").all()]
    print(f"\n{tokens} tokens: answers {sizes} bytes, page done in {seconds:.1f} s, heat map drawn in "
          f"{drawing[0]:.0f} ms, load {os.getloadavg()[0]:.1f}")
    assert drawing[0] < 3000 and seconds < 60  # generous bounds for a shared 2-core machine
    assert page.evaluate("document.querySelectorAll('*').length") < 1000  # no node per cell (that would be 1.4M)
    full = api.post("/v1/attention", json={"model": "gqa", "text": LONG_CHAT_TEXT, "layer": 1, "head": "mean"}).json()
    i, j = tokens - 1, tokens // 3
    assert view(page, "attention-heatmap-0", i, j)["value"] == pytest.approx(full["weights"][0][0][i][j], abs=1e-5)


def test_a_chat_answer_s_attention_is_followed_token_by_token(page: Page, api: httpx.Client) -> None:
    choose(page, "gqa", "chat")
    page.check("#chat-follow-attention")
    page.select_option("#chat-attention-layer", "1")
    page.select_option("#chat-attention-head", "4")
    page.fill("#chat-max-tokens", "16")
    page.fill("#chat-input", CHAT_TEXTS[3])
    page.evaluate("""() => { window.stepCounts = [];
        new MutationObserver(() => window.stepCounts.push(Number(document.getElementById("chat-attention-box")
          .dataset.steps))).observe(document.getElementById("chat-attention-box"),
                                    { attributes: true, attributeFilter: ["data-steps"] }); }""")
    run_and_wait(page, "chat")
    body = {"model": "gqa", "messages": [{"role": "user", "content": CHAT_TEXTS[3]}], "temperature": 0,
            "max_completion_tokens": 16, "stream": True, "attention": {"layer": 1, "head": 4}}
    with api.stream("POST", "/v1/chat/completions", json=body) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    steps = [c["attention"] for c in chunks]
    assert len(steps) == len(chunks) > 1
    counts = [n for n in page.evaluate("window.stepCounts") if n]
    assert counts == list(range(1, len(steps) + 1))  # the panel counted every token as it came
    assert page.inner_text("#chat-output .message.assistant .text") == "".join(
        c["choices"][0]["delta"]["content"] for c in chunks)
    assert page.evaluate("window.attnPage.chatAttention") == steps
    last = len(steps) - 1
    drawn = view(page, "chat-attention", last, len(steps[last]["keys"]) - 1)
    assert (drawn["rows"], drawn["cols"]) == (len(steps), len(steps[last]["keys"]))
    assert drawn["queries"] == [s["token"] for s in steps] and drawn["keys"] == steps[last]["keys"]
    assert drawn["value"] == pytest.approx(steps[last]["weights"][-1], abs=1e-6)
    strip = page.eval_on_selector_all("#chat-attention-strip span", "ss => ss.map(s => Number(s.dataset.weight))")
    assert strip == pytest.approx(steps[last]["weights"], abs=1e-6)  # the newest token's weights, key by key
    assert steps[last]["keys"][0] == "<|im_start|>"  # the keys are the conversation as the template wrote it

    page.uncheck("#chat-follow-attention")  # the next answer comes without attention, and no panel
    page.fill("#chat-input", "Hi")
    run_and_wait(page, "chat")
    expect(page.locator("#chat-attention-box")).to_be_hidden()


def test_a_server_with_a_key_gets_it_from_a_prompt_kept_in_memory_only(browser: Browser, checkpoints: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    key = "page-test-key"
    answers = iter(["a-wrong-key", key])  # the first one typed is refused: the page asks again
    asked: list[str] = []
    sent: list[str | None] = []
    with _serving({"lm": checkpoints["lm"]}, tmp_path / "serve.log", {"ATTN_API_KEY": key}) as base:
        context = browser.new_context()
        tab = context.new_page()
        tab.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept(next(answers))))
        tab.on("request", lambda request: sent.append(request.headers.get("authorization"))
               if "/v1/" in request.url else None)
        tab.goto(f"{base}/")
        expect(tab.locator("body")).to_have_attribute("data-ready", "true")
        choose(tab, "lm", "generate")
        tab.fill("#max-tokens", "4")
        run_and_wait(tab, "generate")
        stored = tab.evaluate("() => [localStorage.length, sessionStorage.length, document.cookie]")
        cookies = context.cookies()
        context.close()
    assert asked == ["This server needs an API key:", "The server refused that key. API key:"]
    # /v1/models refused twice, then it and the completion with the key
    assert sent == [None, "Bearer a-wrong-key", f"Bearer {key}", f"Bearer {key}"]
    assert stored == [0, 0, ""] and cookies == []
