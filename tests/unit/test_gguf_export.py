"""`export_gguf` and `attn convert --to gguf`: decoders written as GGUF files.

Every Llama-style family of `test_gguf_families` (a tiny random `transformers` model written as llama.cpp's
converter writes it) is read by attn, exported, and read back: the same logits in float32, tokenizer and chat
template. transformers' own GGUF loader reads an exported llama file as the model that was written (llama.cpp's
q/k row order). Quantized exports are checked against gguf's own dequantizer and the float weights; Q4_K_M's mix
against llama.cpp's rule written out by hand; the metadata keys against the real SmolLM2 file's.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, LlamaFileType
from gguf.quants import dequantize
from gguf_vocab import texts, write_vocabulary
from test_gguf_families import CASES, IDS, logits, written  # noqa: F401 (written: the files, a fixture)
from test_gguf_tokenizer import VOCABULARY
from tiny_gguf import SPECIALS, TOKENIZER, TOKENS, write_gguf
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from attn import GenerationConfig, build_model, generate, load_model, preset
from attn.app import cli
from attn.artifacts.loading import packaged_model_dir
from attn.artifacts.pretrained import export_pretrained
from attn.artifacts.pretrained.gguf import read_gguf
from attn.artifacts.pretrained.gguf_export import block_format, export_gguf
from attn.artifacts.pretrained.gguf_file import Metadata, open_gguf
from attn.artifacts.pretrained.gguf_tokenizer import tokenizer_metadata, tokenizer_of
from attn.core.config import Activation
from attn.core.errors import CheckpointError, ConfigError
from attn.core.lora import LoRAConfig, add_lora, has_lora, merge_lora

SAMPLES = texts(SPECIALS)[::7]


def exported(bundle, path: Path, quantize: str = "f32") -> Path:
    return export_gguf(bundle.model, bundle.model_config, path, bundle.tokenizer, quantize=quantize,
                       chat_template=bundle.chat_template, family=bundle.imported.family)


@pytest.mark.parametrize("name", [name for name in CASES if name != "gemma2-27b"])  # its 46 layers add nothing
def test_every_family_reads_back_as_the_model_exported(name: str, written, tmp_path: Path) -> None:
    source, _ = written(name)
    bundle = load_model(source, "cpu", dequantize=True)
    back = load_model(exported(bundle, tmp_path / "out.gguf"), "cpu", dequantize=True)
    assert back.model_config == bundle.model_config
    torch.testing.assert_close(logits(back.model), logits(bundle.model), atol=1e-5, rtol=0)
    assert back.chat_template == bundle.chat_template
    assert back.tokenizer.encode_batch(SAMPLES) == bundle.tokenizer.encode_batch(SAMPLES)


def test_lora_adapters_are_merged_into_the_weights_written(written, tmp_path: Path) -> None:
    bundle = load_model(written("llama")[0], "cpu", dequantize=True)
    add_lora(bundle.model, LoRAConfig(rank=2, targets=("q_proj", "v_proj", "down_proj")))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in bundle.model.named_parameters():
            if ".lora." in name:
                tensor.copy_(torch.randn(tensor.shape, generator=generator))
    adapted = logits(bundle.model)
    assert (adapted - logits(merge_lora(copy.deepcopy(bundle.model)))).abs().max() < 1e-4
    back = load_model(exported(bundle, tmp_path / "out.gguf"), "cpu", dequantize=True)
    torch.testing.assert_close(logits(back.model), adapted, atol=1e-4, rtol=0)
    assert has_lora(bundle.model)  # the model exported keeps its adapters


def test_transformers_reads_an_exported_llama_as_the_model_written(written, tmp_path: Path) -> None:
    source, hf = written("llama")
    path = exported(load_model(source, "cpu", dequantize=True), tmp_path / "out.gguf")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = hf(IDS).logits
        torch.testing.assert_close(theirs(IDS).logits, expected, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A random GPT-2 (positions of the 1,024 transformers' GGUF loader assumes) saved by transformers, read by
    attn, with the byte-level vocabulary of `tiny_gguf`."""
    folder = tmp_path_factory.mktemp("gpt2")
    config = GPT2Config(vocab_size=len(TOKENS), n_embd=64, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(config).eval()
    hf.save_pretrained(folder / "hf")
    write_gguf(folder / "vocabulary.gguf")
    return hf, load_model(folder / "hf", "cpu", require_tokenizer=False), read_gguf(folder / "vocabulary.gguf").tokenizer


@pytest.mark.parametrize("quantize", ["f32", "q8_0"])
def test_gpt2_exports_as_transformers_reads_it(gpt2, quantize: str, tmp_path: Path) -> None:
    hf, bundle, tokenizer = gpt2
    path = export_gguf(bundle.model, bundle.model_config, tmp_path / "gpt2.gguf", tokenizer, quantize=quantize)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()
    with torch.no_grad():
        expected = hf(IDS).logits
        torch.testing.assert_close(theirs(IDS).logits, expected, atol=1e-5 if quantize == "f32" else 0.02, rtol=0)
    assert {t.name for t in GGUFReader(path).tensors} >= {"position_embd.weight", "blk.1.attn_qkv.bias"}
    with pytest.raises(CheckpointError, match="architecture 'gpt2' is not supported"):
        read_gguf(path)


def test_gpt2_of_the_exact_gelu_is_refused(gpt2, tmp_path: Path) -> None:
    _, bundle, tokenizer = gpt2
    config = bundle.model_config.replace(activation=Activation.GELU)
    with pytest.raises(CheckpointError, match="tanh GELU"):
        export_gguf(build_model(config), config, tmp_path / "x.gguf", tokenizer)


def test_q8_0_blocks_are_the_float_weights_within_their_step(written, tmp_path: Path) -> None:
    source, _ = written("qwen2")
    bundle = load_model(source, "cpu", dequantize=True)
    path = exported(bundle, tmp_path / "out.gguf", "q8_0")
    floats = {t.name: dequantize(t.data, t.tensor_type) for t in GGUFReader(source).tensors}
    back = load_model(path, "cpu", dequantize=True)
    ours = read_gguf(path).weights
    for tensor in GGUFReader(path).tensors:
        theirs = dequantize(tensor.data, tensor.tensor_type)
        reference = floats[tensor.name]
        if tensor.name.endswith("_norm.weight") or tensor.name.endswith(".bias"):
            assert tensor.tensor_type == Q.F32 and np.array_equal(theirs, reference)
            continue
        assert tensor.tensor_type == Q.Q8_0
        # Q8_0's step is max |x| / 127, stored in float16: off by up to 2^-11 of it, 127 times at the block's end
        step = np.abs(reference).reshape(-1, 32).max(axis=1, keepdims=True) / 127
        assert (np.abs(theirs - reference).reshape(-1, 32) <= step * (0.5 + 127 * 2.0**-11) + 1e-7).all()
        hf_name = next(k for k, v in ours.items() if v.tensor.name == tensor.name)
        assert np.array_equal(ours[hf_name].floats().numpy(), theirs.reshape(ours[hf_name].shape)), tensor.name
    drift = (logits(back.model) - logits(bundle.model)).abs().max()
    assert 0 < drift < 0.05 * logits(bundle.model).abs().max()


def test_q4_k_m_mixes_blocks_as_llama_quantize(tmp_path: Path) -> None:
    """Rows of 256: Q6_K for attn_v and ffn_down in layers 0, 3, 6, 7 of 8 and for the tied embedding, Q4_K
    elsewhere; rows of 64 fall back to Q5_0 and Q8_0, rows of 48 to F16."""
    more_bits = {0, 3, 6, 7}  # i < 8/8, i >= 7 * 8/8, or (i - 1) % 3 == 2
    for layer in range(8):
        for name in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert block_format(f"blk.{layer}.{name}.weight", (512, 256), "q4_k_m", 8, True) == Q.Q4_K
        for name in ("attn_v", "ffn_down"):
            wanted = Q.Q6_K if layer in more_bits else Q.Q4_K
            assert block_format(f"blk.{layer}.{name}.weight", (64, 256), "q4_k_m", 8, True) == wanted
    assert block_format("token_embd.weight", (1000, 256), "q4_k_m", 8, tied=True) == Q.Q6_K
    assert block_format("token_embd.weight", (1000, 256), "q4_k_m", 8, tied=False) == Q.Q4_K
    assert block_format("output.weight", (1000, 576), "q4_k_m", 8, tied=False) == Q.Q8_0
    assert block_format("blk.1.attn_q.weight", (64, 64), "q4_k_m", 8, True) == Q.Q5_0
    assert block_format("blk.0.attn_v.weight", (64, 64), "q4_k_m", 8, True) == Q.Q8_0
    assert block_format("blk.1.attn_q.weight", (64, 48), "q4_k_m", 8, True) == Q.F16
    assert block_format("blk.1.attn_norm.weight", (256,), "q4_k_m", 8, True) == Q.F32
    path = tmp_path / "model.gguf"
    write_gguf(path, weights=None)
    bundle = load_model(path, "cpu", dequantize=True)
    out = exported(bundle, tmp_path / "out.gguf", "q4_k_m")
    reader = GGUFReader(out)
    assert int(reader.fields["general.file_type"].contents()) == LlamaFileType.MOSTLY_Q4_K_M
    assert {t.name: t.tensor_type for t in reader.tensors}["blk.0.ffn_down.weight"] == Q.Q5_0  # rows of 64
    back = load_model(out, "cpu", dequantize=True)
    assert (logits(back.model) - logits(bundle.model)).abs().max() < 0.2 * logits(bundle.model).abs().max()


@pytest.fixture(scope="module")
def smollm2() -> Metadata:
    """The metadata of the real SmolLM2 file."""
    path = packaged_model_dir("SmolLM2-135M-Instruct")
    return Metadata(open_gguf(path), path)


def _keys(meta: Metadata) -> set[str]:
    kept = {"general.architecture", "general.file_type", "general.quantization_version"}
    return {key for key in meta.reader.fields if not key.startswith(("general.", "GGUF.")) or key in kept}


def test_the_metadata_keys_are_those_of_the_real_smollm2_file(smollm2: Metadata, tmp_path: Path) -> None:
    """A tied llama of a byte-level vocabulary, as SmolLM2 is, heads of hidden / heads: the same keys."""
    path = tmp_path / "model.gguf"
    write_gguf(path)
    out = exported(load_model(path, "cpu", dequantize=True), tmp_path / "out.gguf", "q8_0")
    assert _keys(Metadata(open_gguf(out), out)) == _keys(smollm2)


def _round_trip(path: Path, arch: str, meta: Metadata):
    tokenizer, _, _ = tokenizer_of(meta)
    rows = len(meta.get("tokenizer.ggml.tokens", "str[]"))
    write_vocabulary(path, arch, {key: None for key in TOKENIZER} | tokenizer_metadata(tokenizer, rows))
    return tokenizer, tokenizer_of(Metadata(open_gguf(path), path))


def test_the_smollm2_vocabulary_writes_back_as_it_reads(smollm2: Metadata, tmp_path: Path) -> None:
    tokenizer, (back, ids, add_bos) = _round_trip(tmp_path / "v.gguf", "llama", smollm2)
    samples = texts(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    assert back.encode_batch(samples, add_special=True) == tokenizer.encode_batch(samples, add_special=True)
    assert back.roles == tokenizer.roles and not add_bos


def test_a_sentencepiece_vocabulary_writes_back_as_it_reads(tmp_path: Path) -> None:
    first = tmp_path / "first.gguf"
    write_vocabulary(first, "llama", {**VOCABULARY, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                                      "tokenizer.ggml.unknown_token_id": 0})
    tokenizer, (back, ids, add_bos) = _round_trip(tmp_path / "v.gguf", "llama", Metadata(open_gguf(first), first))
    samples = [*SAMPLES, "abc abcbc <start>ab", " abc", "é ab"]
    assert back.encode_batch(samples, add_special=True) == tokenizer.encode_batch(samples, add_special=True)
    assert [back.decode(ids) for ids in back.encode_batch(samples)] == [tokenizer.decode(ids) for ids in
                                                                          tokenizer.encode_batch(samples)]
    assert add_bos and ids["unk"] == 0


@pytest.mark.parametrize("name", ["minilm-l6-tiny", "marian-base-tiny"])
def test_the_cli_refuses_a_model_that_is_not_a_decoder(name: str, tmp_path: Path, capsys) -> None:
    config = preset(name)
    export_pretrained(build_model(config), config, tmp_path / "hf", {"minilm": "bert"}.get(name[:6], "marian"))
    assert cli.main(["convert", "--to", "gguf", str(tmp_path / "hf"), str(tmp_path / "out.gguf")]) == 1
    err = capsys.readouterr().err
    assert "cannot be exported to GGUF" in err and "llama, qwen2" in err and "Traceback" not in err
    assert not (tmp_path / "out.gguf").exists()


def test_the_cli_writes_a_quantized_file_and_refuses_a_type_of_the_other_kind(tmp_path: Path, capsys) -> None:
    source = tmp_path / "model.gguf"
    write_gguf(source)
    assert cli.main(["convert", "--to", "gguf", "--quantize", "q8_0", str(source), str(tmp_path / "o.gguf")]) == 0
    assert {t.tensor_type for t in GGUFReader(tmp_path / "o.gguf").tensors} == {Q.Q8_0, Q.F32}
    assert cli.main(["convert", "--to", "gguf", "--quantize", "int8", str(source), str(tmp_path / "x.gguf")]) == 2
    assert cli.main(["convert", "--to", "attn", "--quantize", "q8_0", str(source), str(tmp_path / "x")]) == 2
    assert "--quantize" in capsys.readouterr().err


def test_a_model_without_tokenizer_or_an_unknown_type_is_refused(tmp_path: Path) -> None:
    config = preset("smollm2-135m-tiny")
    with pytest.raises(CheckpointError, match="no tokenizer"):
        export_gguf(build_model(config), config, tmp_path / "x.gguf", None)
    with pytest.raises(ConfigError, match="q4_k_m"):
        export_gguf(build_model(config), config, tmp_path / "x.gguf", None, quantize="q3_k")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_smollm2_exported_as_q8_0_answers_as_the_file_it_came_from(tmp_path: Path) -> None:
    """Fast tests cover each part on tiny models; this one reads the real file (about 30 s on two cores). Its Q4_1
    weights rounded again to Q8_0 may turn a later greedy choice; the first is the same."""
    source = load_model(packaged_model_dir("SmolLM2-135M-Instruct"), "cpu", dequantize=True)
    back = load_model(exported(source, tmp_path / "smollm2.gguf", "q8_0"), "cpu")
    assert back.chat_template == source.chat_template and back.stop_ids == source.stop_ids
    questions = ["What is the capital of France?", "Name three colours.", "What is 2 + 2?"]
    prompts = [source.tokenizer.encode(source.render_chat([{"role": "user", "content": q}])) for q in questions]
    assert [back.tokenizer.encode(back.render_chat([{"role": "user", "content": q}])) for q in questions] == prompts
    config = GenerationConfig(max_new_tokens=16)
    ours = generate(back.model, prompts, config, eos_id=back.eos_id)
    theirs = generate(source.model, prompts, config, eos_id=source.eos_id)
    assert [answer[0] for answer in ours] == [answer[0] for answer in theirs]
    assert all(back.tokenizer.decode(answer).strip() for answer in ours)
