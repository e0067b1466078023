"""Real pretrained weights: Hugging Face directories in and out of `attn`.

Foreign weight names live only in the families' key tables (`gpt2`, `bert`, `marian`, `llama`), read by one
engine (`keymap`) in both directions. Use a model through `attn.artifacts.load_model`, which calls the converter.
"""

from attn.artifacts.pretrained.families import (
    FAMILIES,
    PretrainedInfo,
    export_pretrained,
    load_pretrained,
)
from attn.artifacts.pretrained.hf_config import SpecialIds

__all__ = ["FAMILIES", "PretrainedInfo", "SpecialIds", "export_pretrained", "load_pretrained"]
