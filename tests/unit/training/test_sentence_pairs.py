"""Sentence pairs and named fields end to end: a pair classifier trained from a CSV file, used and
evaluated on pairs; a translator trained Spanish -> English evaluated in that direction; where a
checkpoint's fields come from."""

import csv
import io
import json
from pathlib import Path

import pytest
import torch

from attn.inference.classification import classify
from attn.app.cli import main
from attn.app.runs import run_config, train
from attn.app.tasks import get_task
from attn.app.tasks.registry import evaluate
from attn.app.tasks.spec import EvalOptions
from attn.artifacts import load_model
from attn.artifacts.checkpoint import write_checkpoint
from attn.data.readers import Fields
from attn.data.tokenizers import Tokenizer
from attn.core.errors import AttnError, CheckpointError, ConfigError
from attn.models import build_model
from attn.core.presets import preset
from attn.training.runconfig import RunConfig
from attn.training.task_data import TaskContext

# Does the hypothesis follow from the premise? Commas and quotes exercise the CSV reader.
PAIRS = [
    ("A dog runs, fast.", "An animal moves.", "entailment"),
    ("A dog runs, fast.", "The dog sleeps.", "contradiction"),
    ("Two men talk.", 'People say "hello".', "entailment"),
    ("Two men talk.", "Nobody speaks.", "contradiction"),
    ("It rains.", "The street is wet.", "entailment"),
    ("It rains.", "The sky is dry.", "contradiction"),
]
ONE_STEP = ("train.max_steps=3", "train.eval_interval=0", "train.checkpoint_interval=0", "train.quiet=true",
            "train.device=cpu")


def _write_csv(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["premise", "hypothesis", "gold"])
    writer.writerows(rows)
    path.write_text(out.getvalue(), encoding="utf-8")
    return path


def _pair_config(tmp_path: Path, *overrides: str) -> RunConfig:
    train_file = _write_csv(tmp_path / "train.csv", PAIRS * 2)
    valid_file = _write_csv(tmp_path / "valid.csv", [("ab", "c", "entailment")])
    return run_config({"task": "classification"}).override(
        f"run_dir={tmp_path / 'run'}", f"data.train={train_file}", f"data.valid={valid_file}",
        "data.text_field=premise", "data.text_pair_field=hypothesis", "data.label_field=gold",
        "tokenizer.kind=chars", "model.preset=bert-base-tiny", "batch.batch_size=4", "optim.warmup_steps=0", *overrides,
    )


def test_pair_inputs_have_bert_segment_ids(tmp_path: Path) -> None:
    config = _pair_config(tmp_path)
    task = get_task("classification").build(config, preset("bert-base-tiny"), TaskContext())
    (batch,) = task.valid()
    tokens, mask, segments = batch.inputs
    tok = task.tokenizer
    a, b, c = (tok.encode(ch) for ch in "abc")
    # "ab" / "c" by hand: [CLS] a b [SEP] c [SEP], the first four in segment 0, the last two in segment 1.
    assert tokens.tolist() == [[tok.cls_id, *a, *b, tok.sep_id, *c, tok.sep_id]]
    assert segments.tolist() == [[0, 0, 0, 0, 1, 1]] and mask.all()
    assert task.info["fields"]["text_pair_field"] == "hypothesis"
    train_batch = task.train.next_batch()
    assert len(train_batch.inputs) == 3 and train_batch.inputs[2].shape == train_batch.inputs[0].shape


def test_pair_classifier_trains_from_csv_and_classifies_pairs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = _pair_config(tmp_path, *ONE_STEP)
    torch.manual_seed(0)
    result = train(config)
    assert result.step == 3 and all(torch.isfinite(torch.tensor(result.losses)))
    bundle = load_model(result.run_dir, "cpu")
    assert (bundle.fields.text_field, bundle.fields.text_pair_field) == ("premise", "hypothesis")
    predictions = classify(bundle, ["A dog runs.", "It rains."], pairs=["An animal moves.", "The sky is dry."])
    assert [p.label in ("contradiction", "entailment") for p in predictions] == [True, True]
    assert all(abs(sum(p.probabilities.values()) - 1) < 1e-5 for p in predictions)
    with pytest.raises(AttnError, match="classifies sentence pairs \\(premise, hypothesis\\); give the second text"):
        classify(bundle, ["A dog runs."])
    scores = evaluate(bundle, tmp_path / "train.csv")  # read with the model's own fields: premise, hypothesis, gold
    assert scores["examples"] == 12 and sum(map(sum, scores["confusion_matrix"])) == 12
    # The command line takes a pair as TEXT<TAB>PAIR.
    capsys.readouterr()
    assert main(["classify", "--model", str(result.run_dir), "--json", "It rains.\tThe street is wet."]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert shown["text"] == "It rains.\tThe street is wet." and shown["label"] in ("contradiction", "entailment")
    assert main(["classify", "--model", str(result.run_dir), "It rains."]) == 1
    assert "input 1 has no tab" in capsys.readouterr().err


def test_pairs_need_segment_embeddings(tmp_path: Path) -> None:
    config = _pair_config(tmp_path)
    with pytest.raises(ConfigError, match="model.type_vocab_size: is 0, but sentence pairs"):
        get_task("classification").build(config, preset("bert-base-tiny").replace(type_vocab_size=0), TaskContext())


def test_translator_trained_spanish_to_english_is_evaluated_that_way(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"en": "In the beginning.", "es": "En el principio."}, {"en": "Let there be light.", "es": "Sea la luz."}]
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows * 4), encoding="utf-8")
    config = run_config({"task": "translation"}).override(
        f"run_dir={tmp_path / 'run'}", f"data.train={pairs}", "data.source_field=es",
        "data.target_field=en", "tokenizer.kind=chars", "model.preset=paper-base-tiny", "batch.max_tokens=512",
        *ONE_STEP,
    )
    result = train(config)
    bundle = load_model(result.run_dir, "cpu")
    assert (bundle.fields.source_field, bundle.fields.target_field) == ("es", "en")
    scores = evaluate(bundle, pairs, EvalOptions(limit=2))
    assert [e["source"] for e in scores["examples"]] == ["En el principio.", "Sea la luz."]
    assert [e["reference"] for e in scores["examples"]] == ["In the beginning.", "Let there be light."]


def test_fields_of_a_checkpoint_come_from_task_json_else_the_run_config(tmp_path: Path) -> None:
    tokenizer = Tokenizer.train_chars(["abc"])
    config = preset("paper-base-tiny").replace(vocab_size=tokenizer.vocab_size)
    model = build_model(config)
    tables = RunConfig().override("data.source_field=es", "data.target_field=en").to_dict()
    write_checkpoint(tmp_path / "plain", model, config, tables, None, tokenizer, {"task": "translation"})
    assert load_model(tmp_path / "plain", "cpu").fields == Fields(source_field="es", target_field="en")
    recorded = {"task": "translation", "fields": Fields(source_field="de").to_dict()}
    write_checkpoint(tmp_path / "recorded", model, config, tables, None, tokenizer, recorded)
    bundle = load_model(tmp_path / "recorded", "cpu")
    assert bundle.fields == Fields(source_field="de") and bundle.task_info()["fields"]["source_field"] == "de"
    write_checkpoint(tmp_path / "bare", model, config, None, None, tokenizer, {"task": "translation"})
    assert load_model(tmp_path / "bare", "cpu").fields == Fields()
    broken = {"task": "translation", "fields": {"format": "xml"}}
    write_checkpoint(tmp_path / "broken", model, config, None, None, tokenizer, broken)
    with pytest.raises(CheckpointError, match="task.json or run_config.json has a bad data setting .*format"):
        load_model(tmp_path / "broken", "cpu")
