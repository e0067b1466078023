"""Real pretrained weights: Hugging Face directories in and out of `attn`.

`families.load_pretrained(directory)` converts a local Hugging Face directory into our model (and its
tokenizer); `families.export_pretrained` writes one of our models as a directory `transformers` loads.
Foreign weight names live only in the families' key tables (`gpt2`, `bert`, `marian`, and `llama`
for Llama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3, OLMo 2 and Phi-3, whose rotary settings `rope`
reads), read by one engine (`keymap`) in both directions. Use a model through
`attn.artifacts.load_model`, which calls the converter.
"""

from attn.artifacts.pretrained.families import (
    FAMILIES,
    PretrainedInfo,
    export_pretrained,
    load_pretrained,
)
from attn.artifacts.pretrained.hf_config import SpecialIds

__all__ = ["FAMILIES", "PretrainedInfo", "SpecialIds", "export_pretrained", "load_pretrained"]
