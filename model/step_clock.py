"""Where a training step's time goes: wall-clock seconds per named phase.

On a GPU, work is queued and the host runs ahead, so a phase's time is only its own when the device
is drained at its start and end: :class:`Clock` synchronises there, which the benchmark accepts and
training must not (``NO_CLOCK`` measures nothing and waits for nothing).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch


class Clock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[phase] += time.perf_counter() - start


def NO_CLOCK(phase: str) -> AbstractContextManager:  # named like the Clock instances it stands for
    return nullcontext()
