"""Reading UTF-8 text files, whole or line by line, gunzipped when the name ends in `.gz`.

A UTF-8 byte-order mark at the start is dropped, and a defect (invalid UTF-8, a binary file, broken gzip) is a
`DataFormatError` that names the file, the 1-based line and the fix.
"""

from __future__ import annotations

import codecs
import gzip
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from attn.core.errors import DataFormatError, TextError
from attn.shipped import locate

MAX_LINE_CHARS = 100_000
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(text: str, field: str | None = None) -> str:
    """`text`, unchanged, refused when it is not valid Unicode: the one policy for every input.

    A lone surrogate cannot be encoded as UTF-8, so no tokenizer can read it. It reaches a `str` from an unpaired
    JSON escape (`"\\ud800"`), or from bytes that are not UTF-8 in a command-line argument or the terminal's input,
    which Python keeps as U+DC80..U+DCFF (`surrogateescape`).

    Args:
        field: where it came from (a flag, a request field, "file:line field"), for the message.

    Raises:
        TextError: `text` holds a lone surrogate; names the field, the character and its position.
    """
    found = None if text.isascii() else _SURROGATE.search(text)
    if found is None:
        return text
    code = ord(found.group())
    if 0xDC80 <= code <= 0xDCFF:  # most likely a byte that was not UTF-8
        what = f"U+{code:04X} (the byte 0x{code - 0xDC00:02x} of text that is not UTF-8)"
        fix = "give the text in UTF-8"
    else:
        what, fix = f"U+{code:04X}", "a \\ud800-\\udbff JSON escape must be followed by a \\udc00-\\udfff one"
    raise TextError(f"is not valid Unicode: a lone surrogate {what} at character {found.start()}; {fix}", field)


def read_text(path: str | Path) -> str:
    """Read a whole UTF-8 text file, gunzipping it when its name ends in `.gz`.

    Args:
        path: a `data/...` path that the working directory lacks names the shipped corpus file.

    Returns:
        The text, line ends unchanged, without a leading byte-order mark.

    Raises:
        DataFormatError: the file is missing, not valid gzip, not valid UTF-8 or binary.
    """
    found = locate(path)
    return decode_text(_read_bytes(found), str(found))


def iter_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 text file, gunzipped when its name ends in `.gz`, read one at a time.

    Yields:
        Each line with its line end as `\n` (a `\r` before it dropped), without a leading byte-order mark.

    Raises:
        DataFormatError: the file is missing, not valid gzip, or a line is not valid UTF-8 or binary (names the line).
    """
    for text in read_pieces(locate(path), 1):
        yield text.removesuffix("\r\n") + "\n" if text.endswith("\r\n") else text


def read_pieces(path: Path, size: int, progress: Callable[[int], object] = lambda read: None) -> Iterator[str]:
    """The text of a UTF-8 file in pieces of whole lines, gunzipped when its name ends in `.gz`.

    Args:
        size: the bytes a piece grows to before it ends with its line (1: a line at a time).
        progress: told, after each piece, how many more bytes of the file (compressed) were read.

    Raises:
        DataFormatError: the file cannot be read, is not valid gzip, or a piece is not valid UTF-8 or binary (names
            the line).
    """
    try:
        raw = open(path, "rb")  # closed by the with below, together with the gzip reader over it
    except OSError as err:
        raise unreadable(path, err) from err
    zipped = path.suffix == ".gz"
    errors = GZIP_ERRORS if zipped else (OSError,)
    with raw, (gzip.GzipFile(fileobj=raw) if zipped else raw) as stream:
        line, done = 1, 0
        while True:
            try:
                lines = stream.readlines(size)
            except errors as err:
                raise (not_gzip(path, err) if zipped else unreadable(path, err)) from err
            if not lines:
                return
            yield decode_text(b"".join(lines), str(path), line)
            line += len(lines)
            progress(raw.tell() - done)
            done = raw.tell()


def decode_text(data: bytes, source: str, line: int = 1) -> str:
    """UTF-8 bytes -> text, without a leading byte-order mark.

    Args:
        data: the bytes of a file or of standard input, or whole lines of a file read piece by piece.
        source: what they came from, for the message (a path, or "<stdin>").
        line: the 1-based line `data` starts on; a byte-order mark is dropped only at line 1 (a file's start).

    Raises:
        DataFormatError: the bytes are binary (hold a NUL byte) or not valid UTF-8; names the line.
    """
    if line == 1:
        data = data.removeprefix(codecs.BOM_UTF8)
    # Text never holds a NUL byte; checked first, so that a binary file is called binary, not "invalid UTF-8".
    nul = data.find(b"\x00")
    if nul >= 0:
        message = ("contains a NUL byte, so it is binary (or UTF-16) rather than text; give a UTF-8 text file, "
                   "or re-save the file as UTF-8")
        raise DataFormatError(source, message, data.count(b"\n", 0, nul) + line)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        where = data.count(b"\n", 0, err.start) + line
        raise DataFormatError(
            source, f"invalid UTF-8 (byte 0x{data[err.start]:02x}); re-save the file as UTF-8", where
        ) from err


GZIP_ERRORS = (OSError, EOFError, zlib.error)  # what gunzipping a broken file raises


def unreadable(path: Path, err: OSError) -> DataFormatError:
    """The error for a file that cannot be opened or read."""
    return DataFormatError(str(path), f"cannot be read ({err.strerror}); check the path")


def not_gzip(path: Path, err: Exception) -> DataFormatError:
    """The error for a `.gz` file that does not gunzip (one of `GZIP_ERRORS`)."""
    return DataFormatError(
        str(path), f"is not a valid gzip file ({err}); compress it again with gzip or drop the .gz suffix"
    )


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise unreadable(path, err) from err
    if path.suffix != ".gz":
        return data
    try:
        return gzip.decompress(data)
    except GZIP_ERRORS as err:
        raise not_gzip(path, err) from err
