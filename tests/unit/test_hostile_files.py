"""Fuzzing the readers of downloaded files with hostile copies (`tests/hostile_files.py`), under a memory bound.

Each reader (safetensors weights of a Hugging Face folder and of an attn checkpoint, GGUF,
tokenizer.json, SentencePiece models, config.json) reads files drawn to break it, in a process of
its own whose address space is limited: every file must be read or refused with one `AttnError`
that names it, nothing may crash the process, and no file may raise the resident memory by more than
16 times its size plus a fixed allowance, measured per file (the peak is reset before each read). The CI set
reads `sum(CI.values())` files, two readers at a time (the machines have two cores); the slow set ten times as
many. Then one test per defect the fuzzing found, so that each stays fixed with a readable example.
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hostile_files import (
    MEMORY_ALLOWANCE,
    READERS,
    TEXT,
    Drawn,
    _hf_folder,
    _sentencepiece_model,
    _tiny_checkpoint_model,
)
from hypothesis import HealthCheck, Phase, given, settings

from attn.artifacts.checkpoint import load_weights
from attn.artifacts.pretrained.families import load_pretrained
from attn.data.tokenizers import Tokenizer
from attn.core.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]
CI = {"safetensors": 1500, "checkpoint-weights": 1500, "gguf": 1000, "gguf-sentencepiece": 500, "gguf-kept": 500,
      "tokenizer.json": 1500, "sentencepiece": 1500, "config.json": 2000}


def _fuzz(reader: str, examples: int) -> dict[str, int]:
    found = subprocess.run([sys.executable, str(ROOT / "tests" / "hostile_files.py"), reader, str(examples)],
                           capture_output=True, text=True, timeout=1200, check=False)
    assert found.returncode == 0, f"{reader}: status {found.returncode}\n{found.stderr[-6000:]}"
    return json.loads(found.stdout.splitlines()[-1])


def _fuzz_all(examples: dict[str, int]) -> None:
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(examples, pool.map(_fuzz, examples, examples.values())))
    for reader, seen in results.items():
        assert seen["files"] == examples[reader], (reader, seen)
        bound = seen["factor"] * seen["size"] + MEMORY_ALLOWANCE
        assert seen["grown"] <= bound, (f"{reader}: a file of {seen['size']:,} bytes made the process grow by "
                                        f"{seen['grown']:,} bytes, more than {bound:,}")


def test_hostile_files_are_refused_with_one_error_naming_them() -> None:
    assert sum(CI.values()) >= 10_000
    _fuzz_all(CI)


@pytest.mark.slow
def test_ten_times_as_many_hostile_files() -> None:
    _fuzz_all({reader: 10 * count for reader, count in CI.items()})


# -- the defects the fuzzing found ---------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _hf_folder(tmp_path_factory.mktemp("hf"), "gpt2", "gpt2-tiny")


def _config(folder: Path, **changes: object) -> Path:
    """Writes the folder's config.json as exported, with `changes`."""
    original = folder / "exported-config.json"
    if not original.exists():
        shutil.copy(folder / "config.json", original)
    config = json.loads(original.read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, **changes}), encoding="utf-8")
    return folder / "config.json"


@pytest.mark.parametrize("changes", [{"n_inner": 2**64 - 1}, {"n_inner": 2**40}, {"n_layer": 10**9},
                                     {"n_positions": 2**40}, {"vocab_size": 2**36}])
def test_a_config_far_larger_than_its_weights_is_refused_before_the_model_is_built(gpt2: Path, changes: dict) -> None:
    """Built first, such a model asked torch for 2**64 numbers (a TypeError) or for terabytes."""
    path = _config(gpt2, **changes)
    with pytest.raises(CheckpointError, match=f"^{path}: describes a model of at least .* numbers .* but the weights "
                                              "hold [0-9,]+; the config does not belong to these weights"):
        load_pretrained(gpt2)


def test_a_config_value_the_family_refuses_names_the_whole_path(gpt2: Path) -> None:
    path = _config(gpt2, activation_function=None)
    with pytest.raises(CheckpointError, match=f"^{path}: activation_function=None is not supported"):
        load_pretrained(gpt2)


@pytest.mark.parametrize(("family", "preset", "changes", "message"), [
    # Each raised a TypeError or AttributeError from the family's reading of config.json.
    ("llama", "llama-3.2-1b-tiny", {"rope_scaling": 3}, "rope_scaling=3 is not an object"),
    ("llama", "llama-3.2-1b-tiny", {"num_attention_heads": None}, "num_attention_heads=None is not an int"),
    ("gpt2", "gpt2-tiny", {"n_embd": "32"}, "n_embd='32' is not an int"),
    ("gpt2", "gpt2-tiny", {"model_type": []}, r"model_type \[\] is not supported"),
    ("gpt2", "gpt2-tiny", {"activation_function": {}}, r"activation_function=\{\} is not supported"),
])
def test_a_config_value_of_the_wrong_type_names_the_file_and_field(
    tmp_path: Path, family: str, preset: str, changes: dict, message: str
) -> None:
    folder = _hf_folder(tmp_path, family, preset)
    path = _config(folder, **changes)
    with pytest.raises(CheckpointError, match=f"^{path}: {message}"):
        load_pretrained(folder)


def test_weights_for_a_part_the_config_leaves_out_are_named_with_their_file(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path, "bert", "minilm-l6-tiny")
    _config(folder, type_vocab_size=0)
    with pytest.raises(CheckpointError, match=f"^{folder}/model.safetensors: key .*token_type_embeddings.weight' has "
                                              "no place in the model config.json describes"):
        load_pretrained(folder)


def test_a_huge_width_that_heads_do_not_divide_is_refused_at_once(gpt2: Path) -> None:
    """The hint of a divisor counted up to d_model: 2**62 steps."""
    path = _config(gpt2, n_embd=2**62 + 1, n_head=4)
    with pytest.raises(CheckpointError, match=f"^{path}: d_model: d_model=4611686018427387905 is not divisible by "
                                              "heads=4; pick heads among the divisors of d_model"):
        load_pretrained(gpt2)


def test_a_bert_classifier_whose_labels_are_not_an_object(tmp_path: Path) -> None:
    """`len()` of a float was a TypeError."""
    folder = _hf_folder(tmp_path, "bert", "minilm-l6-tiny", num_labels=3)
    path = _config(folder, id2label=1.5)
    with pytest.raises(CheckpointError, match=f"^{path}: id2label=1.5 is not an object"):
        load_pretrained(folder)


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("tokenizer")
    Tokenizer.train_bpe([TEXT], 60).save(folder)
    return json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))


def _broken_tokenizer(tmp_path: Path, data: dict, place: tuple, value: object) -> Path:
    data = json.loads(json.dumps(data))
    *inner, last = place
    target = data
    for key in inner:
        target = target[key]
    if value is None:
        del target[last]
    else:
        target[last] = value
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(("place", "value", "message"), [
    # A Rust panic while loading, which `except Exception` let through as a traceback.
    (("model", "continuing_subword_prefix"), "NaN", "out of range for slice"),
    # A frame naming a token it does not define: it loaded, then panicked on the first encode.
    (("post_processor", "special_tokens", "<s>"), None, "no entry found for key"),
    # Ids beyond the vocabulary: they loaded, and the model's embedding had no row for them.
    (("model", "vocab", "e"), 2**31, "token 'e' has id 2147483648, but the vocabulary has 60 ids"),
    (("post_processor", "special_tokens", "<s>", "ids"), [2**31], "the frame .* adds id 2147483648"),
    (("padding",), {"strategy": {"Fixed": 2**31}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                    "pad_type_id": 0, "pad_token": "<pad>"}, None),  # padding is switched off before any encode
])
def test_a_broken_tokenizer_json_is_one_error_when_it_is_read(
    tmp_path: Path, tokenizer_json: dict, place: tuple, value: object, message: str | None
) -> None:
    path = _broken_tokenizer(tmp_path, tokenizer_json, place, value)
    if message is None:
        assert len(Tokenizer.from_file(path).encode("In the")) < 10
        return
    with pytest.raises(CheckpointError, match=f"^{path}: cannot be read as a tokenizer file .*{message}"):
        Tokenizer.from_file(path)


def test_a_safetensors_shape_beyond_int64_is_refused_with_the_weights_name(tmp_path: Path) -> None:
    """Empty, so its data fit, yet torch could not take the shape: a TypeError from deep in safetensors."""
    header = json.dumps({"J": {"dtype": "F16", "shape": [2**64 - 1, 0], "data_offsets": [0, 0]}}).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(CheckpointError, match=rf"^{path}: weight 'J' has shape \(18446744073709551615, 0\), beyond"):
        load_weights(_tiny_checkpoint_model(), path)


def test_the_fuzzing_keeps_no_drawn_file_once_it_is_read(tmp_path: Path) -> None:
    """The slow set's MemoryError: hypothesis keeps every `bytes` value drawn in its last 10,000 test cases, and the
    SentencePiece models (240 KB each) drawn as bytes filled the address-space limit after some 9,000 files, so that
    whatever allocated next failed, in the reader or in hypothesis. A `Drawn` file is held only weakly."""
    reader = READERS["sentencepiece"](tmp_path)
    drawn: list[weakref.ref[Drawn]] = []

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(file=reader.files)
    def draw(file: Drawn) -> None:
        drawn.append(weakref.ref(file))

    draw()
    gc.collect()
    assert len(drawn) == 200 and [ref for ref in drawn if ref() is not None] == []


def test_a_sentencepiece_piece_that_is_not_utf8_is_named_with_its_file(tmp_path: Path) -> None:
    """Drawn by the fuzzing: the piece `<s>` with its first byte 0xAE. SentencePiece loaded the model, and finding its
    special tokens (`id_to_piece`) raised a UnicodeDecodeError."""
    model = _sentencepiece_model()
    assert model.count(b"\n\x03<s>") == 1  # the piece's field: its length, 3, then its bytes
    path = tmp_path / "tokenizer.model"
    path.write_bytes(model.replace(b"\n\x03<s>", b"\n\x03\xaes>"))
    with pytest.raises(CheckpointError, match=f"^{path}: piece 1 is not UTF-8 text \\(byte 0 of the piece: invalid start "
                                              "byte\\); the model file is damaged"):
        Tokenizer.from_sentencepiece(path)
