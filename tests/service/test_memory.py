"""``service.memory``: freed C heap pages go back to the system (glibc's ``malloc_trim``)."""

from __future__ import annotations

import ctypes
import platform

import pytest

from service.memory import release_freed_memory

MIB = 1024 * 1024


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_pages_freed_under_a_live_block_are_given_back():
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 64 MiB in 1 KiB blocks (below the mmap threshold: on the heap), each written so its page is resident
    blocks = [libc.malloc(1024) for _ in range(64 * 1024)]
    for b in blocks:
        ctypes.memset(b, 1, 1024)
    pinned = blocks.pop()  # the last block stays: free() alone cannot shrink the heap below it
    for b in blocks:
        libc.free(b)
    held = rss_mib()
    assert release_freed_memory() is True
    assert held - rss_mib() > 32  # most of the 64 MiB freed under the pinned block left the process
    libc.free(pinned)


def test_freed_memory_is_released_every_interval_until_cancelled(monkeypatch):
    import asyncio

    from service import memory

    calls = []
    monkeypatch.setattr(memory, "release_freed_memory", lambda: calls.append(1) or True)

    async def run() -> None:
        task = asyncio.create_task(memory.release_every(0.01))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seen = len(calls)
        await asyncio.sleep(0.05)
        assert len(calls) == seen  # nothing after the cancel

    asyncio.run(run())
    assert 3 <= len(calls) <= 25
