"""Freed CPU memory kept for the next step: a training step's tensors reuse pages the process already has.

glibc's malloc serves a large block with a `mmap` of its own and gives it back to the system on `free`, and it
gives the top of its heap back once enough of it is free. A training step allocates and frees the same large
activations, gradients and logits every time, so under those defaults every step maps them afresh and the
kernel faults in and zeroes every page again (the faults and the steps, each way: `benchmarks/results/cores/`).

`keep_freed_memory` raises both thresholds to `KEEP_BYTES`, so freed memory stays with the process for the next
step: after the first steps a step faults in no page at all, and the process keeps the memory of its largest
step (its peak is the same). Where the C library is not glibc it does nothing.

The setting is the whole process's, so it is the application's choice: `attn train`, `attn quickstart` and
`attn serve` make it once at start-up (`ATTN_KEEP_MEMORY=0` leaves glibc's defaults), and the library never
does. A program that trains with the library can set `GLIBC_TUNABLES` to `TUNABLES` before Python starts.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
KEEP_BYTES = 1 << 30  # blocks up to 1 GiB come from the heap, and up to 1 GiB of free heap is kept
# The same setting from the environment, for a program that uses the library.
TUNABLES = f"glibc.malloc.trim_threshold={KEEP_BYTES}:glibc.malloc.mmap_threshold={KEEP_BYTES}"


def keep_freed_memory() -> bool:
    """Makes glibc's malloc keep freed memory for reuse (see the module); True if it did, False if not glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(mallopt(parameter, KEEP_BYTES) == 1 for parameter in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD))
