"""Giving the C heap's freed pages back to the system: once a model version is gone, and every so often.

A model's sessions allocate and free hundreds of MiB of buffers (weights packed at load, warm-up and
attention outputs) in whichever glibc malloc arenas their threads use. Once the version is retired
and its sessions freed, glibc keeps most of those pages mapped: on the shipped models, under traffic,
each unload and load of the translator left the process 40 to 60 MiB larger, and ``malloc_trim(0)``
gave that back at once (``benchmarks/soak.py``; docs/benchmarks.md, "A 30-minute soak"). Elsewhere
than glibc there is no ``malloc_trim`` and this does nothing.

glibc also gives each thread that meets a busy arena an arena of its own, up to eight per core, and
each keeps its own freed pages: in the 30-minute soak on 2 cores the server held 16 arenas, 336 MiB
of heap of which 165 MiB was in use (``malloc_stats`` read through gdb). ``limit_arenas`` caps them
at one per core (at least two) when the operator has not set ``MALLOC_ARENA_MAX`` already. glibc
reads the cap per process: ``python -m service`` sets it in each process that serves
(``service/process.worker_app``), since uvicorn starts its workers afresh (spawned, not forked).

Traffic alone frees and reuses memory of every size (decoder steps' log-probs, attention outputs,
batches), and the heap keeps what it freed: ``release_every`` trims every
``ATTNSERVE_MEMORY_RELEASE_S`` seconds. A trim takes 1 to 20 ms, in a thread.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import time

log = logging.getLogger("attnserve.memory")


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


_trim = _malloc_trim()
M_ARENA_MAX = -8  # glibc's mallopt parameter


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform says, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2


def limit_arenas() -> int | None:
    """Cap glibc's malloc arenas at the cores this process may use (at least 2); the cap, or None when
    ``MALLOC_ARENA_MAX`` is set or the C library is not glibc. Call in each process before it starts the
    threads that allocate (onnxruntime's, the worker pools'): arenas made before stay."""
    if _trim is None or os.environ.get("MALLOC_ARENA_MAX"):
        return None
    arenas = max(2, available_cores())
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return arenas if libc.mallopt(M_ARENA_MAX, arenas) == 1 else None


def release_freed_memory() -> bool:
    """Return the free pages of every malloc arena to the system; False where the C library cannot."""
    if _trim is None:
        return False
    started = time.perf_counter()
    _trim(0)
    log.debug("malloc_trim took %.1f ms", (time.perf_counter() - started) * 1000)
    return True


async def release_every(interval_s: float) -> None:
    """``release_freed_memory`` every ``interval_s`` seconds, in a thread, until cancelled.

    Without it the soak's RSS climbed about 100 MiB within 15 minutes, at the translator's reloads
    under traffic, and stayed there (docs/benchmarks.md, "A 30-minute soak")."""
    while True:
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(release_freed_memory)
