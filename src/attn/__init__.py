"""attn: the Transformer of "Attention Is All You Need" and its family, in one PyTorch codebase.

The names a user needs, from the layers that define them (docs/architecture.md):

- build: `ModelConfig`, `preset`, `build_model`
- text: `Tokenizer`
- decode: `GenerationConfig`, `generate`
- load and save: `load_model` (any checkpoint, run, Hugging Face directory or packaged model) -> `Bundle`,
  `save_model`
- train: `RunConfig`, `load_run_config`, `train`
- use: `translate`, `classify`, `embed`

Each has an example in its docstring, run as a doctest by the test suite.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("attn")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

# Each public name and the module that defines it. They are imported on first use (PEP 562), so that
# `import attn.models` (or any layer) loads that layer and the ones below it, not the application.
_PUBLIC = {
    "Bundle": "attn.artifacts", "load_model": "attn.artifacts", "save_model": "attn.artifacts",
    "GenerationConfig": "attn.decoding", "generate": "attn.decoding",
    "ModelConfig": "attn.core.config", "preset": "attn.core.presets",
    "RunConfig": "attn.training",
    "Tokenizer": "attn.data.tokenizers",
    "build_model": "attn.models",
    "classify": "attn.inference.classification", "embed": "attn.inference.classification", "translate": "attn.inference.translation",
    "load_run_config": "attn.app.runs", "train": "attn.app.runs",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    """Imports a public name from its module the first time it is asked for."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'attn' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
