"""What both engines answer when they cannot take or finish a request: one wording, one metric.

Each engine (``batching.Batcher`` for classification, ``scheduler.Scheduler`` for translation) owns
one ``Admission``: it refuses new work once the engine is closing (503 ``shutting_down``), turns a
full queue into 503 ``overloaded`` with ``Retry-After`` (and counts the rejection), names the error
every request of a failed onnxruntime run receives (500 ``inference_failed``) and the one a request
gets when its deadline passes first (504 ``deadline_exceeded``).
"""

from __future__ import annotations

from typing import Protocol

from service.errors import DeadlineExceeded, InferenceFailed, Overloaded, ShuttingDown


class RejectionObserver(Protocol):
    def rejected(self) -> None: ...


class Admission:
    def __init__(self, name: str, retry_after_s: int, observer: RejectionObserver) -> None:
        self.name = name
        self.closed = False
        self._retry_after = str(retry_after_s)
        self._observer = observer

    def check_open(self) -> None:
        if self.closed:
            raise self.shutting_down()

    def overloaded(self, queued: int, bound: int, unit: str) -> Overloaded:
        """The error for a request that does not fit the queue, counted as a rejection."""
        self._observer.rejected()
        return Overloaded(
            f"model {self.name} has {queued} {unit} queued (bound {bound}); retry later",
            headers={"Retry-After": self._retry_after},
        )

    def shutting_down(self) -> ShuttingDown:
        return ShuttingDown(f"model {self.name} is shutting down")

    def failed(self, request_id: str | None = None) -> InferenceFailed:
        of = f" for request {request_id}" if request_id else ""
        return InferenceFailed(f"inference failed in model {self.name}{of}; see the server log")

    def deadline_exceeded(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"the request's deadline passed before model {self.name} answered it")
