"""Decoders written as GGUF files (llama.cpp's format) that llama.cpp and `read_gguf` read: `export_gguf`.

The model goes out as the Hugging Face checkpoint of the family the GGUF reader maps an architecture to
(`families.hf_checkpoint`), then through the reader's own tables run backwards: tensor names from
`gguf.tensor_table`, the `{architecture}.*` keys that `gguf_config` reads, the tokenizer that
`gguf_tokenizer.tokenizer_metadata` writes. What the reader undoes is done: the rows of each head of q_proj and
k_proj reordered for "llama"'s interleaved rotation, the offset of Gemma's norms added, Llama 3's rope scaling
stored as per-frequency factors (`rope_freqs.weight`). GPT-2 goes out as llama.cpp's "gpt2" (`GPT2_TENSORS`), its
Conv1D matrices transposed; attn's reader does not take that architecture, so its files are not read back.

Block formats (`QUANTIZATIONS`): f32, f16, bf16, q8_0, and q4_k_m mixed as llama.cpp's llama-quantize mixes
Q4_K_M: Q6_K for the output matrix (and the embedding when they are tied; Q8_0 where its rows are not a multiple
of 256), for attn_v (or attn_qkv) and ffn_down in the layers `_more_bits` picks, Q4_K elsewhere; a row length
that does not fit a block of 256 falls back as llama.cpp falls back (Q4_K to Q5_0, Q6_K to Q8_0), one that does
not fit 32 to F16. Vectors (norms, biases, rope factors) stay float32. Blocks are made by `libgguf`.

The file is written atomically and, but for gpt2, read back before it takes `path`: its config must read back as
the model's.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from gguf import GGML_QUANT_VERSION, GGUFWriter, Keys, LlamaFileType
from gguf import GGMLQuantizationType as Q
from libgguf import quantize_rows
from torch import Tensor

from attn.artifacts.pretrained.families import FAMILIES, hf_checkpoint
from attn.artifacts.pretrained.gguf import read_gguf, tensor_table
from attn.artifacts.pretrained.gguf_config import ARCHITECTURES, HyperParameters
from attn.artifacts.pretrained.gguf_tokenizer import tokenizer_metadata
from attn.artifacts.pretrained.hf_config import SpecialIds, same_config
from attn.core.config import Activation, Architecture, LayerType, ModelConfig, RopeScaling
from attn.core.errors import CheckpointError, ConfigError
from attn.core.lora import has_lora, merge_lora
from attn.data.files import write_file
from attn.data.tokenizers import Tokenizer
from attn.models import Model

QUANTIZATIONS: dict[str, LlamaFileType] = {
    "f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16, "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0, "q4_k_m": LlamaFileType.MOSTLY_Q4_K_M,
}
GPT2 = "gpt2"  # llama.cpp's GPT-2, which attn writes (its reader takes the Llama-style `ARCHITECTURES` only)
# GPT-2's tensors: GGUF name -> Hugging Face name under `transformer.`; the layers' matrices are Conv1D (in, out)
# (those whose name has a dot), which llama.cpp stores transposed, as the (out, in) of a linear map
GPT2_TENSORS = {"token_embd": "wte", "position_embd": "wpe", "output_norm": "ln_f"}
GPT2_LAYER = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
              "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
SUPER_BLOCK, BLOCK = 256, 32  # the row lengths K-quant and the other block formats need a multiple of


def export_gguf(
    model: Model,
    config: ModelConfig,
    path: str | Path,
    tokenizer: Tokenizer | None,
    *,
    quantize: str = "f32",
    chat_template: str | None = None,
    eot_id: int | None = None,
    family: str | None = None,
    name: str | None = None,
) -> Path:
    """Writes a decoder-only `model` as the GGUF file `path`, with its tokenizer and chat template; LoRA adapters
    (`attn.core.lora`) are merged into a copy of the model first.

    Args:
        quantize: a key of `QUANTIZATIONS`.
        eot_id: the token that ends a chat turn (`tokenizer.ggml.eot_token_id`), where it is not eos.
        family: the Hugging Face family the model came from; its GGUF architecture is tried first, then every
            other in `ARCHITECTURES`, and the first that expresses the config is written.
        name: `general.name`.

    Returns:
        `path`.

    Raises:
        ConfigError: an unknown `quantize`.
        CheckpointError: the model is not decoder-only, no GGUF architecture expresses its config, or its
            tokenizer is one GGUF files do not hold.
    """
    if quantize not in QUANTIZATIONS:
        raise ConfigError("quantize", f"{quantize!r} is not a GGUF type attn writes; choose one of "
                                      f"{', '.join(QUANTIZATIONS)}")
    if has_lora(model):
        model = merge_lora(copy.deepcopy(model))
    arch, tensors = _architecture(model, config, family)
    if tokenizer is None:
        raise CheckpointError("the model has no tokenizer, and a GGUF file holds one: export a model saved with "
                              "its tokenizer")
    table = _placements(arch, config)
    arrays = {table[hf_name].name: _stored(hf_name, tensor, table) for hf_name, tensor in tensors.items()}
    if config.rope_scaling == RopeScaling.LLAMA3:
        arrays["rope_freqs.weight"] = llama3_factors(config)
    metadata = {
        Keys.General.TYPE: "model",
        **({Keys.General.NAME: name} if name else {}),
        Keys.General.FILE_TYPE: int(QUANTIZATIONS[quantize]),
        Keys.General.QUANTIZATION_VERSION: GGML_QUANT_VERSION,
        **architecture_metadata(arch, config),
        **tokenizer_metadata(tokenizer, config.vocab_size),
        **({Keys.Tokenizer.CHAT_TEMPLATE: chat_template} if chat_template is not None else {}),
        **({Keys.Tokenizer.EOT_ID: eot_id} if eot_id is not None else {}),
    }
    tied = "output.weight" not in arrays
    kinds = {tensor: block_format(tensor, array.shape, quantize, config.decoder_layers, tied)
             for tensor, array in arrays.items()}

    def write(handle: Any) -> None:
        _write(Path(handle.name), arch, metadata, arrays, kinds)
        if arch in ARCHITECTURES:
            _check_read_back(Path(handle.name), config, arch)

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, write)
    return out


def _architecture(model: Model, config: ModelConfig, preferred: str | None) -> tuple[str, dict[str, Tensor]]:
    """The GGUF architecture that expresses `config` and the model's tensors under its reader's Hugging Face names."""
    exportable = ", ".join([*ARCHITECTURES, GPT2])
    if config.architecture != Architecture.DECODER_ONLY:
        raise CheckpointError(f"an {config.architecture.value} model cannot be exported to GGUF: attn writes GGUF "
                              f"files of decoder-only language models ({exportable}); export it as a Hugging Face "
                              "directory (--to a family) instead")
    reasons = []
    families = {**{arch: family.model_type for arch, family in ARCHITECTURES.items()}, GPT2: GPT2}
    for arch in sorted(families, key=lambda arch: families[arch] != preferred):
        try:
            tensors = hf_checkpoint(model, config, families[arch], SpecialIds())[1]
        except CheckpointError as err:
            reasons.append(f"{arch}: {err}")
            continue
        if arch == GPT2 and config.activation != Activation.GELU_TANH:
            raise CheckpointError(f"activation={config.activation.value} cannot be expressed in a GGUF gpt2 file, "
                                  "whose feed-forward llama.cpp computes with the tanh GELU")
        return arch, tensors
    raise CheckpointError(f"no GGUF architecture attn writes ({exportable}) expresses this model: "
                          f"{reasons[0].split('; export to')[0]}")


class _Placement(NamedTuple):
    """Where a Hugging Face tensor goes in the file: its GGUF name, the heads whose rows llama.cpp reorders (or
    None), what its converter adds to each value, and whether it is a Conv1D's (in, out), stored transposed."""

    name: str
    heads: int | None = None
    offset: float = 0.0
    transposed: bool = False


def _placements(arch: str, config: ModelConfig) -> dict[str, _Placement]:
    """Hugging Face name -> placement, for every tensor of a model of `config` in a file of `arch`."""
    if arch == GPT2:
        table = {f"transformer.{hf}.{part}": _Placement(f"{ours}.{part}")
                 for ours, hf in GPT2_TENSORS.items() for part in ("weight", "bias")}
        for i, (ours, hf) in itertools.product(range(config.decoder_layers), GPT2_LAYER.items()):
            table[f"transformer.h.{i}.{hf}.weight"] = _Placement(f"blk.{i}.{ours}.weight", transposed="." in hf)
            table[f"transformer.h.{i}.{hf}.bias"] = _Placement(f"blk.{i}.{ours}.bias")
        return table | {"lm_head.weight": _Placement("output.weight")}
    hyper = HyperParameters(
        layers=config.decoder_layers, hidden=config.d_model, ffn=config.d_ff, heads=config.heads,
        kv_heads=config.kv_heads, head_dim=config.head_size, vocab=config.vocab_size, context=config.max_positions,
        eps=config.norm_eps, theta=config.rotary_base, rope_scaling=None, rotary=config.rotary_dims)
    return {entry.hf_name: _Placement(name, entry.heads, entry.offset)
            for name, entry in tensor_table(ARCHITECTURES[arch], hyper).items()}


def _stored(hf_name: str, tensor: Tensor, table: Mapping[str, _Placement]) -> np.ndarray:
    """A Hugging Face tensor as llama.cpp's converter stores it (float32, before any block format)."""
    if hf_name not in table:
        raise CheckpointError(f"the model's {hf_name} has no tensor in a GGUF file of this architecture")
    place = table[hf_name]
    value = tensor.detach().float()
    if place.transposed:
        value = value.t()
    if place.heads is not None:  # per head, row r * d/2 + j goes to row 2j + r
        value = value.reshape(place.heads, 2, -1, *value.shape[1:]).transpose(1, 2).reshape(value.shape)
    return (value + place.offset).contiguous().numpy()


def _gemma2_keys(config: ModelConfig) -> dict[str, Any]:
    return {Keys.LLM.ATTN_LOGIT_SOFTCAPPING: float(config.attention_softcap),
            Keys.LLM.FINAL_LOGIT_SOFTCAPPING: float(config.logit_softcap), Keys.Attention.SLIDING_WINDOW: config.sliding_window}


def _gemma3_keys(config: ModelConfig) -> dict[str, Any]:
    keys = {Keys.Rope.FREQ_BASE_SWA: float(config.local_rotary_base or config.rotary_base)}
    if config.logit_softcap:
        keys[Keys.LLM.FINAL_LOGIT_SOFTCAPPING] = float(config.logit_softcap)
    if LayerType.SLIDING in config.decoder_layer_types:
        keys[Keys.Attention.SLIDING_WINDOW] = config.sliding_window
    return keys


def _phi3_keys(config: ModelConfig) -> dict[str, Any]:
    sliding = LayerType.SLIDING in config.decoder_layer_types
    return {Keys.Attention.SLIDING_WINDOW: config.sliding_window if sliding else 0}


_ARCHITECTURE_KEYS: dict[str, Callable[[ModelConfig], dict[str, Any]]] = {
    "gemma2": _gemma2_keys, "gemma3": _gemma3_keys, "phi3": _phi3_keys,
}


def architecture_metadata(arch: str, config: ModelConfig) -> dict[str, Any]:
    """The `{arch}.*` keys of `config`, those `gguf_config.hyper_parameters` reads (gpt2: llama.cpp's)."""
    keys: dict[str, Any] = {
        Keys.LLM.BLOCK_COUNT: config.decoder_layers, Keys.LLM.CONTEXT_LENGTH: config.max_positions,
        Keys.LLM.EMBEDDING_LENGTH: config.d_model, Keys.LLM.FEED_FORWARD_LENGTH: config.d_ff,
        Keys.LLM.VOCAB_SIZE: config.vocab_size, Keys.Attention.HEAD_COUNT: config.heads,
    }
    if arch == GPT2:
        keys[Keys.Attention.LAYERNORM_EPS] = float(config.norm_eps)
        return {key.format(arch=arch): value for key, value in keys.items()}
    keys |= {
        Keys.Attention.HEAD_COUNT_KV: config.kv_heads, Keys.Attention.LAYERNORM_RMS_EPS: float(config.norm_eps),
        Keys.Rope.FREQ_BASE: float(config.rotary_base), Keys.Rope.DIMENSION_COUNT: config.rotary_dims,
    }
    if config.head_size * config.heads != config.d_model:
        keys |= {Keys.Attention.KEY_LENGTH: config.head_size, Keys.Attention.VALUE_LENGTH: config.head_size}
    if config.rope_scaling == RopeScaling.LINEAR:
        keys |= {Keys.Rope.SCALING_TYPE: "linear", Keys.Rope.SCALING_FACTOR: float(config.rope_factor)}
    keys |= _ARCHITECTURE_KEYS.get(arch, lambda c: {})(config)
    return {key.format(arch=arch): value for key, value in keys.items()}


def llama3_factors(config: ModelConfig) -> np.ndarray:
    """What Llama 3's rope scaling divides each rotary frequency by: 1 for wavelengths below L / high, the factor
    above L / low, 1 / ((1 - s) / factor + s) between, s = (L / wavelength - low) / (high - low)."""
    dims = config.rotary_dims
    wavelengths = 2 * np.pi * config.rotary_base ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    low, high, factor = config.rope_low_freq_factor, config.rope_high_freq_factor, config.rope_factor
    smooth = np.clip((config.rope_original_positions / wavelengths - low) / (high - low), 0.0, 1.0)
    return (1 / ((1 - smooth) / factor + smooth)).astype(np.float32)


def _more_bits(layer: int, layers: int) -> bool:
    """llama-quantize's layers of attn_v and ffn_down that Q4_K_M keeps in Q6_K: the first and last eighth, and
    every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def block_format(name: str, shape: tuple[int, ...], quantize: str, layers: int, tied: bool) -> Q:
    """The block format of the GGUF tensor `name` of `shape` (numpy's: rows, then the row length)."""
    if len(shape) != 2 or not name.endswith(".weight") or name.endswith("_norm.weight"):
        return Q.F32
    if quantize in ("f32", "f16", "bf16"):
        return Q[quantize.upper()]
    if name == "position_embd.weight":  # llama-quantize leaves positions as they are
        return Q.F32
    if quantize == "q8_0":
        return Q.Q8_0 if shape[1] % BLOCK == 0 else Q.F16
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        wanted = Q.Q8_0 if shape[1] % SUPER_BLOCK else Q.Q6_K
    elif name.endswith(("attn_v.weight", "attn_qkv.weight", "ffn_down.weight")) and _more_bits(
            int(name.split(".")[1]), layers):
        wanted = Q.Q6_K
    else:
        wanted = Q.Q4_K
    if shape[1] % SUPER_BLOCK and wanted in (Q.Q4_K, Q.Q6_K):
        wanted = Q.Q5_0 if wanted == Q.Q4_K else Q.Q8_0
    return wanted if shape[1] % BLOCK == 0 else Q.F16


def _write(file: Path, arch: str, metadata: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
           kinds: Mapping[str, Q]) -> None:
    writer = GGUFWriter(file, arch)
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))
    for name, array in arrays.items():
        kind = kinds[name]
        if kind == Q.F32:
            writer.add_tensor(name, array)
        elif kind == Q.F16:
            writer.add_tensor(name, array.astype(np.float16))
        else:
            writer.add_tensor(name, quantize_rows(array, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _check_read_back(file: Path, config: ModelConfig, arch: str) -> None:
    """Raises unless the written file reads back as a model of `config`."""
    found = read_gguf(file)
    parsed = FAMILIES[found.hf_config["model_type"]].model_config(found.hf_config, found.weights.keys())
    same_config(config, parsed, f"GGUF {arch}")
