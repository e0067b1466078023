"""Fault injection for the crash-safety tests: kill the process at a named point.

`ATTN_FAULT="POINT:N"` makes the N-th arrival at `fault_point(POINT)` in this process send the
process SIGKILL, which nothing can catch or clean up after, as a power cut or the out-of-memory
killer would. The points are

    step              mid-update: gradients computed, optimizer step not yet taken
    checkpoint-write  every checkpoint file written to the temporary directory, not yet renamed
    eval              one validation batch scored, the evaluation not finished
    tokenizer-write   every file of a trained tokenizer written to the temporary directory, not yet renamed
    token-cache-write a token cache file written and flushed to its temporary name, not yet renamed

Unset (always, outside the tests) it costs one dictionary lookup per call.
"""

from __future__ import annotations

import collections
import os
import signal

FAULT_ENV = "ATTN_FAULT"

_arrivals: collections.Counter[str] = collections.Counter()


def fault_point(name: str) -> None:
    """Kills this process with SIGKILL if `ATTN_FAULT` names this point and arrival."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    point, _, count = spec.partition(":")
    if point != name:
        return
    _arrivals[name] += 1
    if _arrivals[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
