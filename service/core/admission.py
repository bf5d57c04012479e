"""The bound on requests in front of the queues: at most so many requests that queue work at once.

One bound per process, whatever the transport: an HTTP request that queues work (``Route.deadline``:
classify, translate, OIP infer) and a gRPC ``ModelInfer`` call (or one request of a
``ModelStreamInfer`` stream) count against the same ``InFlight``. A request is counted from the
moment its transport knows what it asks for until its answer is sent: while its body is read and
parsed, while it waits in a model's queue, while it computes. The queues bound only the second part;
under more load than the machine can take, requests piled up in front of them, on an event loop
that could not keep up, and waited seconds before a full queue refused them. Past the bound a
request is refused at once (over HTTP before its body is read), with the answer a full queue gives: 503
``overloaded`` with ``Retry-After`` (gRPC: ``UNAVAILABLE`` with ``retry-after`` trailing metadata;
``ATTNSERVE_MAX_REQUESTS_IN_FLIGHT``; measured by ``benchmarks/bench_overload.py``).
"""

from __future__ import annotations

from service.errors import Overloaded


class InFlight:
    """A count of the requests in flight against a bound. Only the event loop touches it: no lock."""

    def __init__(self, bound: int, retry_after_s: int) -> None:
        self.bound = bound
        self.count = 0
        self._retry_after = str(retry_after_s)

    def enter(self) -> InFlight:
        """Count one more request in flight, or raise 503 ``overloaded`` when ``bound`` already are."""
        if self.count >= self.bound:
            raise Overloaded(
                f"the service has {self.count} requests in flight (bound {self.bound}); retry later",
                headers={"Retry-After": self._retry_after},
            )
        self.count += 1
        return self

    def leave(self) -> None:
        self.count -= 1
