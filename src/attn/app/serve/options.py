"""The settings of one `attn serve`: how it listens, what it accepts, who may call it and for how long.

`ServeOptions` checks itself when built, so a bad setting is one `ConfigError` naming its flag before anything
listens.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math

from attn.core.errors import ConfigError
from attn.decoding import DEFAULT_PREFIX_CACHE_BYTES

DEFAULT_MAX_BODY_BYTES = 1 << 20
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether `host` is an address of this machine only (127.0.0.0/8, ::1, localhost): no other machine reaches it."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """How the server listens, what it accepts and who may call it.

    Attributes:
        max_body_bytes: the largest request body; a larger one gets 413.
        max_queue: the most requests per model waiting or running; one more gets 429.
        max_batch_tokens: the token budget of one batch (see `engine.Engine`).
        api_keys: the keys a client may send as `Authorization: Bearer KEY` to /v1/* and /metrics; empty: none
            needed. Never shown (`repr` leaves them out).
        insecure_no_key: allows a `host` that other machines reach without `api_keys`.
        request_timeout_s: the most seconds a request may wait in its model's queue and run; then 504 (None: no limit).
        max_tokens_cap: the most new tokens a request may ask for (`max_tokens`, `max_completion_tokens`); None: no
            cap beyond the model's positions.
        max_n: the most choices (`n`) a request may ask for; None: the schema's limit only.
        max_concurrent_per_key: the most requests of one key (of all clients when no key is set) in flight at
            once on /v1/*; one more gets 429 (None: no limit).
        cors_origins: the browser origins allowed to call the API from their pages (CORS); empty: none.
        prefix_cache_bytes: the most bytes of keys and values each decoder-only model keeps of finished rows, for
            later prompts that start with the same tokens (`attn.decoding.PrefixCache`); 0: none kept.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queue: int = 64
    batching: bool = True
    max_batch_tokens: int = 8192
    api_keys: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    insecure_no_key: bool = False
    request_timeout_s: float | None = None
    max_tokens_cap: int | None = None
    max_n: int | None = None
    max_concurrent_per_key: int | None = None
    cors_origins: tuple[str, ...] = ()
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_queue", "max_batch_tokens", "max_tokens_cap", "max_n",
                     "max_concurrent_per_key"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(_flag(name), f"must be >= 1, got {value}")
        if self.prefix_cache_bytes < 0:
            raise ConfigError("--prefix-cache-bytes", f"must be >= 0 (0 keeps none), got {self.prefix_cache_bytes}")
        if not 0 <= self.port < 65536:
            raise ConfigError("--port", f"must be in 0..65535, got {self.port}")
        timeout = self.request_timeout_s
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ConfigError("--request-timeout", f"must be a number of seconds > 0, got {timeout}")
        if not self.api_keys and not self.insecure_no_key and not is_loopback(self.host):
            raise ConfigError("--host", f"{self.host} lets other machines reach the server, which then needs an API "
                              "key: give --api-key-file FILE (or set ATTN_API_KEY), or --insecure-no-key to serve "
                              "without one")
        for origin in self.cors_origins:
            if origin != "*" and "://" not in origin:
                raise ConfigError("--cors-origin", f"{origin!r} is not an origin; give scheme://host[:port], such "
                                  "as https://example.com")

    @property
    def exposed_without_key(self) -> bool:
        """Whether other machines may reach the server and no key is needed (what start-up warns about)."""
        return not self.api_keys and not is_loopback(self.host)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
