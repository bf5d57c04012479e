"""Giving the C heap's freed pages back to the system once a model version is gone.

A model's sessions allocate and free hundreds of MiB of buffers (weights packed at load, warm-up and
attention outputs) in whichever glibc malloc arenas their threads use. Once the version is retired
and its sessions freed, glibc keeps most of those pages mapped: on the shipped models, under traffic,
each unload and load of the translator left the process 40 to 60 MiB larger, and ``malloc_trim(0)``
gave that back at once (``benchmarks/soak.py``; docs/benchmarks.md, "A 30-minute soak"). Elsewhere
than glibc there is no ``malloc_trim`` and this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time

log = logging.getLogger("attnserve.memory")


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


_trim = _malloc_trim()


def release_freed_memory() -> bool:
    """Return the free pages of every malloc arena to the system; False where the C library cannot."""
    if _trim is None:
        return False
    started = time.perf_counter()
    _trim(0)
    log.debug("malloc_trim took %.1f ms", (time.perf_counter() - started) * 1000)
    return True
