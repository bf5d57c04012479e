"""Faults injected on purpose (``ATTNSERVE_FAULTS``): how the fault suite (``tests/faults/``) and chaos
drills in staging prove that a failure inside the process is answered, counted and survived.

A plan is a ``;``-separated list of ``POINT:KIND[=ARG][@N][xCOUNT]``: at the N-th time (default 1) the
process passes POINT once the models are ready (warm-up runs are not counted), and COUNT times from
there (default 1; ``x0``: every time from then on), KIND happens there:

=====================  ==========================================================================
point                  where
=====================  ==========================================================================
``encoder``            an onnxruntime run of the translator's encoder graph (a lane's thread)
``decoder``            an onnxruntime run of the translator's decoder graph (a lane's thread)
``model``              an onnxruntime run of the classifier's graph (an instance thread)
``lane``               a translation lane's loop, on the event loop, between two hops
``batcher``            a classification instance thread, between two batches
``load``               a graph file about to be opened by onnxruntime (loading a model version)
=====================  ==========================================================================

Kinds: ``raise`` (a ``RuntimeError``), ``memory`` (onnxruntime's own failed-allocation error),
``stall=SECONDS`` (the run takes that much longer), ``vanish`` (``load`` only: the graph file is
deleted before onnxruntime opens it). ``decoder:raise@400`` is the 400th decoder run failing once;
``lane:raise@5x0`` a lane loop that raises from its 5th hop on.

With the setting unset (the default) no session is wrapped, and the two loop check points (``lane``,
``batcher``) cost a set lookup each.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

POINTS = ("encoder", "decoder", "model", "lane", "batcher", "load")
KINDS = ("raise", "memory", "stall", "vanish")
_RULE = re.compile(r"(?P<point>[a-z]+):(?P<kind>[a-z]+)(?:=(?P<arg>[0-9.]+))?(?:@(?P<at>\d+))?(?:x(?P<count>\d+))?")


class InjectedFault(RuntimeError):
    """What an injected ``raise`` throws: a failure the service did not expect."""


@dataclass
class Rule:
    point: str
    kind: str
    at: int = 1
    count: int = 1  # 0: from ``at`` on, every time
    seconds: float = 0.0
    seen: int = 0

    def due(self) -> bool:
        """Counts one pass; whether the fault happens on it."""
        self.seen += 1
        return self.seen >= self.at and (self.count == 0 or self.seen < self.at + self.count)


def parse(text: str) -> list[Rule]:
    """The plan's rules; ``ValueError`` names the rule it cannot read."""
    rules = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        m = _RULE.fullmatch(part)
        if m is None or m["point"] not in POINTS or m["kind"] not in KINDS:
            raise ValueError(
                f"cannot read fault {part!r}: expected POINT:KIND[=SECONDS][@N][xCOUNT] with POINT one of "
                f"{', '.join(POINTS)} and KIND one of {', '.join(KINDS)}"
            )
        if (m["kind"] == "stall") != (m["arg"] is not None):
            raise ValueError(f"cannot read fault {part!r}: stall takes =SECONDS, and only stall does")
        if (m["kind"] == "vanish") != (m["point"] == "load"):
            raise ValueError(f"cannot read fault {part!r}: vanish is the load point's only kind")
        at, count = int(m["at"] or 1), int(m["count"] or 1)
        rules.append(Rule(m["point"], m["kind"], max(at, 1), count, float(m["arg"] or 0.0)))
    return rules


class Faults:
    """The plan of one process. Rules count passes only once ``arm``ed (the first model is ready)."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self.points = frozenset(r.point for r in rules)
        self.armed = False
        self._lock = threading.Lock()  # points are passed on several threads

    def arm(self) -> None:
        self.armed = True

    def hit(self, point: str, path: Path | None = None) -> None:
        """Passing ``point``: the fault due there, if any, happens now (raises, sleeps or deletes)."""
        if point not in self.points or (not self.armed and point != "load"):
            return
        with self._lock:
            due = [r for r in self.rules if r.point == point and r.due()]
        for rule in due:
            if rule.kind == "stall":
                time.sleep(rule.seconds)
            elif rule.kind == "vanish" and path is not None:
                path.unlink(missing_ok=True)
            elif rule.kind == "memory":
                raise _allocation_failure(point)
            elif rule.kind == "raise":
                raise InjectedFault(f"fault injected at {point} (pass {rule.seen})")

    def wrap(self, session, point: str):
        """``session`` itself, or a stand-in whose runs pass ``point`` first when the plan names it."""
        return _FaultySession(session, self, point) if point in self.points else session


def _allocation_failure(point: str) -> Exception:
    """onnxruntime's error for an allocation that failed (its message), or MemoryError without onnxruntime."""
    message = f"[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory (fault injected at {point})"
    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException
    except ImportError:  # pragma: no cover - onnxruntime is always installed with the service
        return MemoryError(message)
    return RuntimeException(message)


class _FaultySession:
    """An onnxruntime session whose ``run`` passes a fault point first; everything else is the session's."""

    def __init__(self, session, faults: Faults, point: str) -> None:
        self._session, self._faults, self._point = session, faults, point

    def run(self, *args, **kwargs):
        self._faults.hit(self._point)
        return self._session.run(*args, **kwargs)

    def run_with_iobinding(self, *args, **kwargs):
        self._faults.hit(self._point)
        return self._session.run_with_iobinding(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._session, name)


NONE = Faults([])
