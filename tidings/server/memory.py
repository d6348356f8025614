"""The server's memory allocator: large request bodies kept on the heap.

A publish of 500 messages of 1 KiB is a body of half a megabyte, and serving it makes
several buffers of that size (the body, its decoded payloads, the store's copy). glibc
gives every allocation from 128 KiB up its own ``mmap`` and returns it at ``free``; its
dynamic threshold does not help when the sizes repeat, because an allocation as large
as the threshold is still mapped. So each request faulted fresh, zeroed pages in, and
the freed heap was trimmed back to the system at once. Measured on a W1 of 1 KiB
messages one request at a time: about half of the server's CPU per request was the
kernel's, most of it page faults; with the thresholds below that system time halved
and the server's CPU per request fell by 15-30 %; reading pages of 10,000 x 1 KiB
back went from ~250k to ~350k msg/s (BENCHMARKS.md, "Large request bodies
sent beside their head, and kept on the server's heap").

Only on glibc, and only where the operator has not set glibc's own
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment variables (their
choice wins). The cost is memory the process keeps: up to :data:`TRIM_THRESHOLD` of
freed heap before it is given back.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_large_buffers"]

#: Allocations below this come from the heap (glibc's default: 128 KiB, moving up to
#: this value, its ceiling on 64-bit systems). A poll answer of 10,000 x 1 KiB is a
#: 10 MiB body: 4 MiB left those mapped afresh per page.
MMAP_THRESHOLD = 32 << 20
#: Freed heap kept for reuse before it is returned to the system (default 128 KiB).
TRIM_THRESHOLD = 64 << 20

# mallopt's parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_large_buffers() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if they were set
    (False on another C library, or where the operator set either one already)."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):  # not a name this system knows
        libc = None
    if not libc or not libc.startswith("glibc"):
        return False
    if any(name in os.environ for name in _OPERATOR_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 when it took the value.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
