"""Model loading: one way in (`load_model` -> `Bundle`) and one way out (`save_model`).

`checkpoint` is the `attn` checkpoint format; `pretrained` converts Hugging Face directories;
`hub` finds Hub models in huggingface_hub's cache; `devices` resolves device names; `dtypes` chooses the
dtype of float weights; `loading` puts them together. Everything that loads or uses a
model goes through here, and nothing here imports `attn.training`.
"""

from attn.artifacts.checkpoint import (
    Checkpoint,
    load_checkpoint,
    resolve_checkpoint,
    write_checkpoint,
)
from attn.artifacts.devices import resolve_device
from attn.artifacts.loading import (
    PACKAGED_MODELS,
    Bundle,
    is_huggingface_dir,
    load_model,
    resolve_model,
    save_model,
)

__all__ = [
    "PACKAGED_MODELS", "Bundle", "Checkpoint", "is_huggingface_dir", "load_checkpoint", "load_model",
    "resolve_checkpoint", "resolve_device", "resolve_model", "save_model", "write_checkpoint",
]
