"""A TCP proxy that delays what the server sends by ``delay`` seconds: a slow Redis, for the fault suite and
``benchmarks/bench_slow_redis.py``. Latency, not bandwidth: each chunk goes out ``delay`` after it came, without
holding back the chunks after it. ``delay`` may change while it runs (0: a healthy server again)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

from typing_extensions import Self


class DelayProxy:
    def __init__(self, target_port: int, delay: float, host: str = "127.0.0.1") -> None:
        self.target_port, self.delay, self.host = target_port, delay, host
        with socket.socket() as s:
            s.bind((host, 0))
            self.port = s.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delay-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def __enter__(self) -> Self:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, self.host, self.port), self._loop
        ).result(10)
        return self

    def __exit__(self, *exc) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            client_w.close()
            return
        with contextlib.suppress(asyncio.CancelledError):  # the proxy closing
            await asyncio.gather(self._pump(client_r, server_w, 0.0), self._pump(server_r, client_w, None))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float | None) -> None:
        """Copies ``reader`` to ``writer``, each chunk ``delay`` later (None: the proxy's delay now)."""
        loop = asyncio.get_running_loop()
        due: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while (item := await due.get()) is not None:
                at, data = item
                await asyncio.sleep(max(0.0, at - loop.time()))
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(65536):
                due.put_nowait((loop.time() + (self.delay if delay is None else delay), data))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            due.put_nowait(None)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await sender
