"""attn: the Transformer of "Attention Is All You Need" and its family, in one PyTorch codebase."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attn")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"
