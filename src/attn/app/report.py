"""The quickstart's report: loss curves, a cross-attention heat map and an `index.html` of it all."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attn.inference.attention_views import attention_of
from attn.app.plots import plot_attention, plot_run
from attn.artifacts import load_model

HEATMAP_VERSE = "For God so loved the world, that he gave his only born Son."


def write_report(root: Path, reports: Sequence[Any]) -> Path:
    """Draws every run's curves and one translated verse's cross-attention; writes root/index.html."""
    sections = []
    for report in reports:
        images = [p.relative_to(root) for p in plot_run(report.run_dir)]
        if report.name == "translation":
            view = attention_of(load_model(report.run_dir), HEATMAP_VERSE, "cross", -1, None)
            heatmap = plot_attention(view.weights, view.queries, view.keys, view.title, root / "cross_attention.png")
            images.append(heatmap.relative_to(root))
        sections.append(_section(report, images))
    index = root / "index.html"
    index.write_text(_page(sections), encoding="utf-8")
    return index


def _section(report: Any, images: Sequence[Path]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>"
        for k, v in report.metrics.items() if not isinstance(v, (list, dict))
    )
    pictures = "".join(f'<figure><img src="{html.escape(str(p))}" alt="{html.escape(p.stem)}">'
                       f"<figcaption>{html.escape(p.stem)}</figcaption></figure>" for p in images)
    samples = "".join(f"<pre>{html.escape(s)}</pre>" for s in report.samples)
    return (f"<section><h2>{html.escape(report.name)}</h2><p>trained for {report.train_seconds / 60:.1f} minutes; "
            f"checkpoints in <code>{html.escape(str(report.run_dir))}</code></p><table>{rows}</table>"
            f"{samples}{pictures}</section>")


def _page(sections: Sequence[str]) -> str:
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}img{max-width:520px}"
             "figure{display:inline-block;margin:.5em}td{padding:2px 12px}pre{background:#f4f4f4;padding:.5em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>attn quickstart</title>"
            f"<style>{style}</style></head><body><h1>attn quickstart</h1>{''.join(sections)}</body></html>")
