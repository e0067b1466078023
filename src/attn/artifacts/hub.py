"""Models named by their Hugging Face Hub repository, `ORG/NAME` or `ORG/NAME:QUANT`, kept in huggingface_hub's cache.

A name with a quantization tag (llama.cpp's `-hf` form) is the repository's one `.gguf` file whose name holds the tag,
case-insensitive and as a whole part of the name (`F16` does not match `BF16`). A name without one is the snapshot
folder of a Hugging Face model (`config.json`, its weights and tokenizer files), else the repository's only `.gguf`
file. huggingface_hub lists the repository and downloads what its cache lacks, with its progress bar; with
`HF_HUB_OFFLINE=1`, or where the Hub cannot be reached, the cache alone answers, and a file it lacks is a
`CheckpointError` that names the repository, the file and how to fetch it. huggingface_hub is imported inside the
functions, when a name needs it, not by every command that starts.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path

from tqdm.auto import tqdm

from attn.core.errors import CheckpointError

HUB_NAME = re.compile(r"(?P<repo>\w[\w.-]*/\w[\w.-]*)(?::(?P<quant>\w[\w.-]*))?")
# What the Hugging Face importer reads besides the weights (`attn.artifacts.pretrained.families`): config.json,
# generation and tokenizer settings, tokenizer files, Marian's SentencePiece models, the chat template.
IMPORTED = ("*.json", "*.txt", "*.spm", "*.jinja")
WEIGHTS = ("*.safetensors", "pytorch_model.bin")  # the first form a repository holds is fetched
LISTED = ("*.gguf", *IMPORTED, *WEIGHTS)


def is_hub_name(name: str) -> bool:
    """Whether `name` has the form of a Hub model, `ORG/NAME` or `ORG/NAME:QUANT`."""
    return HUB_NAME.fullmatch(name) is not None


def hub_model(name: str) -> Path:
    """The local path of the Hub model `name` (see the module's docstring), downloaded when the cache lacks it.

    Returns:
        a `.gguf` file, or the snapshot folder of a Hugging Face model.

    Raises:
        CheckpointError: the repository holds no model attn reads, or several `.gguf` files the name does not choose
            between (the message lists them), or the files are neither in the cache nor downloadable.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    match = HUB_NAME.fullmatch(name)
    if match is None:
        raise CheckpointError(f"{name}: not a Hugging Face Hub model name; write ORG/NAME or ORG/NAME:QUANT")
    repo, quant = match["repo"], match["quant"]
    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise CheckpointError(f"{name}: not a Hugging Face Hub model name ({error}); write ORG/NAME or "
                              "ORG/NAME:QUANT") from None
    files, unreached = _listing(repo)
    wanted = files_to_fetch(repo, quant, files)
    folder = _fetched(repo, wanted, unreached)
    return folder / wanted[0] if wanted[0].endswith(".gguf") else folder


def files_to_fetch(repo: str, quant: str | None, files: Sequence[str]) -> list[str]:
    """The files of `repo` (whose listing is `files`) that the name with `quant` stands for.

    Raises:
        CheckpointError: no model attn reads, or not exactly one `.gguf` file matched; the message lists them.
    """
    if quant is None and "config.json" in files:
        return _huggingface_files(files)
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    tag = re.compile(rf"(?<![a-z0-9]){re.escape(quant.lower())}(?![a-z0-9])") if quant else None
    chosen = [f for f in ggufs if tag is None or tag.search(Path(f).name.lower())]
    if len(chosen) == 1:
        return chosen
    if not ggufs:
        raise CheckpointError(f"{repo}: the repository holds neither a .gguf file nor a Hugging Face model "
                              "(config.json); name a repository of GGUF files or of safetensors weights")
    listed = ", ".join(ggufs)
    if quant is None:
        raise CheckpointError(f"{repo}: the repository holds several .gguf files ({listed}); choose one with "
                              f"{repo}:QUANT, for example {repo}:Q4_K_M")
    raise CheckpointError(f"{repo}: {'several' if chosen else 'none'} of its .gguf files match {quant!r} "
                          f"({listed}); give a quantization tag that names exactly one of them")


def _huggingface_files(files: Sequence[str]) -> list[str]:
    """config.json, the other files the importer reads, and the weights in the first form of `WEIGHTS` present."""
    top = [f for f in files if "/" not in f]

    def matching(pattern: str) -> list[str]:
        return sorted(f for f in top if fnmatch(f, pattern))

    weights = next((found for form in WEIGHTS if (found := matching(form))), [])
    settings = sorted({f for pattern in IMPORTED for f in matching(pattern)} - {"config.json"})
    return ["config.json", *settings, *weights]


class _Quiet(tqdm):
    """No progress bar: listing a repository downloads nothing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **{**kwargs, "disable": True})


def _listing(repo: str) -> tuple[list[str], BaseException | None]:
    """The repository's files (those `LISTED`) from the Hub, else from the cache; and why the Hub did not answer."""
    from huggingface_hub import get_cached_repo_tree, snapshot_download
    from huggingface_hub.errors import (
        CachedRepoTreeNotFoundError,
        DryRunError,
        LocalEntryNotFoundError,
    )

    try:
        found = snapshot_download(repo, allow_patterns=list(LISTED), dry_run=True, tqdm_class=_Quiet)
        return [info.filename for info in found], None
    except DryRunError as error:  # offline, unreachable, or the Hub does not know the repository
        unreached = error.__cause__ or error
    try:  # the Hub's listing that the last download kept
        return [entry.path for entry in get_cached_repo_tree(repo)], unreached
    except CachedRepoTreeNotFoundError:
        pass
    try:  # files that reached the cache one at a time (`hf download ORG/NAME FILE`, transformers)
        folder = Path(snapshot_download(repo, local_files_only=True))
    except LocalEntryNotFoundError:
        raise _not_cached(repo, (), unreached) from None
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()), unreached


def _fetched(repo: str, files: Sequence[str], unreached: BaseException | None) -> Path:
    """The snapshot folder holding `files`, downloaded where the Hub answers."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo, allow_patterns=[glob.escape(f) for f in files]))
    except LocalEntryNotFoundError as error:  # IncompleteSnapshotError too: the cache lacks a file
        folder, unreached = None, unreached or error.__cause__ or error
    except HfHubHTTPError as error:
        raise CheckpointError(f"{repo}: the Hub refused the download ({str(error).splitlines()[0]}); log in with "
                              "`hf auth login` if the repository is gated or private") from None
    missing = [f for f in files if folder is None or not (folder / f).is_file()]
    if missing:
        raise _not_cached(repo, missing, unreached)
    return folder


def _not_cached(repo: str, files: Sequence[str], unreached: BaseException | None) -> CheckpointError:
    """The error for `files` of `repo` (none: the whole repository), which the cache lacks and the Hub did not give."""
    from huggingface_hub import constants

    lacks = f"does not hold {', '.join(files)}" if files else "does not hold this repository, nor is it a local path"
    fetch = f"`{' '.join(['hf download', repo, *files])}` where the Hub can be reached"
    if constants.HF_HUB_OFFLINE:
        why = f"HF_HUB_OFFLINE=1 keeps it from being downloaded: unset HF_HUB_OFFLINE, or fetch it with {fetch}"
    else:
        reason = str(unreached).strip().splitlines()[0] if str(unreached).strip() else "no answer"
        why = (f"the Hub did not give it ({type(unreached).__name__}: {reason}): check the name and the network, or "
               f"fetch it with {fetch}")
    return CheckpointError(f"{repo}: the Hugging Face cache ({constants.HF_HUB_CACHE}) {lacks}, and {why}")
