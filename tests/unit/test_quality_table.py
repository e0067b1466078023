"""README's quality table is generated from the stored results files: medians, ranges, markers."""

import pytest

from benchmarks.quality import END, ROOT, START, figure, load_results, rewrite_readme, table


def result(recipe, transcribed=False, recorded="2026-11-27T12:00:00+00:00", **metrics):
    run = {"recipe": recipe, "recorded": recorded, "machine": {"device": "AMD EPYC, 2 logical CPUs", "cpu_capability": "AVX2"},
           "metrics": metrics}
    return {**run, "transcribed_from": "a log"} if transcribed else run


def test_a_figure_is_the_median_with_its_range_when_there_are_several_runs():
    assert figure([14.28]) == "14.28"
    assert figure([13.1, 14.28, 13.9]) == "13.9 (13.1-14.28, 3 runs)"


def test_the_table_has_a_row_per_recipe_with_results_and_marks_transcribed_figures():
    text = table({"quickstart-lm": [result("quickstart-lm", nats_per_char=2.1), result("quickstart-lm", nats_per_char=2.2)],
                  "fortunes-minilm": [result("fortunes-minilm", True, accuracy=80.5, macro_f1=76.2)]})
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 2
    assert "| 2.5 min |" in rows[0] and "**2.15 (2.1-2.2, 2 runs)** |" in rows[0] and "AMD EPYC, 2 logical CPUs, AVX2" in rows[0]
    assert "**80.5 / 76.2**†" in rows[1] and "after 10 min" in rows[1]


def test_runs_recorded_before_a_recipe_changed_leave_the_table():
    runs = [result("shakespeare-char-12min", recorded="2026-11-27T12:11:04+00:00", nats_per_char=1.47),
            result("shakespeare-char-12min", recorded="20261123T081053", nats_per_char=1.5075),
            result("shakespeare-char-12min", recorded="2026-11-27T14:50:00+00:00", nats_per_char=1.4247)]
    text = table({"shakespeare-char-12min": runs})
    assert "**1.4247** |" in text and "1.47 " not in text and "**1.47**" not in text and "1.5075" not in text


def test_the_readme_is_rewritten_between_its_markers_only():
    readme = f"intro\n{START}\nold table\n{END}\nrest\n"
    new = rewrite_readme(readme, {"quickstart-lm": [result("quickstart-lm", nats_per_char=2.1)]})
    assert new.startswith(f"intro\n{START}\n| task |") and new.endswith(f"{END}\nrest\n") and "old table" not in new
    with pytest.raises(SystemExit, match="lacks the markers"):
        rewrite_readme("no markers", {})


def test_the_readmes_table_is_the_one_the_stored_results_give():
    """README's table cannot go stale: it is what `python -m benchmarks.quality table` writes from the files."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert rewrite_readme(readme, load_results()) == readme, "run python -m benchmarks.quality table"
