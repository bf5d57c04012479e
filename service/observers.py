"""The observer that ignores every event, for the engines run without metrics (tests, benchmarks).

The batcher, the translation scheduler and the attention store each declare what they report in a
``Protocol`` of their own (``BatchObserver``, ``DecodeObserver``, ``StoreObserver``); the service
passes them views of its Prometheus metrics (``service/metrics.py``), and this stands in otherwise.
"""

from __future__ import annotations

from typing import Any


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


class Unobserved:
    """Answers every event method with a call that does nothing."""

    def __getattr__(self, name: str) -> Any:
        return _ignore


UNOBSERVED: Any = Unobserved()
