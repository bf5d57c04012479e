"""``service.memory``: freed C heap pages go back to the system (glibc's ``malloc_trim``), and glibc's malloc
arenas are capped in every process that serves."""

from __future__ import annotations

import ctypes
import json
import platform
import subprocess
import sys

import pytest

from service.memory import release_freed_memory
from tests.service.service_testing import ROOT, start_subprocess_server, wait_until

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


# A fresh interpreter: cores + 4 threads, each holding a malloc'd block at once, then glibc's own count of
# its arenas (malloc_info's <heap> elements); with the cap first when asked.
ARENAS_PROBE = """
import ctypes, json, os, re, sys, tempfile, threading
from service.memory import limit_arenas
cap = limit_arenas() if sys.argv[1] == "capped" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
threads = max(2, len(os.sched_getaffinity(0))) + 4
held, done = threading.Barrier(threads + 1), threading.Barrier(threads + 1)
def work():
    block = libc.malloc(4096)
    held.wait()
    done.wait()
    libc.free(block)
workers = [threading.Thread(target=work) for _ in range(threads)]
for w in workers:
    w.start()
held.wait()
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    stream = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    arenas = len(re.findall(r'<heap nr="', open(out.name).read()))
done.wait()
for w in workers:
    w.join()
print(json.dumps({"cap": cap, "threads": threads, "arenas": arenas}))
"""


def arenas_of(mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", ARENAS_PROBE, mode], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_the_arena_cap_holds_however_many_threads_allocate(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    capped, free = arenas_of("capped"), arenas_of("free")
    assert capped["cap"] >= 2 and capped["arenas"] <= capped["cap"]
    assert free["arenas"] > capped["cap"]  # without the cap, the same threads make more arenas


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_every_worker_process_caps_its_own_arenas(tiny_vit_repository, tmp_path, monkeypatch):
    """``python -m service`` with two workers: uvicorn starts them fresh (spawned, not forked), so a cap
    set in the parent would not reach them; each worker sets its own when it builds its app."""
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    srv = start_subprocess_server(tmp_path, tiny_vit_repository, workers="2")
    try:

        def capped_pids() -> set[int]:
            return {line["pid"] for line in srv.logs() if line.get("message", "").startswith("malloc arenas capped")}

        # before either loads a model; a generous bound: two fresh interpreters start on a busy machine
        pids = wait_until(lambda: len(capped_pids()) == 2 and capped_pids(), timeout=180, what="both workers' caps")
        assert srv.proc.pid not in pids  # the workers, not the supervisor
    finally:
        srv.stop()
