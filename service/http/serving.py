"""What every handler receives besides the request: the parts of the running service.

Created once by the app's lifespan and kept on ``app.state.serving``; the router passes it to each
handler, so a handler never reaches into globals or ``app.state``.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.attention.store import AttentionStore
from service.images import ImageDecoder
from service.lifecycle import Lifecycle
from service.metrics import Metrics
from service.registry import Registry
from service.settings import Settings


@dataclass(frozen=True)
class Serving:
    settings: Settings
    metrics: Metrics
    registry: Registry
    decoder: ImageDecoder
    attention: AttentionStore
    lifecycle: Lifecycle
