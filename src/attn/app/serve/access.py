"""Who may call the server, and how much: API keys, the per-key concurrency limit, and the server's caps on
what one request may ask for (new tokens, choices, time).

With keys set, every route under /v1/ and /metrics needs `Authorization: Bearer KEY`; the page at / and /health
stay open. The key a request sends is compared with every key in constant time, so the time of an answer says
nothing about how much of a key was right. A key is never written to a log, an error or a metric.
"""

from __future__ import annotations

import collections
import hmac
import os
from collections.abc import Mapping
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from attn.app.serve.errors import ApiError
from attn.app.serve.gate import send_error
from attn.app.serve.options import ServeOptions
from attn.core.errors import ConfigError

KEY_ENV = "ATTN_API_KEY"
PER_KEY_RETRY_S = 1
_SCHEME = b"bearer "
_MISSING = ("this server needs an API key: send the header \"Authorization: Bearer KEY\" with a key that its "
            "operator gave you")
_WRONG = ("the API key is not valid, or the header is not \"Authorization: Bearer KEY\"; check the key that the "
          "server's operator gave you")


def needs_key(path: str) -> bool:
    """Whether `path` is behind the key when one is set: every route under /v1/, and /metrics."""
    return path.startswith("/v1/") or path == "/metrics"


def read_key_file(path: str | Path) -> tuple[str, ...]:
    """The keys of an API key file: one per line; blank lines and lines that start with # are skipped.

    Raises:
        ConfigError: the file cannot be read, holds no key, or a line holds a space or a character outside
            printable ASCII; the message names the file and line, never a key.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ConfigError("--api-key-file", f"{path}: cannot be read ({reason}); give a readable UTF-8 file with one "
                          "key per line") from None
    keys = []
    for number, line in enumerate(lines, 1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        _check_key(key, f"{path}:{number}", "--api-key-file")
        keys.append(key)
    if not keys:
        raise ConfigError("--api-key-file", f"{path} holds no key; write one key per line (blank lines and lines "
                          "starting with # are skipped)")
    return tuple(keys)


def api_keys(key_file: str | Path | None, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The keys of `key_file` (if given) and of the ATTN_API_KEY variable (if set): all of them are accepted.

    Raises:
        ConfigError: an unreadable or empty key file, or ATTN_API_KEY set to an empty or unusable key.
    """
    keys = read_key_file(key_file) if key_file is not None else ()
    if KEY_ENV in environ:
        key = environ[KEY_ENV].strip()
        if not key:
            raise ConfigError(KEY_ENV, "is set but empty; set it to the key, or unset it")
        _check_key(key, KEY_ENV, KEY_ENV)
        keys += (key,)
    return keys


def _check_key(key: str, where: str, field: str) -> None:
    if not key.isascii() or not key.isprintable() or " " in key or "\t" in key:
        raise ConfigError(field, f"{where}: a key must be printable ASCII without spaces (an HTTP header carries "
                          "nothing else); write it again")


class AccessGate:
    """ASGI middleware: 401 for a guarded route without a valid key, 429 for one more request of a key that has
    `max_concurrent_per_key` in flight. Without keys, every client counts as one for the concurrency limit."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], max_concurrent_per_key: int | None) -> None:
        self.app = app
        self._keys = tuple(key.encode("ascii") for key in keys)
        self.max_concurrent_per_key = max_concurrent_per_key
        self.in_flight: collections.Counter[int] = collections.Counter()  # by the position of the key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not needs_key(scope["path"]):
            await self.app(scope, receive, send)
            return
        authorization = dict(scope["headers"]).get(b"authorization")
        holder = self.holder(authorization or b"")
        if holder is None:
            await send_error(send, 401, _MISSING if authorization is None else _WRONG, {"WWW-Authenticate": "Bearer"})
            return
        limit = self.max_concurrent_per_key
        if limit is None or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        if self.in_flight[holder] >= limit:
            await send_error(send, 429, f"this API key has {limit} requests in flight, the server's limit "
                             f"(--max-concurrent-per-key); retry after {PER_KEY_RETRY_S} s",
                             {"Retry-After": str(PER_KEY_RETRY_S)})
            return
        self.in_flight[holder] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[holder] -= 1

    def holder(self, authorization: bytes) -> int | None:
        """The position of the key that `authorization` ("Bearer KEY") carries; 0 when the server needs no key;
        None when it needs one and the header holds none of its keys."""
        if not self._keys:
            return 0
        given = authorization[len(_SCHEME):].strip() if authorization[:len(_SCHEME)].lower() == _SCHEME else b""
        matches = [hmac.compare_digest(given, key) for key in self._keys]  # every key, whichever matches
        return matches.index(True) if any(matches) else None


# -- what one request may ask for -----------------------------------------------------------------


def token_limit(options: ServeOptions, asked: int | None, param: str) -> int | None:
    """The new tokens a request asks for in `param`, refused (422) above the server's cap; None stays None, for
    `held_to_cap` once the route has chosen its default."""
    cap = options.max_tokens_cap
    if asked is not None and cap is not None and asked > cap:
        raise ApiError(422, f"{param}: {asked} is more than this server's cap of {cap} new tokens (--max-tokens-cap); "
                       f"ask for at most {cap}", param)
    return asked


def held_to_cap(options: ServeOptions, default: int) -> int:
    """A route's default number of new tokens, at most the server's cap."""
    return default if options.max_tokens_cap is None else min(default, options.max_tokens_cap)


def check_choices(options: ServeOptions, n: int) -> None:
    """Refuses more choices per prompt than the server's `--max-n` (422 naming `n`)."""
    if options.max_n is not None and n > options.max_n:
        raise ApiError(422, f"n: {n} choices are more than this server's cap of {options.max_n} (--max-n); ask for at "
                       f"most {options.max_n}", "n")


def timed_out(options: ServeOptions) -> ApiError:
    """The 504 of a request that waited and ran longer than `--request-timeout` (its work was cancelled)."""
    return ApiError(504, f"the request took longer than this server's limit of {options.request_timeout_s:g} s "
                    "(--request-timeout) and was stopped; ask for less (fewer inputs or tokens), or retry later")
