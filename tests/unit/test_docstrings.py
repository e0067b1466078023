"""The source's docstrings and comments say what the code does and why, and leave measurements to the results.

A timing, a speed-up, a measured size, the machine a run was on, a commit or a model's quoted answer goes
stale with the next change; the figures live under benchmarks/results/, which a docstring cites instead.
Doctest examples are left out: they run, so their figures cannot go stale.
"""

import io
import re
import textwrap
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "attn"

_NUMBER = r"\d+(?:[.,]\d+)*(?:\s?-\s?\d+(?:[.,]\d+)*)?"  # 12, 1,900, 0.83, 790-830
FIGURES = {
    "a time": rf"\b{_NUMBER}\s?(?:ms|µs|us|ns)\b|\b{_NUMBER}\s(?:s|secs?|seconds?|mins?|minutes?|hours?)\b",
    "a rate": rf"\b{_NUMBER}\s?(?:[a-z]+/s\b|(?:tokens|sentences|requests|steps|updates) (?:a|per) second\b)",
    "a speed ratio": r"\b\d+(?:\.\d+)?[x×](?!\w)",
    "a speed in %": r"\d\s?%[^.;\n]{0,40}\b(?:faster|slower|shorter|longer|quicker|speed)",
    "a measured size": rf"\b{_NUMBER}\s?[kKMGT]B\b|\b\d+\.\d+\s?[KMGT]iB\b",
    "a machine": r"\b(?:EPYC|Xeon|Ryzen|Threadripper|Graviton|H100|H200|A100|V100|Apple M\d)\b",
    "a commit": r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b",
    "a quoted answer": r"\b(?:answered|replied|generated|translated)\b[^\n\"]{0,80}\"[^\"\n]{3,}",
}
_FIGURE = re.compile("|".join(f"(?P<f{i}>{pattern})" for i, pattern in enumerate(FIGURES.values())))
_KINDS = list(FIGURES)


def prose_lines(source: str) -> list[tuple[int, str]]:
    """(line number, text) of every comment and every string that stands alone as a statement (a docstring),
    without the lines of doctest examples and their expected output."""
    lines = []
    previous = tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            lines.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            lines += outside_examples(token.start[0], token.string.splitlines())
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    return lines


def outside_examples(first: int, text: list[str]) -> list[tuple[int, str]]:
    """The lines of a docstring that starts at line `first`, without its doctest examples: a `>>>` line, the
    `...` lines after it and its expected output, up to a blank line or the next `>>>`."""
    kept, in_example = [], False
    for number, line in enumerate(text, first):
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_example = True
        elif not stripped:
            in_example = False
        if not in_example:
            kept.append((number, line))
    return kept


def figures(source: str) -> list[tuple[int, str, str]]:
    """(line, kind, matched text) of each figure in the comments and docstrings of `source`."""
    return [(number, _KINDS[int(match.lastgroup[1:])], match.group(0))
            for number, line in prose_lines(source) for match in _FIGURE.finditer(line)]


def listed(root: Path) -> list[str]:
    """Each figure in the modules under `root` as "file:line: kind ('text')", the file relative to `root`."""
    return [f"{path.relative_to(root)}:{line}: {kind} ({text!r})"
            for path in sorted(root.rglob("*.py")) for line, kind, text in figures(path.read_text(encoding="utf-8"))]


def test_no_docstring_or_comment_in_src_quotes_a_measurement():
    found = listed(SRC)
    assert not found, ("say why without the figure, and cite the folder under benchmarks/results/ that holds it "
                       "(files under src/attn/):\n" + "\n".join(found))


def test_the_check_finds_each_kind_of_figure_and_says_where(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "packing.py").write_text(textwrap.dedent('''\
        """Packs the weights.

        A decode step took 72 ms against 83 ms (118.9 tokens/s), 1.2-2.1x faster and about 15 % shorter,
        19 MB as floats, on an AMD EPYC at 5dd5f0a; the model answered "What is it?" with "Paris, France".
        """

        STEPS = 8  # 1.76 s a step
        '''), encoding="utf-8")
    found = listed(tmp_path)
    assert {line.split(": ")[1].split(" (")[0] for line in found} == set(FIGURES)
    assert found[0] == "core/packing.py:3: a time ('72 ms')"
    assert found[-1] == "core/packing.py:7: a time ('1.76 s')"


def test_the_check_leaves_code_doctests_and_plain_numbers_alone():
    sample = textwrap.dedent('''\
        def scaled(x):
            """Scales by 0.2 x sqrt(n): a 100 x 100 matrix, 80% of the tokens, 32 MiB, byte 0x80, 1e-05.

            >>> scaled("the answer")
            'a pass runs at 0.68x the speed of fp32'
            """
            timeout_ms = 250  # the most a request may wait
            return f"{x} took 12 ms"
        ''')
    assert figures(sample) == []
