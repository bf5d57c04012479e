"""What an engine does when one of its loops fails (a lane of the scheduler, an instance thread of the
batcher): after Erlang's supervisors, restart it, but not in a loop.

Each failure is counted (``attnserve_engine_restarts_total``) and the loop restarts at once. When
``limit`` failures fall within ``window_s`` seconds the engine is *unhealthy*: the model is reported
not ready (``/readyz``, the Open Inference Protocol's ready calls), so a load balancer moves traffic
elsewhere, and each further restart waits longer (1 s, 2 s, 4 s ... at most ``MAX_BACKOFF_S``) instead of
spinning. Requests that still arrive are served by the loops that work. Once the window holds fewer
than ``limit`` failures again (no failure for ``window_s``), the engine is healthy again.
"""

from __future__ import annotations

import threading
import time
from collections import deque

MAX_BACKOFF_S = 30.0


class Supervision:
    def __init__(self, limit: int = 3, window_s: float = 60.0, clock=time.monotonic) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._failures: deque[float] = deque()
        self._last: str | None = None
        self._lock = threading.Lock()  # the batcher's threads fail on their own threads
        self.restarts = 0

    def failed(self, error: BaseException) -> float:
        """Records a failure; the seconds the loop waits before it restarts (0 while healthy)."""
        with self._lock:
            now = self._clock()
            self._forget(now)
            self._failures.append(now)
            self._last = f"{type(error).__name__}: {error}"[:200]
            self.restarts += 1
            over = len(self._failures) - self.limit
        return 0.0 if over < 0 else min(2.0**over, MAX_BACKOFF_S)

    def _forget(self, now: float) -> None:
        while self._failures and now - self._failures[0] > self.window_s:
            self._failures.popleft()

    @property
    def healthy(self) -> bool:
        with self._lock:
            self._forget(self._clock())
            return len(self._failures) < self.limit

    def reason(self) -> str | None:
        """Why the engine is not healthy, for ``/readyz``; None when it is."""
        if self.healthy:
            return None
        return (
            f"its engine failed {len(self._failures)} times in the last {self.window_s:g} s "
            f"(last: {self._last}); restarting with backoff"
        )
