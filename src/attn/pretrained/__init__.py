"""Real pretrained weights: Hugging Face GPT-2, BERT and Marian directories in and out of `attn`.

`load_pretrained(directory)` reads a local Hugging Face directory into our model (and its
tokenizer); `export_pretrained` writes one of our models as a directory `transformers` loads.
Foreign weight names live only in the families' key tables (`gpt2`, `bert`, `marian`), read by
one engine (`keymap`) in both directions.
"""

from attn.pretrained.embedding import embed_texts
from attn.pretrained.files import FAMILIES, PretrainedInfo, export_pretrained, load_pretrained
from attn.pretrained.keymap import SpecialIds

__all__ = ["FAMILIES", "PretrainedInfo", "SpecialIds", "embed_texts", "export_pretrained", "load_pretrained"]
