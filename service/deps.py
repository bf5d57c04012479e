"""What routes receive from the app: settings, registry, metrics, decoder (FastAPI dependencies).

Everything is created once by the app factory and its lifespan and kept on ``app.state``; the
aliases below are how routes ask for it, so a route never reaches into globals. The getters are
``async`` on purpose: FastAPI runs plain ``def`` dependencies in a thread pool, a thread hop per
dependency per request for what is an attribute read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from service.attention.store import AttentionStore
from service.images import ImageDecoder
from service.metrics import Metrics
from service.registry import Registry
from service.settings import Settings


@dataclass(frozen=True)
class Serving:
    """What ``POST /classify`` needs, as one dependency: each dependency costs FastAPI ~15 us a request."""

    settings: Settings
    registry: Registry
    decoder: ImageDecoder
    attention: AttentionStore


async def get_serving(request: Request) -> Serving:
    return request.app.state.serving


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_registry(request: Request) -> Registry:
    return request.app.state.registry


async def get_decoder(request: Request) -> ImageDecoder:
    return request.app.state.decoder


SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
DecoderDep = Annotated[ImageDecoder, Depends(get_decoder)]
ServingDep = Annotated[Serving, Depends(get_serving)]
