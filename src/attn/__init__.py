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

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attn")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

from attn.app.classification import classify, embed
from attn.app.translation import translate
from attn.app.runs import load_run_config, train
from attn.artifacts import Bundle, load_model, save_model
from attn.config import ModelConfig, preset
from attn.data.tokenizers import Tokenizer
from attn.decoding import GenerationConfig, generate
from attn.models import build_model
from attn.training import RunConfig

__all__ = [
    "Bundle", "GenerationConfig", "ModelConfig", "RunConfig", "Tokenizer", "build_model", "classify", "embed",
    "generate", "load_model", "load_run_config", "preset", "save_model", "train", "translate",
]
