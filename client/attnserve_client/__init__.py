"""Python client for attnserve: image classification, English-German translation and their attention maps.

    from attnserve_client import Client

    with Client(base_url="http://127.0.0.1:8000") as client:
        print(client.translate("Open the file.").results[0].translation)

``AsyncClient`` has the same methods as coroutines. Every failure is an ``AttnserveError``
subclass (``errors``); every answer is a pydantic model (``types``). ``translate_po`` fills gettext
catalogs (``po``).
"""

from attnserve_client._async import AsyncClient
from attnserve_client._streaming import AsyncTranslationStream, TranslationStream
from attnserve_client._sync import Client
from attnserve_client._version import __version__
from attnserve_client.errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AttnserveError,
    AuthenticationError,
    BadRequestError,
    DeadlineExceededError,
    InternalServerError,
    InvalidFieldError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    QuotaExceededError,
    RequestTimeoutError,
    ServiceUnavailableError,
    UnsupportedMediaTypeError,
)
from attnserve_client.po import CatalogSummary, TranslatedCatalog
from attnserve_client.types import (
    Attention,
    AttentionMap,
    ClassifyResponse,
    DoneEvent,
    ModelInfo,
    Readiness,
    StreamEvent,
    TokenEvent,
    TranslateResponse,
)

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncClient",
    "AsyncTranslationStream",
    "Attention",
    "AttentionMap",
    "AttnserveError",
    "AuthenticationError",
    "BadRequestError",
    "CatalogSummary",
    "ClassifyResponse",
    "Client",
    "DeadlineExceededError",
    "DoneEvent",
    "InternalServerError",
    "InvalidFieldError",
    "ModelInfo",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "QuotaExceededError",
    "Readiness",
    "RequestTimeoutError",
    "ServiceUnavailableError",
    "StreamEvent",
    "TokenEvent",
    "TranslateResponse",
    "TranslatedCatalog",
    "TranslationStream",
    "UnsupportedMediaTypeError",
    "__version__",
]
