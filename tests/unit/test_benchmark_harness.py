"""The benchmark harness refuses to time contenders that do not compute the same thing."""

import dataclasses
import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from attn.core.presets import preset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, where benchmarks/ lies
from benchmarks.engines import agreement
from benchmarks.harness import ContendersDisagree, require_same, rows_against
from benchmarks.quickstart import RepeatedBatch, full_batch, step_flops


def test_equal_outputs_pass():
    require_same("beam=4", {"attn": [([5, 6], True), ([7], False)], "HF generate": [([5, 6], True), ([7], False)]})


def test_a_different_row_fails_the_case_and_names_it():
    outputs = {"attn": [[1, 2], [3, 4], [5]], "HF generate": [[1, 2], [3, 9], [5]]}
    with pytest.raises(ContendersDisagree, match=r"B=8: HF generate and attn differ at row 1 \(1 rows differ\): "
                                                 r"attn \[3, 4\], HF generate \[3, 9\]"):
        require_same("B=8", outputs)


def test_a_missing_row_or_a_different_finish_fails_the_case():
    with pytest.raises(ContendersDisagree, match=r"at row 1 .*HF generate \(no such row\)"):
        require_same("s", {"attn": [[1], [2]], "HF generate": [[1]]})
    with pytest.raises(ContendersDisagree, match="at row 0"):
        require_same("s", {"attn": [([1, 2], True)], "HF generate": [([1, 2], False)]})


def test_case_3_fails_when_our_beam_search_returns_other_hypotheses(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    import torch

    from benchmarks import generation
    from benchmarks.harness import Settings

    real = generation.beam_search_seq2seq

    def off_by_one(*args, **kwargs):  # the last source's best hypothesis loses its last token
        found = real(*args, **kwargs)
        best = found[-1][0]
        found[-1][0] = dataclasses.replace(best, tokens=best.tokens[:-1])
        return found

    monkeypatch.setattr(generation, "beam_search_seq2seq", off_by_one)
    settings = Settings(torch.device("cpu"), torch.float32, 1, False, True, 0, 1, tmp_path, tmp_path / "plot.png")
    with pytest.raises(ContendersDisagree, match="marian-base-tiny beam=4 .* eos\\+0: HF generate and attn differ at row 7"):
        generation.beam(settings)


def test_agreement_counts_the_reference_tokens_before_each_rows_first_difference():
    """Case 10's notes: after a first different token, greedy or beam outputs no longer compare token for token."""
    found = agreement([[1, 2, 3, 4], [5, 6], [7, 8]], [[1, 2, 9, 4], [5, 6], [0, 8]])
    assert found == {"identical": "1/3", "same tokens %": 100 * (2 + 2 + 0) / 8}


def test_rows_against_divides_by_the_reference_and_keeps_a_contender_that_did_not_run():
    values = {"attn fp32": [4.0, 6.0, 5.0], "transformers fp32": [2.0], "llama.cpp": []}
    rows = rows_against("B=8", "tokens/s", values, "transformers fp32")
    assert [(row.contender, row.ratio) for row in rows] == [("attn fp32", 2.5), ("transformers fp32", 1.0),
                                                            ("llama.cpp", None)]
    assert rows[2].to_dict()["median"] is None


BENCHMARKS = sorted(path.stem for path in (Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("module", BENCHMARKS)
def test_every_benchmark_imports(module):
    """A benchmark is run by hand, never by CI: this keeps a library change from breaking one unseen."""
    importlib.import_module(f"benchmarks.{module}")


def test_case_8_counts_the_flops_of_a_masked_translation_batch():
    """Case 8's MFU needs the model's FLOPs on the recipe's batch, whose masks the model reads on the host."""
    config = preset("paper-base").tiny()
    rows, source, target = 2, 5, 4
    batch = full_batch("translation", (rows, source, target), config)
    trainer = SimpleNamespace(task=SimpleNamespace(model_config=config, train=RepeatedBatch(batch), head="forward"))
    d, d_ff = config.d_model, config.d_ff
    # The weight matrices alone, forward (2 per multiply-add) and backward (twice that).
    encoder = config.encoder_layers * rows * source * (4 * d * d + 2 * d * d_ff + 2 * d * d)  # + cross K, V
    decoder = config.decoder_layers * rows * target * (6 * d * d + 2 * d * d_ff)
    output = rows * target * d * config.vocab_size
    assert step_flops(trainer) >= 3 * 2 * (encoder + decoder + output)


def test_the_profile_with_peers_bounds_attns_ratio_by_its_matmul_time(capsys):
    """`--peers` profiles case 8's peer at the recipe's shape; attn's step without everything but its
    matmuls is faster than the step itself, so the bound is above the measured ratio."""
    pytest.importorskip("transformers")
    import re

    from benchmarks.quickstart import main

    assert main(["--recipes", "lm", "--peers", "--threads", "1", "--steps", "1", "--pad-batches", "0"]) == 0
    out = capsys.readouterr().out
    attn_ms = float(re.search(r"## lm: ([\d.]+) ms/step", out).group(1))
    matmul_ms = float(re.search(r"^  matmul +([\d.]+) ms", out, re.MULTILINE).group(1))
    found = re.search(r"HF GPT2LMHeadModel: ([\d.]+) ms/step, matmul ([\d.]+) ms; attn / peer ([\d.]+), "
                      r"and ([\d.]+) if attn's step were its matmuls alone", out)
    peer_ms, peer_matmul, ratio, bound = map(float, found.groups())
    assert 0 < matmul_ms < attn_ms and 0 < peer_matmul < peer_ms
    assert ratio == pytest.approx(peer_ms / attn_ms, abs=0.01)
    assert bound == pytest.approx(peer_ms / matmul_ms, abs=0.01) and bound > ratio
