"""Hostile copies of the files a user downloads, and the readers they are fed to (`tests/unit/test_hostile_files.py`).

Each reader has a hypothesis strategy that draws files of its format broken where the format is
fragile: a length or count past the end of the file, a type code nobody knows, a shape whose
product overflows, offsets outside the data or over each other, a file cut at a section's start,
values of the wrong JSON type or out of range. Every file is drawn from a small valid one (written
here with the production writers), so the fuzzing reaches past the first check.

`fuzz(reader, examples)` reads that many drawn files and checks that each is read or refused with
one `AttnError` naming the file. Run as a script it does so in a process of its own, under an
address-space limit (any allocation far beyond the files fails there), and prints as JSON how
many files it read and the most that one file made the resident memory grow, next to that file's size:

    python tests/hostile_files.py READER EXAMPLES
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import resource
import signal
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_gguf, when run as a script

from gguf import GGMLQuantizationType
from tiny_gguf import hf_weights, write_gguf

from attn.artifacts.checkpoint import load_weights
from attn.artifacts.pretrained import export_pretrained
from attn.artifacts.pretrained.families import load_gguf, load_pretrained, read_weights
from attn.artifacts.pretrained.gguf import read_gguf
from attn.data.tokenizers import Tokenizer
from attn.core.errors import AttnError
from attn.models import build_model
from attn.core.presets import preset

# Numbers where sizes and offsets break: zero, one, the edges of 32 and 64 bits, past them, negative.
EDGES = [0, 1, 2, 3, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
EDGE_INTS = st.sampled_from(EDGES) | st.integers(0, 64)
JSON_ODDS = st.sampled_from([None, True, -1, 0, 2**31, 2**63, 2**64, -(2**63) - 1, 1.5, 1e308, -0.0, "", "x", [], {},
                             [1, 2], {"a": 1}, "NaN"])
TEXT = "In the beginning God created the heaven and the earth. And the earth was without form, and void.\n" * 4


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A drawn file: its bytes, and for a config.json the model family whose folder it goes into.

    The strategies give files in this holder, never as `bytes`: hypothesis keeps the `bytes` (and other small
    immutable values) that a strategy drew for each of its last 10,000 test cases, but only a weak reference to
    any other object. Kept as bytes, the drawn SentencePiece models (240 KB each, most of it their normalization
    map) filled the address-space limit after some 9,000 files, and whatever allocated next failed with a
    MemoryError: a reader, or hypothesis drawing the next file.
    """

    data: bytes
    family: str | None = None


# -- safetensors --------------------------------------------------------------------------------

DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
          "F8_E4M3": 1, "F8_E5M2": 1}
BAD_DTYPES = ["Q4_0", "", "f32", "F32 ", "U128", "COMPLEX64"]


@st.composite
def safetensors_files(draw: st.DrawFn, names: list[str]) -> Drawn:
    """A safetensors file: 8 bytes of header length, the JSON header, the tensors' bytes; broken."""
    header: dict[str, Any] = {}
    end = 0
    for _ in range(draw(st.integers(0, 4))):
        dtype = draw(st.sampled_from(list(DTYPES)) | st.sampled_from(BAD_DTYPES))
        shape = draw(st.lists(st.integers(0, 5) | EDGE_INTS, max_size=4))
        size = DTYPES.get(dtype, 4) * math.prod(shape)
        header[draw(st.sampled_from(names) | st.text(max_size=6))] = {
            "dtype": dtype, "shape": shape, "data_offsets": [end, end + size]}
        end += size
    for _ in range(draw(st.integers(0, 3))):  # offsets, shapes and entries of the wrong kind
        if header:
            entry = header[draw(st.sampled_from(sorted(header)))]
            key = draw(st.sampled_from(["dtype", "shape", "data_offsets", None]))
            value = draw(st.lists(EDGE_INTS | st.integers(-5, 5), max_size=3) | JSON_ODDS)
            if key is None:
                entry.clear()
            else:
                entry[key] = value
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4) | JSON_ODDS,
                                                      max_size=2) | JSON_ODDS)
    text = json.dumps(header).encode()
    text = draw(st.just(text) | st.binary(max_size=40) | st.builds(lambda cut: text[:cut], st.integers(0, len(text))))
    length = draw(st.just(len(text)) | st.sampled_from(EDGES) | st.integers(0, len(text) + 16))
    data = bytes(min(end, 2048)) + draw(st.binary(max_size=8))
    return Drawn(struct.pack("<Q", length % 2**64) + text + data)


# -- GGUF ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Slot:
    """A number in a GGUF header: where it is and how wide (a length, count, type code, dimension)."""

    at: int
    width: int


def gguf_layout(path: Path) -> tuple[list[list[Slot]], list[int]]:
    """The integer slots of each header item (version and counts, key-value pairs, tensor infos),
    and the offset where each part of the header starts (where a cut ends a section)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    items, starts = [], []
    for field in [*reader.fields.values(), *(tensor.field for tensor in reader.tensors)]:
        at, slots = field.offset, []
        for part in field.parts:
            starts.append(at)
            if part.dtype.kind in "iu" and part.nbytes in (4, 8) and len(slots) < 8:
                slots.append(Slot(at, part.nbytes))
            at += part.nbytes
        items.append(slots)
    return [slots for slots in items if slots], sorted(set(starts))


@st.composite
def gguf_files(draw: st.DrawFn, base: bytes, items: list[list[Slot]], starts: list[int]) -> Drawn:
    """The tiny GGUF model with one to three numbers of its header replaced, then perhaps cut."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 3))):
        item = draw(st.sampled_from(items))
        for slot in draw(st.lists(st.sampled_from(item), min_size=1, max_size=3)):  # several: dims that overflow
            old = int.from_bytes(data[slot.at:slot.at + slot.width], "little")
            value = draw(EDGE_INTS | st.integers(0, 40) | st.sampled_from([old + 1, old - 1, old * 2, old + 2**32]))
            data[slot.at:slot.at + slot.width] = (value % 2 ** (8 * slot.width)).to_bytes(slot.width, "little")
    cut = draw(st.none() | st.sampled_from(starts) | st.integers(0, len(data)))
    return Drawn(bytes(data[:cut]))


# -- JSON files: tokenizer.json and config.json --------------------------------------------------


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every place in a JSON value (dict keys and list indices from the root)."""
    inner = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [path, *(p for key, item in inner for p in _paths(item, (*path, key)))]


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    if new is _DELETE and len(path) == 1:
        del copy[path[0]]
    else:
        copy[path[0]] = _replace(value[path[0]], path[1:], new)
    return copy


_DELETE = object()


@st.composite
def json_files(draw: st.DrawFn, bases: list[Any], values: st.SearchStrategy[Any] = JSON_ODDS,
               family: str | None = None) -> Drawn:
    """One of `bases` with one to three values replaced by values of the wrong type or out of range (or
    deleted), written as JSON, perhaps cut short (for the folder of `family`)."""
    value = draw(st.sampled_from(bases))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(value)))
        value = _replace(value, path, draw(values | st.just(_DELETE) if path else values))
    text = json.dumps(value).encode()
    return draw(st.just(Drawn(text, family)) | st.builds(lambda cut: Drawn(text[:cut], family),
                                                         st.integers(0, len(text))))


CONFIG_VALUES = JSON_ODDS | EDGE_INTS | st.integers(-3, 130) | st.sampled_from([float("nan"), float("inf"), 1e-30])


# -- SentencePiece models: protocol buffers -------------------------------------------------------


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def proto_fields(data: bytes, start: int = 0, end: int | None = None, depth: int = 0) -> list[tuple[int, int, int]]:
    """(start, value start, end) of every field of a protocol buffer, the fields of messages inside it too
    (ModelProto's pieces, trainer and normalizer specs are messages)."""
    end = len(data) if end is None else end
    fields, at = [], start
    while at < end:
        key, value_at = _varint(data, at)
        kind = key & 7
        if kind == 0:
            _, stop = _varint(data, value_at)
        elif kind == 2:
            length, value_at = _varint(data, value_at)
            stop = value_at + length
            if depth == 0 and key >> 3 in (1, 2, 3):
                fields += proto_fields(data, value_at, stop, depth + 1)
        else:
            stop = value_at + (8 if kind == 1 else 4)
        fields.append((at, value_at, stop))
        at = stop
    return fields


@st.composite
def sentencepiece_files(draw: st.DrawFn, base: bytes, fields: list[tuple[int, int, int]]) -> Drawn:
    """The tiny SentencePiece model with one to three fields given a hostile number or length (a varint
    replaced), deleted, doubled or overwritten by random bytes, then perhaps cut at a field's start."""
    data = base
    for _ in range(draw(st.integers(1, 3))):
        start, value_at, stop = draw(st.sampled_from(fields))
        if stop > len(data):
            continue
        how = draw(st.sampled_from(["number", "delete", "double", "bytes"]))
        if how == "number":
            key_end = _varint(data, start)[1]
            data = data[:key_end] + _encode_varint(draw(EDGE_INTS)) + data[value_at if value_at > key_end else stop:]
        elif how == "delete":
            data = data[:start] + data[stop:]
        elif how == "double":
            data = data[:stop] + data[start:stop] + data[stop:]
        else:
            data = data[:value_at] + draw(st.binary(min_size=1, max_size=6)) + data[value_at + 6:]
    cut = draw(st.none() | st.sampled_from([start for start, _, _ in fields]) | st.integers(0, len(data)))
    return Drawn(data[:cut])


# -- the readers --------------------------------------------------------------------------------


@dataclasses.dataclass
class Reader:
    """One reader under fuzzing: the strategy of its files, and how one is written and read.

    Attributes:
        files: draws one file.
        name: the file's name in the scratch folder.
        read: reads the folder or file (given the file's path); returns anything, raises an AttnError.
        beside: the bytes of the files read with the drawn one (config.json's weights), which justify memory too.
        factor: the resident memory reading may take, in multiples of those bytes (plus `MEMORY_ALLOWANCE`).
    """

    files: st.SearchStrategy[Drawn]
    name: str
    read: Callable[[Path], object]
    beside: int = 0
    factor: int = 16


def _tiny_checkpoint_model() -> Any:
    return build_model(preset("gpt2-tiny").replace(vocab_size=40))


def _hf_folder(root: Path, family: str, name: str, **changes: Any) -> Path:
    config = preset(name).replace(vocab_size=40, **changes)
    return export_pretrained(build_model(config), config, root / family, family)


def _sentencepiece_model() -> bytes:
    import sentencepiece

    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(TEXT.split(". ")), model_writer=proto,
                                             vocab_size=40, hard_vocab_limit=False, minloglevel=2)
    return proto.getvalue()


def _safetensors(root: Path) -> Reader:
    names = [*_tiny_checkpoint_model().state_dict(), "model.embed_tokens.weight", "__metadata__"]
    return Reader(safetensors_files(names), "model.safetensors", lambda p: read_weights(p.parent))


def _checkpoint_weights(root: Path) -> Reader:
    model = _tiny_checkpoint_model()
    names = [*model.state_dict(), "generator.weight", "__metadata__"]
    return Reader(safetensors_files(names), "model.safetensors", lambda p: load_weights(model, p))


def _gguf(root: Path) -> Reader:
    path = root / "tiny.gguf"
    write_gguf(path)
    return Reader(gguf_files(path.read_bytes(), *gguf_layout(path)), "model.gguf",
                  lambda p: _use(read_gguf(p).tokenizer))


# A SentencePiece vocabulary as llama.cpp stores one: unknown, control, 256 byte tokens, then pieces by score.
SPM_TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581", "t", "h", "e", "\u2581t", "he",
              "\u2581the"]


def _gguf_sentencepiece(root: Path) -> Reader:
    path = root / "sentencepiece.gguf"
    pieces = len(SPM_TOKENS) - 259
    write_gguf(path, weights=hf_weights(vocab=len(SPM_TOKENS)), changes={
        "llama.vocab_size": len(SPM_TOKENS), "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": None,
        "tokenizer.ggml.merges": None, "tokenizer.ggml.tokens": SPM_TOKENS,
        "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(1, pieces + 1)],
        "tokenizer.ggml.token_type": [2, 3, 3, *[6] * 256, *[1] * pieces]})
    return Reader(gguf_files(path.read_bytes(), *gguf_layout(path)), "model.gguf",
                  lambda p: _use(read_gguf(p).tokenizer))


def _gguf_kept(root: Path) -> Reader:
    """4-bit and 8-bit blocks, loaded kept quantized: the fuzzed dimensions and block types reach the weights."""
    path = root / "quantized.gguf"
    q4, q8 = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q8_0
    write_gguf(path, quant=lambda name: q8 if "ffn" in name or "token_embd" in name else q4)
    return Reader(gguf_files(path.read_bytes(), *gguf_layout(path)), "model.gguf", load_gguf)


def _tokenizer_json(root: Path) -> Reader:
    Tokenizer.train_bpe([TEXT], 60).save(root / "bpe")
    base = json.loads((root / "bpe" / "tokenizer.json").read_text(encoding="utf-8"))
    return Reader(json_files([base]), "tokenizer.json", lambda p: _use(Tokenizer.from_file(p)))


def _sentencepiece(root: Path) -> Reader:
    spm = _sentencepiece_model()
    return Reader(sentencepiece_files(spm, proto_fields(spm)), "tokenizer.model",
                  lambda p: _use(Tokenizer.from_sentencepiece(p)))


def _use(tokenizer: Tokenizer) -> None:
    """A tokenizer that loads must work: its ids lie inside its vocabulary (an embedding has a row for
    each) and decode."""
    ids = tokenizer.encode(TEXT[:80], add_special=True)
    assert all(0 <= i < tokenizer.vocab_size for i in ids), f"ids {ids} beyond the vocabulary of {tokenizer.vocab_size}"
    tokenizer.decode(ids)


def _config_json(root: Path) -> Reader:
    folders = {family: _hf_folder(root, family, name) for family, name in
               [("gpt2", "gpt2-tiny"), ("bert", "minilm-l6-tiny"), ("llama", "llama-3.2-1b-tiny")]}
    configs = [json.loads((folder / "config.json").read_text(encoding="utf-8")) for folder in folders.values()]
    files = st.sampled_from(list(folders)).flatmap(lambda family: json_files(configs, CONFIG_VALUES, family))
    weights = max((folder / "model.safetensors").stat().st_size for folder in folders.values())
    return Reader(files, "config.json", lambda p: load_pretrained(p.parent), weights)


# Each reader, built with the valid files its strategy starts from written under a folder.
READERS: dict[str, Callable[[Path], Reader]] = {
    "safetensors": _safetensors, "checkpoint-weights": _checkpoint_weights, "gguf": _gguf,
    "gguf-sentencepiece": _gguf_sentencepiece, "gguf-kept": _gguf_kept,
    "tokenizer.json": _tokenizer_json, "sentencepiece": _sentencepiece, "config.json": _config_json,
}


def read_one(reader: Reader, folder: Path, drawn: Drawn, hf_root: Path) -> None:
    """Writes one drawn file and reads it; fails unless it is read or refused with one AttnError naming it."""
    if drawn.family is not None:  # config.json: into a copy of the family's folder
        folder = hf_root / drawn.family
    path = folder / reader.name
    original = path.read_bytes() if path.exists() else None
    path.write_bytes(drawn.data)
    signal.alarm(SECONDS_PER_FILE)  # a reader that loops on a number from the file fails here, not at the CI's limit
    try:
        reader.read(path)
    except AttnError as error:
        where = str(path) if reader.name != "config.json" else str(folder)
        assert where in str(error), f"the error does not name {where}: {error}"
        assert "allocate" not in str(error).lower(), f"a refused allocation: {error}"
    finally:
        signal.alarm(0)
        if original is not None:
            path.write_bytes(original)


SECONDS_PER_FILE = 20


def _time_up(signum: int, frame: Any) -> None:
    raise TimeoutError(f"reading one file took more than {SECONDS_PER_FILE} s")


def _status(key: str) -> int:
    """A size in bytes from /proc/self/status (VmRSS: resident now; VmHWM: resident at its peak)."""
    with open("/proc/self/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith(f"{key}:"))
    return int(line.split()[1]) * 1024


def _measured(read: Callable[[], None]) -> int:
    """How far the resident memory rose above where it was while `read` ran: the peak is reset first."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")
    before = _status("VmRSS")
    read()
    return _status("VmHWM") - before


MEMORY_ALLOWANCE = 64 << 20  # bytes one file may add besides its `Reader.factor`: a tiny model, allocator slack


def fuzz(name: str, examples: int, root: Path) -> dict[str, int]:
    """Reads `examples` drawn files with reader `name`, measuring each.

    Returns:
        files: how many were read; grown, size: the resident memory one file added, and that file's size,
        for the file that came nearest its bound (`Reader.factor` times its size plus `MEMORY_ALLOWANCE`);
        factor: the reader's.
    """
    reader, scratch = READERS[name](root), root / "scratch"
    scratch.mkdir(exist_ok=True)
    seen = {"files": 0, "grown": 0, "size": 0, "factor": reader.factor}

    # No shrinking: a failure is reported as drawn (shrinking a slow reader's example takes minutes).
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @given(drawn=reader.files)
    def run(drawn: Drawn) -> None:
        seen["files"] += 1
        size = len(drawn.data) + reader.beside
        grown = _measured(lambda: read_one(reader, scratch, drawn, root))
        if grown - reader.factor * size > seen["grown"] - reader.factor * seen["size"]:
            seen.update(grown=grown, size=size)

    run()
    return seen


ADDRESS_ALLOWANCE = 1 << 30  # bytes of address space the fuzzing may add: threads' stacks and arenas, no tensor


def main(name: str, examples: int) -> None:
    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, _time_up)
    with tempfile.TemporaryDirectory() as scratch:
        fuzz(name, 5, Path(scratch))  # loads every library and code path the run needs
        limit = _status("VmSize") + ADDRESS_ALLOWANCE
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        (Path(scratch) / "run").mkdir()
        print(json.dumps(fuzz(name, examples, Path(scratch) / "run")))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
