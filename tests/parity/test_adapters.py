"""LoRA adapters in PEFT's format: an adapter attn saves gives, under `transformers` + `peft`, the logits attn
computes, and an adapter PEFT makes gives, loaded by attn, the logits PEFT computes (tiny random models, float32)."""

import json

import pytest
import torch
from reference_imports import require
from transformers import AutoModelForCausalLM

from attn.artifacts import Bundle
from attn.artifacts.adapters import adapter_family, load_adapter, save_adapter
from attn.artifacts.pretrained import SpecialIds, export_pretrained
from attn.core.errors import CheckpointError
from attn.core.lora import LoRAConfig, add_lora
from attn.core.presets import preset
from attn.models import build_model

peft = require("peft")

# preset, family, the targets adapted (every module the family has), a PEFT-style subset
CASES = {
    "llama": (preset("llama-3.2-1b-tiny"), "llama",
              ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), ("q_proj", "v_proj")),
    "gpt2": (preset("gpt2-tiny"), "gpt2", ("c_attn", "c_proj", "c_fc"), ("c_attn",)),
}


def randomised(model, seed=0, only=""):
    """Every parameter whose name holds `only` drawn from N(0, 0.2), LayerNorm gains around 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if only in name:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2 + name.endswith("norm.weight"))
    return model.eval()


def logits(model, ids):
    """attn's logits, or a `transformers` model's."""
    with torch.no_grad():
        out = model(ids)
    return getattr(out, "logits", out)


@pytest.mark.parametrize("case", CASES)
def test_peft_runs_an_adapter_attn_saved_as_attn_does(case, tmp_path, tokens):
    config, family, targets, _ = CASES[case]
    model = randomised(build_model(config))
    export_pretrained(model, config, tmp_path / "base", family, ids=SpecialIds(eos=0))
    randomised(add_lora(model, LoRAConfig(rank=4, alpha=8, targets=targets)), seed=1, only=".lora.")
    save_adapter(model, config, tmp_path / "adapter", family, base=str(tmp_path / "base"))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    ids = tokens(2, 12)
    plain = logits(hf, ids)
    adapted = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    expected = logits(adapted, ids)
    assert (expected - plain).abs().mean() > 0.05  # the adapter moves the logits far beyond the tolerance
    torch.testing.assert_close(logits(model, ids), expected, atol=1e-4, rtol=0)
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written["fan_in_fan_out"] == (family == "gpt2") and sorted(written["target_modules"]) == sorted(targets)


def modules(targets, few, chosen):
    """PEFT's target_modules: every module, a subset, or the subset as a regular expression over module paths."""
    return {"every-module": list(targets), "subset": list(few), "regex": rf".*\.({'|'.join(few)})"}[chosen]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("chosen", ["every-module", "subset", "regex"])
def test_attn_runs_an_adapter_peft_made_as_peft_does(case, chosen, tmp_path, tokens):
    config, family, targets, few = CASES[case]
    model = randomised(build_model(config))
    export_pretrained(model, config, tmp_path / "base", family, ids=SpecialIds(eos=0))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    lora = peft.LoraConfig(r=4, lora_alpha=12, target_modules=modules(targets, few, chosen),
                           task_type="CAUSAL_LM", fan_in_fan_out=family == "gpt2")
    made = peft.get_peft_model(hf, lora)
    randomised(made, seed=2, only="lora_").save_pretrained(tmp_path / "adapter")
    ids = tokens(2, 12)
    plain = logits(model, ids)
    load_adapter(model, config, tmp_path / "adapter", family)
    expected = logits(made.eval(), ids)
    assert (expected - plain).abs().mean() > 0.05
    torch.testing.assert_close(logits(model.eval(), ids), expected, atol=1e-4, rtol=0)


def peft_adapter(folder, config, family, targets, **options):
    """An adapter as PEFT writes it, with adapter_config.json's `options` changed."""
    model = build_model(config)
    add_lora(model, LoRAConfig(rank=2, targets=targets))
    save_adapter(model, config, folder, family)
    settings = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**settings, **options}))
    return folder


@pytest.mark.parametrize("options, named", [
    ({"use_dora": True}, "use_dora=True"),
    ({"use_rslora": True}, "use_rslora=True"),
    ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
    ({"peft_type": "IA3"}, "peft_type is 'IA3'"),
    ({"target_modules": ["q_proj", "lm_head"]}, "'lm_head'"),
])
def test_an_option_attn_does_not_implement_is_refused_by_name(options, named, tmp_path):
    config = preset("llama-3.2-1b-tiny")
    folder = peft_adapter(tmp_path, config, "llama", ("q_proj",), **options)
    with pytest.raises(CheckpointError, match="adapter_config.json") as err:
        load_adapter(build_model(config), config, folder, "llama")
    assert named in str(err.value)


def test_an_adapter_of_another_base_names_the_key_and_its_shapes(tmp_path):
    config = preset("llama-3.2-1b-tiny")
    folder = peft_adapter(tmp_path, config.replace(d_model=64, head_size=8), "llama", ("q_proj",))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.q_proj\.lora_A\.weight.*has shape "
                                              r"\(2, 64\).*\(2, 32\)"):
        load_adapter(build_model(config), config, folder, "llama")


def test_a_key_the_config_does_not_name_is_refused(tmp_path):
    config = preset("llama-3.2-1b-tiny")
    folder = peft_adapter(tmp_path, config, "llama", ("q_proj", "v_proj"), target_modules=["q_proj"])
    with pytest.raises(CheckpointError, match="unknown key .*v_proj"):
        load_adapter(build_model(config), config, folder, "llama")


@pytest.mark.parametrize("name, family", [("char-gpt-tiny", "gpt2"), ("llama-3.2-1b-tiny", "llama"),
                                          ("qwen3-0.6b-tiny", "qwen3"), ("paper-base-tiny", None)])
def test_a_model_attn_trained_takes_the_names_of_the_family_it_exports_to(name, family):
    config = preset(name)
    bundle = Bundle(model=build_model(config), tokenizer=None, task="lm", model_config=config, path=name)
    if family is None:
        with pytest.raises(CheckpointError, match="no Hugging Face family expresses this model"):
            adapter_family(bundle)
    else:
        assert adapter_family(bundle) == family
