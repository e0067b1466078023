"""Training-curve figures from metrics.jsonl."""

import json

import pytest

from attn.app.plots import plot_run
from attn.core.errors import AttnError

PNG = b"\x89PNG\r\n\x1a\n"


def write_metrics(run_dir, records):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 9, "lo')


def test_draws_loss_lr_and_validation_curves(tmp_path):
    records = [{"step": s, "loss": 5.0 / s, "lr": 1e-3 * s} for s in range(1, 9)]
    records += [{"step": 4, "val_loss": 2.0, "val_accuracy": 0.4}, {"step": 8, "val_loss": 1.5, "val_accuracy": 0.5}]
    write_metrics(tmp_path, records)
    paths = plot_run(tmp_path)
    assert [p.name for p in paths] == ["loss.png", "lr.png", "validation.png"]
    assert all(p.parent == tmp_path / "plots" and p.read_bytes().startswith(PNG) for p in paths)
    assert all(p.stat().st_size > 5000 for p in paths)


def test_without_validation_there_is_no_validation_figure(tmp_path):
    write_metrics(tmp_path, [{"step": 1, "loss": 3.0, "lr": 0.1}, {"step": 2, "skipped": "loss"}])
    assert [p.name for p in plot_run(tmp_path, tmp_path / "figures")] == ["loss.png", "lr.png"]


def test_a_run_without_metrics_is_an_error(tmp_path):
    with pytest.raises(AttnError, match="metrics.jsonl: no such file"):
        plot_run(tmp_path)


def test_read_metrics_keeps_the_json_objects_and_skips_torn_or_foreign_lines(tmp_path):
    from attn.training.logs import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.5}\n7\n\xff\xfe not utf-8\n{"step": 2, "loss": 2.0}\n{"step": 3, "lo')
    assert read_metrics(path) == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.0}]
