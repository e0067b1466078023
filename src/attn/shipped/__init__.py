"""What `attn` ships besides code: the run configs (`configs/`) and the corpora (`data/`).

In the repository both folders sit at the top, where the README points. A wheel carries them inside
this package (`attn/shipped/configs`, `attn/shipped/data`: the `package-dir` entries of
pyproject.toml), so that an installed `attn` finds them from any directory.

Paths in a run config or on the command line stay relative to the working directory. `locate`
adds one fallback: a relative path that starts with `configs/` or `data/` and does not exist
there names the shipped copy (`data/bible-en-es/test.tsv`, `configs/translation-quick.toml`).
The working directory always comes first, so a user's own `data/` folder is never shadowed.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

FOLDERS = ("configs", "data")


def folder(name: str) -> Path:
    """The shipped folder `name` ("configs" or "data").

    Returns:
        The installed package's copy; in a source tree (an editable install, or `PYTHONPATH=src`),
        where the package holds none, the repository's top-level folder.
    """
    if name not in FOLDERS:
        raise ValueError(f"no shipped folder {name!r}; choose one of {', '.join(FOLDERS)}")
    packaged = resources.files(__name__) / name
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / name  # src/attn/shipped/__init__.py -> the repository


def locate(path: str | Path) -> Path:
    """`path` itself when it exists or is not under `configs/` or `data/`, else the shipped file it names.

    A shipped name that does not exist either is returned unchanged, so that errors name the path
    the user gave.
    """
    path = Path(path)
    if path.exists() or path.is_absolute() or len(path.parts) < 2 or path.parts[0] not in FOLDERS:
        return path
    shipped = folder(path.parts[0]).joinpath(*path.parts[1:])
    return shipped if shipped.exists() else path
