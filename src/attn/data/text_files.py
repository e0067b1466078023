"""Text corpora of many files, read as one stream in pieces: never the whole corpus in memory.

A language model's `data.train` (or `data.valid`) names its corpus in one of these ways (`corpus_files`), mixed
freely in a TOML list or a comma-separated string:

- a file (`data/shakespeare/train.txt.gz`); `.gz` files are gunzipped as they are read;
- a directory: every file below it, sorted by path (hidden files and folders left out);
- a glob: `texts/*.txt`, or `texts/**/*.txt` for any depth; its matches sorted.

The corpus is the files' texts one after the other, as `read_text` gives each; a file that does not end in a
line end is followed by one, so that its last line does not run into the next file's first.

`text_chunks` gives that text in pieces of about `CHUNK_CHARS` characters, cut only where tokenizing the pieces
one by one gives the ids of the whole text (`safe_cut`): before a space that a letter or digit follows. A line
end is not such a place: the Metaspace pre-tokenizer of the `bpe` kind starts every text it is given with a word
boundary, and a piece that begins after a line end would gain one that the whole text does not have there; a
space is where it marks a boundary anyway. The same holds for GPT-2's byte-level pre-tokenizer (a space before a
letter or digit joins the word after it) and for WordPiece (it splits at every space). The `chars` kind may be
cut anywhere. Memory is bounded by the piece size plus the longest stretch of text without such a place.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from tqdm import tqdm

from attn.data.files import input_files
from attn.data.text import read_pieces
from attn.core.errors import ConfigError, DataFormatError

CHUNK_CHARS = 1 << 16  # characters per piece; tokenizing one holds ~100 bytes per token in Rust


def corpus_files(spec: str | Sequence[str], key: str) -> list[Path]:
    """The files a corpus setting names, in reading order (`attn.data.files.input_files`).

    Args:
        spec: a path, a directory or a glob, several of them in a list or in one string separated by commas (a
            string that names an existing path is never split).
        key: the setting, for messages (e.g. "data.train").

    Returns:
        The files; one named twice is read once, where it is first named.

    Raises:
        ConfigError: nothing is named, a path does not exist, a glob matches no file, or a directory holds no file.
    """
    entries = [spec] if isinstance(spec, str) else list(spec)
    names = [part.strip() for entry in entries for part in _split(entry)]
    names = [name for name in names if name]
    if not names:
        raise ConfigError(key, "is not set; give the path of the file, e.g. in the TOML or as an override")
    return input_files(names, key)


def _split(entry: str) -> list[str]:
    return [entry] if "," not in entry or Path(entry).exists() else entry.split(",")


def safe_cut(text: str) -> int:
    """The index of the last space that a letter or digit follows (0 if none): where `text` can be cut without
    changing its tokens."""
    end = len(text) - 1
    while (at := text.rfind(" ", 0, end)) > 0:
        if text[at + 1].isalnum():
            return at
        end = at
    return 0


def text_chunks(
    files: Sequence[Path], cut_anywhere: bool = False, chunk_chars: int = CHUNK_CHARS, progress: str = ""
) -> Iterator[str]:
    """The corpus text of `files` in pieces that can be tokenized one by one.

    Args:
        cut_anywhere: cut at any character (for the `chars` tokenizer), not only at `safe_cut`.
        chunk_chars: the size a piece grows to before it is cut.
        progress: a description for a progress bar over the bytes read; "" shows none.

    Yields:
        Non-empty pieces whose concatenation is the corpus text.

    Raises:
        DataFormatError: a file cannot be read, is not valid gzip or UTF-8, or is binary; or every file is empty.
    """
    pending: list[str] = []
    size, given = 0, False
    total = sum(path.stat().st_size for path in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc=progress, disable=not progress, leave=False) as bar:
        for text in _texts(files, chunk_chars, bar):
            pending.append(text)
            size += len(text)
            if size < chunk_chars:
                continue
            joined = "".join(pending)
            cut = len(joined) if cut_anywhere else safe_cut(joined)
            if cut:
                yield joined[:cut]
                given = True
            pending, size = [joined[cut:]], len(joined) - cut
    if size:
        yield "".join(pending)
    elif not given:
        more = f" and {len(files) - 1} more" if len(files) > 1 else ""
        raise DataFormatError(str(files[0]), f"the corpus ({len(files)} files: this one{more}) holds no text; "
                                             "give files with text")


def _texts(files: Sequence[Path], size: int, bar: tqdm) -> Iterator[str]:
    """The text of every file in pieces of whole lines (about `size` bytes), a line end added after a file that
    lacks one."""
    for number, path in enumerate(files):
        last = ""
        for last in read_pieces(path, size, bar.update):
            yield last
        if last and not last.endswith("\n") and number < len(files) - 1:
            yield "\n"
