"""``python -m benchmarks.static_batching``: the service with static decode batching, ``bench_translate``'s baseline.

Static batching admits requests only into an empty batch and decodes that batch to its end: nothing
joins mid-way. It is what continuous batching is measured against, not something to serve with, so it
lives here as a subclass of the service's scheduler rather than as a setting. Settings as for
``python -m service`` (``ATTNSERVE_*``); one worker process (the substitution is made in this one).
"""

from __future__ import annotations

import sys

from contract.decoding import DecodeRequest
from service import registry
from service.__main__ import main as serve
from service.engine.lanes import Lane
from service.engine.scheduler import Scheduler


class StaticScheduler(Scheduler):
    def _room_for(self, lane: Lane, request: DecodeRequest) -> bool:
        return not lane.running and super()._room_for(lane, request)

    def _joinable(self, lane: Lane) -> bool:
        return False


def main() -> int:
    registry.Scheduler = StaticScheduler  # the registry builds each translator's scheduler by this name
    return serve()


if __name__ == "__main__":
    sys.exit(main())
